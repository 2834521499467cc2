"""Test-only server helpers: `EchoUpstream` (bench/echo_upstream.py in a subprocess, a remote
upstream's stand-in), `Relay` (a TCP relay a test cuts and restores: a database that goes away
and comes back) and `wait_for` (poll until truthy, fail the test with the server's log).
The servers themselves are shipped: `reef.testing.process` (`ReefServer`, a `reef serve`
subprocess) and `cli.testing` (`InProcessReef`)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
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


class Relay:
    """A TCP relay to `target` on a loopback port: `cut()` closes every connection and the
    port (a database that goes away under a running server: connects are refused), `restore()`
    listens on the same port again."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.open: list[socket.socket] = []
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            self.open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with contextlib.suppress(OSError):  # wakes the accept (a close alone does not)
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for s in self.open:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        self.open = []

    def restore(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()


def wait_for(what: str, fn: Callable[[], Any], server: Any, timeout: float = 300) -> Any:
    """Poll `fn` until it returns something truthy; fail naming `what`, with the server's log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.5)
    pytest.fail(f"{what} within {timeout}s; server log:\n{server.log()[-6000:]}")
