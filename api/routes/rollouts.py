"""Rollout routes: a scenario's live canary, and an admin's promote or abort that ends it early.

Both go through the one release path (deploy.rollout → deploy.chain.ReleaseChain): a promote
publishes the canary by compare-and-swap on the head it was made on; an abort retires it and
records a rollback release with the reason and the numbers at that moment.
"""

from __future__ import annotations

import asyncio
import functools

from fastapi import APIRouter, Request

from api.answers import release_out
from api.bodies import read_json, validate
from api.services import caller
from deploy import rollout
from reef.rollouts import Rollouts
from reef.wire import ReleaseOut, RolloutAbort, RolloutOut

router = APIRouter(prefix="/reef/scenarios", tags=["rollouts"])


@router.get(
    "/{scenario}/rollout",
    response_model=RolloutOut,
    summary="The live canary and the sequential test's verdict now (404: none is live)",
)
async def rollout_status(request: Request, scenario: str) -> RolloutOut:
    svc, _, name = caller(request, scenario)
    rollouts = svc.serving.rollouts
    canary = await asyncio.to_thread(svc.chain.canary, name)
    health = rollouts.health(canary.id) if rollouts is not None else None
    now = await asyncio.to_thread(rollout.status, svc.chain, name, health)
    return RolloutOut.model_validate(now)


@router.post(
    "/{scenario}/rollout/promote",
    response_model=ReleaseOut,
    status_code=201,
    summary="End the rollout now: the canary becomes the head (admin)",
    responses={409: {"description": "the head moved under the canary; nothing published"}},
)
async def rollout_promote(request: Request, scenario: str) -> ReleaseOut:
    svc, principal, name = caller(request, scenario)
    principal.require_admin("promote a canary")
    release = await asyncio.to_thread(
        functools.partial(rollout.promote, by=principal.name), svc.chain, name
    )
    _forget(svc.serving.rollouts, name)
    return release_out(release, release.id, admin=True)


@router.post(
    "/{scenario}/rollout/abort",
    response_model=ReleaseOut,
    status_code=201,
    summary="End the rollout now: retire the canary, record a rollback release (admin)",
)
async def rollout_abort(request: Request, scenario: str) -> ReleaseOut:
    svc, principal, name = caller(request, scenario)
    principal.require_admin("abort a canary")
    body = RolloutAbort()
    if request.headers.get("content-length", "0") != "0" or "transfer-encoding" in request.headers:
        body = validate(RolloutAbort, await read_json(request, svc.settings.server.max_body_bytes))
    abort = functools.partial(rollout.abort, by=principal.name, reason=body.reason)
    release = await asyncio.to_thread(abort, svc.chain, name)
    _forget(svc.serving.rollouts, name)
    return release_out(release, release.id, admin=True)


def _forget(rollouts: Rollouts | None, name: str) -> None:
    """This process serves the rollout's end at once (others within the canary cache's TTL)."""
    if rollouts is not None:
        rollouts.forget(name)
