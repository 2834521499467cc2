"""`InProcessReef`: the app `reef serve` builds, served by uvicorn in a thread of the calling
process, for tests and benchmarks that only need a server (no process boundary)."""

from __future__ import annotations

import logging
import socket
import threading
from pathlib import Path
from typing import Any

from reef.settings.scenarios import merged
from reef.testing.process import Served, wait_ready


class _Records(logging.Handler):
    """The log records emitted while a server runs (by any thread of the process)."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record))
        except Exception:
            self.handleError(record)


class InProcessReef(Served):
    """What `reef serve` runs — settings from `config` and nested `overrides` (the command-line
    flags' shape: `engine={"kind": "upstream", ...}`), the engine `cli.serve.build_engine`
    constructs, `api.app.create_app` — served by uvicorn in a background thread on a loopback
    socket bound here, so clients (the openai and anthropic SDKs, httpx, a flow's EngineAdmin)
    talk to it over real HTTP. The tiny model by default; never an evolve worker.

    Same face as `ReefServer`: `url`, `base_url`, `port`, `state_dir`, `log()` (the records
    logged while it ran, at the levels the test process lets through), `stop()`, a context
    manager. Its lifespan runs `gc.freeze()` as in production: harmless in a test process,
    which freezes what it imported anyway."""

    def __init__(
        self, state_dir: Path, *, config: Path | str | None = None, **overrides: dict[str, Any]
    ):
        self.state_dir = Path(state_dir).resolve()
        self.config = config
        # Bound before the settings are built: the settings name the port (a flow's deploy
        # comes back to `settings.engine_url`), and nothing can take it in between.
        # IPPROTO_TCP named explicitly: asyncio sets TCP_NODELAY only on sockets whose proto
        # says TCP, and without it every small answer waits ~40 ms for a delayed ACK.
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.bind(("127.0.0.1", 0))
        self.port = int(self._sock.getsockname()[1])
        self.overrides = merged(
            {
                "server": {"state_dir": str(self.state_dir), "port": self.port},
                "engine": {"model": "tiny"},
                "reef": {"auto": False},
            },
            overrides,
        )
        self.settings: Any = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._records = _Records()

    def start(self, timeout_s: float = 120.0) -> InProcessReef:
        import uvicorn

        from reef.api.app import create_app
        from reef.cli.serve import build_engine
        from reef.settings import load_settings

        self.settings = load_settings(self.config, **self.overrides)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        logging.getLogger().addHandler(self._records)
        app = create_app(self.settings, build_engine(self.settings))
        config = uvicorn.Config(
            app,
            loop="asyncio",
            http="httptools",
            lifespan="on",
            log_config=None,  # the test process's logging stays as pytest set it up
            access_log=False,
            timeout_graceful_shutdown=10,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self._sock]},
            name=f"reef-{self.port}",
            daemon=True,
        )
        self._thread.start()
        try:
            wait_ready(f"{self.url}/readyz", timeout_s, self._gone)
        except TimeoutError as e:
            self.stop()
            raise RuntimeError(f"reef app: {e}:\n{self.log()[-4000:]}") from None
        except RuntimeError:
            self._release()
            raise
        return self

    def _gone(self) -> str | None:
        if self._thread is None or self._thread.is_alive():
            return None
        return f"reef app did not start:\n{self.log()[-4000:]}"

    def log(self) -> str:
        return "\n".join(self._records.lines)

    def stop(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._server.should_exit = True
            self._thread.join(timeout=30)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(timeout=10)
        self._release()

    def _release(self) -> None:
        logging.getLogger().removeHandler(self._records)
        self._sock.close()

    def __enter__(self) -> InProcessReef:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
