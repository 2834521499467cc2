"""Flow fixtures: one Prefect server for the whole session, its home and database in a
temporary directory. It is the server Prefect's test harness starts (uvicorn on Prefect's app
factory, in a subprocess), launched as soon as the collected tests show that one of them
needs it, so it boots while the tests before the first flow run; this process reaches it by
PREFECT_API_URL, as any client of a Prefect server does."""

from __future__ import annotations

import inspect
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from reef.testing.process import free_port, wait_ready

# the real S3 server (moto_server) and a fresh bucket, shared with the experience tests
from tests.experience.conftest import s3_bucket, s3_endpoint

__all__ = ["s3_bucket", "s3_endpoint"]


class _PrefectServer:
    def __init__(self) -> None:
        self.home = Path(tempfile.mkdtemp(prefix="reef-prefect-"))
        self.url = f"http://127.0.0.1:{free_port()}/api"
        self.env = pytest.MonkeyPatch()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.home / "server.log"

    def start(self) -> None:
        # This process (and the flow runs in it) talks to the server; nothing of ~/.prefect.
        self.env.setenv("PREFECT_HOME", str(self.home / "home"))
        self.env.setenv("PREFECT_API_URL", self.url)
        self.env.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        self.env.setenv("PREFECT_LOGGING_TO_API_ENABLED", "false")
        if "prefect" in sys.modules:  # it read its settings at import: have it read them again
            from prefect.context import refresh_global_settings_context

            refresh_global_settings_context()
        server_env = {
            **os.environ,
            # as prefect.testing.utilities.prefect_test_harness runs it
            "PREFECT_SERVER_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{self.home / 'prefect.db'}",
            "PREFECT_UI_ENABLED": "0",
            "PREFECT__SERVER_EPHEMERAL": "1",
            "PREFECT__SERVER_FINAL": "1",
        }
        server_env.pop("PREFECT_API_URL")
        port = self.url.removesuffix("/api").rsplit(":", 1)[1]
        args = ["--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1"]
        args += ["--port", port, "--log-level", "error", "--lifespan", "on"]
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", *args],
                env=server_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait(self, timeout_s: float = 180.0) -> None:
        proc = self.proc
        assert proc is not None

        def gone() -> str | None:
            if proc.poll() is None:
                return None
            return f"the Prefect server exited:\n{self.log.read_text()[-4000:]}"

        try:
            wait_ready(f"{self.url}/health", timeout_s, gone)
        except TimeoutError as e:
            raise RuntimeError(f"the Prefect server: {e}") from None

    def stop(self) -> None:
        if "prefect" in sys.modules and self.proc is not None and self.proc.poll() is None:
            # What the flow runs of this process still have to send (as the harness does).
            from prefect.events.worker import EventsWorker
            from prefect.logging.handlers import APILogWorker
            from prefect.utilities.asyncutils import run_coro_as_sync

            async def drain() -> None:
                try:
                    result = APILogWorker.instance().drain()
                    if inspect.isawaitable(result):
                        await result
                except RuntimeError:  # never started
                    pass
                result = EventsWorker.drain_all()
                if inspect.isawaitable(result):
                    await result

            run_coro_as_sync(drain())
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.env.undo()
        if "prefect" in sys.modules:
            from prefect.context import refresh_global_settings_context

            refresh_global_settings_context()
        shutil.rmtree(self.home, ignore_errors=True)


_server: _PrefectServer | None = None


def _start() -> _PrefectServer:
    global _server
    if _server is None:
        _server = _PrefectServer()
        _server.start()
    return _server


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    if any("prefect_server" in getattr(item, "fixturenames", ()) for item in session.items):
        _start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    global _server
    if _server is not None:
        _server.stop()
        _server = None


@pytest.fixture(scope="session")
def prefect_server() -> None:
    """The session's Prefect server is up; flows called in tests run against it."""
    _start().wait()
