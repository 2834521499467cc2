"""`reef serve` as a subprocess for the demo and the evolve benchmark: config file, free port,
its own state directory, the evolve worker on, the log in a file that can be followed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

REEF = str(Path(sys.executable).with_name("reef"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One `reef serve --model MODEL -c <state>/serve.yaml` with the automatic evolve worker."""

    def __init__(
        self,
        state_dir: Path,
        model: str,
        config: dict[str, Any],
        env: dict[str, str] | None = None,
    ):
        self.state_dir = state_dir.resolve()
        self.env = env or {}
        self.model = model
        self.port = free_port()
        self.config_path = self.state_dir / "serve.yaml"
        self.config = config
        self.log_path = self.state_dir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def tracking_uri(self) -> str:
        return f"sqlite:///{self.state_dir / 'mlflow.db'}"

    def start(self, timeout_s: float = 300.0) -> Server:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        cmd = [
            REEF, "serve", "-c", str(self.config_path), "--model", self.model,
            "--port", str(self.port), "--state-dir", str(self.state_dir),
        ]  # fmt: skip
        env = {
            **os.environ,
            "REEF_REEF__AUTO": "true",
            "PYTHONUNBUFFERED": "1",
            # The worker's temporary Prefect server: its telemetry heartbeat only adds writes
            # (and "database is locked" tracebacks) to a SQLite file the flow runs also use.
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            **self.env,
        }
        log = self.log_path.open("ab")
        # Own process group: stopping the demo stops the server and its evolve worker.
        self.proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"reef serve exited with {self.proc.returncode}:\n{self.log()[-4000:]}"
                )
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"reef serve not ready after {timeout_s:.0f}s:\n{self.log()[-4000:]}")

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

    def stop(self, timeout_s: float = 30.0) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
