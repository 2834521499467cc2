"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from reef.api.contract import METRICS, PUBLIC
from reef.api.services import services
from reef.errors import Unauthorized
from reef.wire import Liveness, Readiness

router = APIRouter(tags=["health"])


@router.get(
    "/healthz",
    response_model=Liveness,
    openapi_extra=PUBLIC,
    summary="Liveness: the process answers",
)
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    response_model=Readiness,
    openapi_extra=PUBLIC,
    responses={503: {"model": Readiness, "description": "not ready: what is not"}},
    summary="Readiness: each dependency's state; 503 when the store or the engine is down "
    "(needed to serve), 200 'degraded' when the engine is busy (its line of waiting calls full "
    "or nearly) or the artifact store, MLflow or the evolve worker is down (needed to learn); "
    "no side effects",
)
async def readyz(request: Request) -> Response:
    status, body = await services(request).dependencies.report()
    return JSONResponse(body, status_code=status)


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    openapi_extra=METRICS,
    responses={
        200: {
            "description": "Prometheus text exposition format (version 0.0.4)",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    },
    summary="Prometheus metrics (`Authorization: Bearer <server.metrics_token>` when one is set)",
)
async def metrics(request: Request) -> Response:
    svc = services(request)
    token = svc.settings.server.metrics_token
    if token is not None:
        header = request.headers.get("authorization") or ""
        given = header[7:].strip() if header[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(given.encode(), token.get_secret_value().encode()):
            raise Unauthorized(
                "/metrics needs 'Authorization: Bearer <token>' with server.metrics_token"
            )
    return Response(svc.metrics.render(), media_type="text/plain; version=0.0.4")
