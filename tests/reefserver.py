"""Test-only server helpers: `EchoUpstream` (bench/echo_upstream.py in a subprocess, a remote
upstream's stand-in) and `wait_for` (poll until truthy, fail the test with the server's log).
The servers themselves are shipped: `reef.testing.process` (`ReefServer`, a `reef serve`
subprocess) and `cli.testing` (`InProcessReef`)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

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


def wait_for(what: str, fn: Callable[[], Any], server: Any, timeout: float = 300) -> Any:
    """Poll `fn` until it returns something truthy; fail naming `what`, with the server's log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.5)
    pytest.fail(f"{what} within {timeout}s; server log:\n{server.log()[-6000:]}")
