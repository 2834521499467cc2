"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from api.services import services

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness: the process answers")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="Readiness: store and engine ready (no side effects)")
async def readyz(request: Request) -> Response:
    svc = services(request)
    store_ok, engine_ok = await asyncio.gather(
        asyncio.to_thread(svc.store.ping), svc.engine.ready()
    )
    ready = store_ok and engine_ok
    body = {
        "status": "ready" if ready else "not_ready",
        "store": "ok" if store_ok else "unavailable",
        "engine": "ok" if engine_ok else "unavailable",
    }
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/metrics", summary="Prometheus metrics")
async def metrics(request: Request) -> Response:
    return Response(services(request).metrics.render(), media_type="text/plain; version=0.0.4")
