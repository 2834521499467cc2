"""A SIGKILLed evolve worker takes its Prefect temporary server with it. Without a Prefect
server configured, Prefect starts one for the worker as a child process (uvicorn serving
prefect.server.api.server); it stopped it only at a clean exit, so every killed worker (the
OOM killer, the worker fault rows) left one serving, orphaned, for good, and `reef serve`
started the next worker with another. Now the server is tied to the worker by the kernel
(flows.worker.tie_temporary_server: PR_SET_PDEATHSIG). Real processes: `reef serve` over the
echo upstream, its worker, and the worker's server."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import psutil
import pytest

from reef.testing.process import ReefServer
from tests.faults.invariants import measured
from tests.reefserver import EchoUpstream, wait_for


def _children(parent: psutil.Process, *words: str) -> list[psutil.Process]:
    found = []
    for child in parent.children(recursive=True):
        try:
            cmdline = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if all(w in cmdline for w in words):
            found.append(child)
    return found


def _gone(proc: psutil.Process) -> bool:
    """Exited (a zombie not reaped yet counts: it runs nothing and holds no port)."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _worker_and_server(srv: ReefServer) -> tuple[psutil.Process, psutil.Process]:
    assert srv.proc is not None
    (worker,) = _children(psutil.Process(srv.proc.pid), "-m", "reef.cli.worker")
    (server,) = _children(worker, "uvicorn", "prefect.server.api.server:create_app")
    assert server.ppid() == worker.pid
    return worker, server


def _ready(srv: ReefServer, starts: int) -> None:
    ready = lambda: srv.log().count("evolve worker ready") >= starts  # noqa: E731
    wait_for(f"the worker's start {starts}", ready, srv, 300)


@pytest.mark.faults
@pytest.mark.timeout(600)
def test_a_killed_worker_takes_its_prefect_server_with_it(tmp_path: Path) -> None:
    env = {"REEF_REEF__AUTO": "true"}
    with (
        EchoUpstream() as echo,
        ReefServer(
            tmp_path / "state", "--engine", "upstream", "--upstream-url", echo.base_url, env=env
        ) as srv,
    ):
        _ready(srv, 1)
        worker, server = _worker_and_server(srv)
        port = server.cmdline()[server.cmdline().index("--port") + 1]
        # the tied server is Prefect's: it serves its API (the warm-up flow ran on it)
        assert httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=10).status_code == 200

        os.kill(worker.pid, signal.SIGKILL)
        killed = time.monotonic()
        while not _gone(server) and time.monotonic() - killed < 10:
            time.sleep(0.05)
        if not _gone(server):
            server.kill()  # not left behind by a failing run of the test either
            raise AssertionError(f"the killed worker's Prefect server {server.pid} lived on")
        died_after_s = time.monotonic() - killed

        # `reef serve` starts a worker again; it has a server of its own, and a clean stop
        # (SIGTERM to `reef serve`: the worker's stdin ends) still stops both
        _ready(srv, 2)
        worker, server = _worker_and_server(srv)
        srv.stop()
        deadline = time.monotonic() + 30
        while not (_gone(worker) and _gone(server)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(worker) and _gone(server)
    measured("worker killed: its Prefect server", {"died_after_s": round(died_after_s, 3)})
