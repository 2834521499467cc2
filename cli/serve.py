"""`reef serve`: build the configured engine, wire the app around it, and serve it; and the
OpenAPI spec of that app."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from reef.engines.base import Engine
from reef.settings import Settings, load_settings

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
    import uvicorn

    from api.app import create_app

    settings = load_settings(args.config, **overrides)
    logging.basicConfig(
        level=settings.server.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    settings.server.state_dir.mkdir(parents=True, exist_ok=True)
    engine = build_engine(settings)
    # The admin token deploys bring: a fleet's engines (engine.fleet.admin_urls) share the
    # configured reef.engine_token, which this server accepts on its admin routes and its worker
    # sends.
    configured = settings.reef.engine_token
    engine_token = configured.get_secret_value() if configured is not None else None
    evolver = None
    if settings.reef.auto:  # the worker evolves scenarios and runs users' jobs (/reef/train)
        from api.auth import new_token
        from api.evolver import Evolver

        # Without one configured, the worker's deploys come back to this server's admin routes
        # with a token that lives as long as the process, handed over in the worker's
        # environment only.
        if engine_token is None and settings.auth.tokens:
            engine_token = new_token()
        evolver = Evolver(args.config, overrides, engine_token, settings.server.state_dir)
    app = create_app(settings, engine, evolver=evolver, engine_token=engine_token)
    url = f"http://{settings.server.host}:{settings.server.port}"
    print(
        f"reef: serving {engine.kind} engine on {url}/v1 (state in {settings.server.state_dir})",
        flush=True,
    )
    uvicorn.run(
        app,
        host=settings.server.host,
        port=settings.server.port,
        log_level=settings.server.log_level,
        access_log=args.access_log,
        loop="uvloop",
        http="httptools",
        timeout_graceful_shutdown=30,
    )
    return 0


def openapi(args: argparse.Namespace) -> int:
    import tempfile

    from api.app import create_app
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
