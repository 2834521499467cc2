"""`reef serve`: build the configured engine, wire the app around it, and serve it; and the
OpenAPI spec of that app."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn

from reef import logs
from reef.cli.extras import missing_train_modules
from reef.engines.base import Engine
from reef.errors import ReefError
from reef.settings import Settings, load_settings

if TYPE_CHECKING:
    from reef.api.services import Services

log = logging.getLogger("reef")


def build_engine(settings: Settings) -> Engine:
    """Construct (not start) the configured engine. Heavy imports (torch) happen only here,
    so importing the API never loads them."""
    cfg = settings.engine
    if cfg.kind == "upstream":
        from reef.engines.upstream import UpstreamEngine

        return UpstreamEngine.from_settings(cfg, default_max_tokens=settings.default_max_tokens)
    if cfg.kind == "vllm":
        from reef.engines.vllm import VllmEngine

        return VllmEngine.from_config(
            cfg, settings.server.state_dir, default_max_tokens=settings.default_max_tokens
        )
    from reef.engines.embedded import EmbeddedEngine
    from reef.models import model_id, resolve_model

    return EmbeddedEngine(
        resolve_model(cfg.model, cfg.model_cache),
        model_id(cfg.model),
        cfg.embedded,
        default_max_tokens=settings.default_max_tokens,
        sampling_defaults=cfg.sampling_defaults,
    )


def serve(args: argparse.Namespace, overrides: dict[str, Any]) -> int:
    """Serve until stopped. A start that fails (the database, the engine, the port) is one
    line on stderr and exit status 1, never a traceback; "serving on" is printed only once the
    store, the engine and the socket are ready."""
    logs.quiet_progress_bars()  # before transformers and the worker read the variables
    from reef.api.app import create_app

    settings = load_settings(args.config, **overrides)
    logs.configure(settings.server.log_level, settings.server.log_format)
    settings.server.state_dir.mkdir(parents=True, exist_ok=True)
    sock = _listen(settings.server.host, settings.server.port)  # in use: fail before loading
    engine = build_engine(settings)
    engine_token, evolver = _evolver(args, overrides, settings)
    app = create_app(settings, engine, evolver=evolver, engine_token=engine_token)
    config = uvicorn.Config(
        app,
        log_level=settings.server.log_level,
        log_config=None,  # Reef's logging (reef.logs) formats uvicorn's lines too
        access_log=args.access_log,
        loop="uvloop",
        http="httptools",
        lifespan="off",  # _run starts and stops the services, to report a failed start itself
        timeout_graceful_shutdown=30,
    )
    url = f"http://{settings.server.host}:{settings.server.port}"
    announce = (
        f"reef: serving {engine.kind} engine on {url}/v1 (state in {settings.server.state_dir})"
    )
    server = _Server(config, announce, app.state.services)
    try:
        with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
            return runner.run(_run(server, sock))
    except KeyboardInterrupt:
        print("reef: interrupted", file=sys.stderr)
        return 130


def _evolver(
    args: argparse.Namespace, overrides: dict[str, Any], settings: Settings
) -> tuple[str | None, Any]:
    """The admin token deploys bring, and the evolve worker when reef.auto asks for one."""
    # A fleet's engines (engine.fleet.admin_urls) share the configured reef.engine_token, which
    # this server accepts on its admin routes and its worker sends.
    configured = settings.reef.engine_token
    engine_token = configured.get_secret_value() if configured is not None else None
    if not settings.reef.auto:  # else the worker evolves scenarios and runs users' jobs
        return engine_token, None
    missing = missing_train_modules()
    if missing:  # the serve extra alone: serve and record, and say once why nothing learns
        log.warning(
            "learning is off: the evolve worker needs the train extra (no module %s here): "
            "pip install 'reef-agents[train]'; serving and recording go on",
            ", ".join(missing),
        )
        return engine_token, None
    from reef.api.auth import new_token
    from reef.api.evolver import Evolver

    # Without one configured, the worker's deploys come back to this server's admin routes
    # with a token that lives as long as the process, handed over in the worker's
    # environment only.
    if engine_token is None and settings.auth.tokens:
        engine_token = new_token()
    return engine_token, Evolver(args.config, overrides, engine_token, settings.server.state_dir)


def _listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound now (listening once the services are up)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ReefError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server, saying `announce` once it listens, stopping the services once it has
    shut down (before uvicorn re-raises the signal that stopped it)."""

    def __init__(self, config: uvicorn.Config, announce: str, svc: Services):
        super().__init__(config)
        self.announce = announce
        self.svc = svc
        self.stopped = False

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            print(self.announce, flush=True)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().shutdown(sockets)
        finally:
            await self.stop_services()

    async def stop_services(self) -> None:
        if not self.stopped:
            self.stopped = True
            await self.svc.stop()


async def _run(server: _Server, sock: socket.socket) -> int:
    try:
        await server.svc.start()
    except Exception as e:
        log.debug("start failed", exc_info=True)
        try:  # what did start (a launched vLLM, the worker, the store's pool) goes away
            await server.stop_services()
        except Exception:
            log.debug("stopping after a failed start", exc_info=True)
        sock.close()
        print(f"reef: cannot start: {_one_line(e)}", file=sys.stderr, flush=True)  # the last word
        return 1
    try:
        await server.serve(sockets=[sock])
    finally:  # a serve that ended without its shutdown (uvicorn's own start failed)
        await server.stop_services()
    return 0


def _one_line(e: BaseException) -> str:
    text = e.message if isinstance(e, ReefError) else f"{type(e).__name__}: {e}"
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


def openapi(args: argparse.Namespace) -> int:
    import tempfile

    from reef.api.app import create_app
    from reef.engines.upstream import UpstreamEngine

    # The spec needs an app, not a running one: nothing here is started or connected.
    with tempfile.TemporaryDirectory() as state_dir:
        settings = load_settings(None, server={"state_dir": state_dir})
        app = create_app(settings, UpstreamEngine("http://127.0.0.1:9/v1", model="reef"))
        text = json.dumps(app.openapi(), indent=2)
    if args.output:
        Path(args.output).write_text(text + "\n")
    else:
        print(text)
    return 0
