"""`reef serve` as a subprocess, for the demo, the benchmarks and the tests that need the process
boundary (SIGKILL, command-line flags, the evolve worker, an external client installing against
it): a free loopback port, its own state directory and process group, the log in a file that
can be followed."""

from __future__ import annotations

import os
import platform
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

REEF = str(Path(sys.executable).with_name("reef"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), for benchmark results; else what platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def wait_ready(url: str, timeout_s: float, gone: Callable[[], str | None]) -> None:
    """Poll `url` (a health route) until it answers 200. `gone()` says why the server is no
    more (None while it runs); that, or `timeout_s` passing, raises."""
    deadline = time.monotonic() + timeout_s
    # One client for every poll: each bare httpx.get builds a TLS context and loads the CA
    # bundle (~60 ms of CPU on these machines), though loopback health routes are plain HTTP.
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if (why := gone()) is not None:
                raise RuntimeError(why)
            try:
                if client.get(url).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer 200 within {timeout_s:.0f}s")


class Served:
    """Where a Reef server answers on loopback (`base_url` is what the openai SDK takes) and
    where its state lies."""

    port: int
    state_dir: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def tracking_uri(self) -> str:
        return f"sqlite:///{self.state_dir / 'mlflow.db'}"


class ReefProcess(Served):
    """`reef serve ARGS --port P --state-dir S` in its own process group. The evolve worker runs when the settings say so (`REEF_REEF__AUTO` in `env`, or the config).
    `env` adds to this process's environment; a None value removes the variable."""

    def __init__(
        self,
        state_dir: Path,
        *args: str,
        port: int | None = None,
        env: dict[str, str | None] | None = None,
        log_name: str | None = None,
        executable: str = REEF,
    ):
        self.executable = executable  # the `reef` command (another environment's, for one)
        self.state_dir = state_dir.resolve()
        self.port = port or free_port()
        self.args = ["serve", "--port", str(self.port), "--state-dir", str(self.state_dir), *args]
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.state_dir / (log_name or f"server-{self.port}.log")
        self._log_offset = 0

    def start(self, timeout_s: float = 300.0) -> ReefProcess:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        merged: dict[str, str | None] = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            # The worker's temporary Prefect server: its telemetry heartbeat only adds writes
            # (and "database is locked" tracebacks) to a SQLite file the flow runs also use.
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            **self.env,
        }
        env = {k: v for k, v in merged.items() if v is not None}
        log = self.log_path.open("ab")
        # Own process group: stopping the server stops its evolve worker too.
        self.proc = subprocess.Popen(
            [self.executable, *self.args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            wait_ready(f"{self.url}/readyz", timeout_s, self._gone)
        except TimeoutError as e:
            self.stop()
            raise RuntimeError(f"reef serve: {e}:\n{self.log()[-4000:]}") from None
        return self

    def _gone(self) -> str | None:
        if self.proc is None or self.proc.poll() is None:
            return None
        return f"reef serve exited with {self.proc.returncode}:\n{self.log()[-4000:]}"

    def wait_for_log(self, text: str, timeout_s: float = 300.0) -> float:
        """Seconds until `text` appears in the server's log (the worker logs there too)."""
        started = time.monotonic()
        while text not in self.log():
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"reef serve exited:\n{self.log()[-4000:]}")
            if time.monotonic() - started > timeout_s:
                raise RuntimeError(f"no {text!r} in the log after {timeout_s:.0f}s")
            time.sleep(0.25)
        return time.monotonic() - started

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def new_log_lines(self) -> list[str]:
        """Log lines written since the last call."""
        if not self.log_path.exists():
            return []
        with self.log_path.open("rb") as f:
            f.seek(self._log_offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a half-written line waits for the next call
        self._log_offset += end
        return data[:end].decode(errors="replace").splitlines()

    def kill(self) -> None:
        """SIGKILL to the whole group: no shutdown hooks run, as in a crash."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def stop(self, timeout_s: float = 30.0) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def __enter__(self) -> ReefProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ReefServer(ReefProcess):
    """`reef serve` with the given flags, in its own process; no evolve worker unless `env`
    asks for one (REEF_REEF__AUTO=true): each worker is a Python process with Prefect and torch
    loaded. PREFECT_API_URL is unset for it: a Prefect server the calling process uses is not
    the server's, and its worker runs flows itself, as where no Prefect server is configured."""

    def __init__(
        self,
        state_dir: Path,
        *args: str,
        port: int | None = None,
        env: dict[str, str | None] | None = None,
        executable: str = REEF,
    ):
        env = {"REEF_REEF__AUTO": "false", "PREFECT_API_URL": None, **(env or {})}
        super().__init__(state_dir, *args, port=port, env=env, executable=executable)

    def start(self, timeout_s: float = 120.0) -> ReefServer:
        super().start(timeout_s)
        return self
