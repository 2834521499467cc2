"""The FastAPI app factory: the services, the middleware and the routes; no import-time state."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.routing import Match, Route
from starlette.types import Scope

import reef
from reef.api import contract, errors, ui
from reef.api.evolver import Evolver
from reef.api.guard import BrowserGuard, allowed_hosts
from reef.api.metrics import MetricsMiddleware
from reef.api.routes import (
    anthropic,
    engine_admin,
    experience,
    harness,
    health,
    openai,
    releases,
    responses,
    scenario_settings,
)
from reef.api.routes import reef as reef_routes
from reef.api.routes import rollouts as rollout_routes
from reef.api.services import Services
from reef.engines.base import Engine
from reef.settings import Settings
from reef.store.base import Store

log = logging.getLogger("reef.api")


class _PlainRoute(Route):
    """A Starlette route that names itself in the scope (as FastAPI's do), so the metrics
    middleware labels its requests by route template."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child_scope = super().matches(scope)
        if match is not Match.NONE:
            child_scope["route"] = self
        return match, child_scope


def create_app(
    settings: Settings,
    engine: Engine,
    store: Store | None = None,
    evolver: Evolver | None = None,
    engine_token: str | None = None,
) -> FastAPI:
    """Build the app. The engine is constructed (not started) by the caller; Services builds
    every other part, and the lifespan starts them (the store's schema, the group committer,
    the engine, the evolve worker, the background tasks) and stops them, in order."""
    svc = Services.build(settings, engine, store, evolver, engine_token)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await svc.start()
        try:
            yield
        finally:
            await svc.stop()

    app = FastAPI(
        title="Reef",
        version=reef.__version__,
        description=(
            "OpenAI- and Anthropic-compatible serving that records every exchange and returns "
            "a receipt (`x-reef-agent-record-id`), plus feedback reports against receipts."
        ),
        lifespan=lifespan,
        # /docs and /redoc are api.ui.docs: FastAPI's own load their scripts from CDNs.
        docs_url=None,
        redoc_url=None,
        # Our metrics are Prometheus (/metrics). FastAPI's OpenTelemetry hooks would otherwise
        # look up the global providers on every request (measured: 1.5-5% of the hot path).
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.services = svc
    errors.install(app)
    # inside the metrics middleware: refused requests are counted too
    app.add_middleware(BrowserGuard, allowed=allowed_hosts(settings.server), metrics=svc.metrics)
    app.add_middleware(MetricsMiddleware, metrics=svc.metrics)
    _routes(app)
    app.openapi = functools.partial(_openapi, app)  # type: ignore[method-assign]
    return app


def _routes(app: FastAPI) -> None:
    for module in (openai, anthropic, responses, reef_routes, releases, rollout_routes):
        app.include_router(module.router)
    for module in (engine_admin, experience, harness, health, scenario_settings):
        app.include_router(module.router)
    ui.install(app)  # the dashboard at /ui
    # The inference routes also go in front as plain Starlette routes: the same endpoint
    # functions (they take the Request and return a Response) without FastAPI's per-request
    # dependency machinery. Measured with bench/upstream_overhead.py: ~100 us per call, a
    # tenth of the added-latency budget. FastAPI's routes for them stay behind, for the spec.
    for path, endpoint in (
        ("/v1/chat/completions", openai.chat_completions),
        ("/v1/messages", anthropic.messages),
        ("/v1/responses", responses.create_response),
    ):
        app.router.routes.insert(0, _PlainRoute(path, endpoint, methods=["POST"]))


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's spec, finished by api.contract (the bodies and headers the routes read
    themselves, auth, every error answer)."""
    if app.openapi_schema is None:
        spec = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        app.openapi_schema = contract.finish(spec, app.routes)
    return app.openapi_schema
