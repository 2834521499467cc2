"""Start a real `reef serve` subprocess on a free loopback port for tests and benchmarks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REEF = str(Path(sys.executable).with_name("reef"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ReefServer:
    """`reef serve` with the given flags; `base_url` is what the openai SDK takes."""

    def __init__(
        self,
        state_dir: Path,
        *args: str,
        port: int | None = None,
        env: dict[str, str] | None = None,
    ):
        self.state_dir = state_dir
        self.port = port or free_port()
        self.args = ["serve", "--port", str(self.port), "--state-dir", str(state_dir), *args]
        # No evolve worker unless a test asks for one (REEF_REEF__AUTO=true): most tests
        # serve only, and each worker is a Python process with Prefect and torch loaded.
        self.env = {**os.environ, "REEF_REEF__AUTO": "false", **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = state_dir / f"server-{self.port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def start(self, timeout: float = 120.0) -> ReefServer:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [REEF, *self.args], stdout=log, stderr=subprocess.STDOUT, env=self.env
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"reef serve exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"reef serve not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks run, as in a crash."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> ReefServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


ECHO_UPSTREAM = Path(__file__).resolve().parents[1] / "bench" / "echo_upstream.py"


class EchoUpstream:
    """bench/echo_upstream.py in a subprocess: a real OpenAI-compatible HTTP server standing
    in for a remote upstream (vLLM, a hosted API); `base_url` ends in /v1."""

    def __init__(self, *args: str):
        self.args = args
        self.proc: subprocess.Popen[str] | None = None
        self.base_url = ""

    def __enter__(self) -> EchoUpstream:
        self.proc = subprocess.Popen(
            [sys.executable, str(ECHO_UPSTREAM), "--port", "0", *self.args],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # "listening on http://127.0.0.1:PORT"
        if not line.startswith("listening on "):
            self.__exit__()
            raise RuntimeError(f"echo upstream did not start: {line!r}")
        self.base_url = line.split()[-1] + "/v1"
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
