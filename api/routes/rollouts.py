"""Rollout routes: a scenario's live canary (or shadow, or A/B split), and an admin's promote or
abort that ends it early (an A/B split ends only so).

Both go through the one release path (deploy.rollout → deploy.chain.ReleaseChain): a promote
publishes the canary by compare-and-swap on the head it was made on; an abort retires it and
records a rollback release with the reason and the numbers at that moment.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from typing import Annotated

from fastapi import APIRouter, Query, Request

from reef.api.answers import release_out
from reef.api.bodies import read_json, validate
from reef.api.contract import ScenarioPath, errors, reads
from reef.api.services import Services, caller
from reef.deploy import rollout
from reef.records import Release
from reef.rollouts import Rollouts
from reef.wire import (
    ReleaseOut,
    RolloutAbort,
    RolloutOut,
    RolloutPromote,
    ShadowRecordList,
    ShadowRecordOut,
)

router = APIRouter(prefix="/reef/scenarios", tags=["rollouts"])


@router.get(
    "/{scenario}/rollout",
    response_model=RolloutOut,
    responses=errors(403, 404, 503, e404="no rollout is live"),
    summary="The live rollout and the sequential test's verdict now (404: none is live)",
)
async def rollout_status(request: Request, scenario: ScenarioPath) -> RolloutOut:
    svc, _, name = caller(request, scenario)
    if _is_ab(svc, name):
        return RolloutOut.model_validate(
            await asyncio.to_thread(rollout.ab_status, svc.chain, name)
        )
    rollouts = svc.serving.rollouts
    canary = await asyncio.to_thread(svc.chain.canary, name)
    health = rollouts.health(canary.id) if rollouts is not None else None
    now = await asyncio.to_thread(rollout.status, svc.chain, name, health)
    return RolloutOut.model_validate(now)


@router.post(
    "/{scenario}/rollout/promote",
    response_model=ReleaseOut,
    status_code=201,
    summary="End the rollout now: the canary becomes the head; an A/B split's release_id "
    "(default b) becomes the head (admin)",
    openapi_extra=reads(RolloutPromote, optional=True),
    responses=errors(
        404,
        409,
        500,
        503,
        e404="no rollout is live",
        e409="the head moved under the canary; nothing published",
    ),
)
async def rollout_promote(request: Request, scenario: ScenarioPath) -> ReleaseOut:
    svc, principal, name = caller(request, scenario)
    principal.require_admin("promote a canary")
    if _is_ab(svc, name):
        body = RolloutPromote()
        if _has_body(request):
            raw = await read_json(request, svc.settings.server.max_body_bytes)
            body = validate(RolloutPromote, raw)
        keep = body.release_id or svc.settings.rollout.for_scenario(name).ab.releases[1]
        end = functools.partial(
            rollout.end_ab, by=principal.name, keep=keep, reason=f"{keep} kept by {principal.name}"
        )
        release: Release = await asyncio.to_thread(end, svc.chain, name)
        _forget(svc.serving.rollouts, name)
        return release_out(release, release.id, admin=True)
    release = await asyncio.to_thread(
        functools.partial(rollout.promote, by=principal.name), svc.chain, name
    )
    _forget(svc.serving.rollouts, name)
    return release_out(release, release.id, admin=True)


@router.post(
    "/{scenario}/rollout/abort",
    response_model=ReleaseOut,
    status_code=201,
    openapi_extra=reads(RolloutAbort, optional=True),
    responses=errors(404, 409, 503, e404="no rollout is live", e409="the head moved meanwhile"),
    summary="End the rollout now: retire the canary, record a rollback release (admin)",
)
async def rollout_abort(request: Request, scenario: ScenarioPath) -> ReleaseOut:
    svc, principal, name = caller(request, scenario)
    principal.require_admin("abort a canary")
    body = RolloutAbort()
    if _has_body(request):
        body = validate(RolloutAbort, await read_json(request, svc.settings.server.max_body_bytes))
    if _is_ab(svc, name):
        end = functools.partial(rollout.end_ab, by=principal.name, keep=None, reason=body.reason)
        release = await asyncio.to_thread(end, svc.chain, name)
    else:
        abort = functools.partial(rollout.abort, by=principal.name, reason=body.reason)
        release = await asyncio.to_thread(abort, svc.chain, name)
    _forget(svc.serving.rollouts, name)
    return release_out(release, release.id, admin=True)


@router.get(
    "/{scenario}/shadow-records",
    response_model=ShadowRecordList,
    responses=errors(403, 404, 503),
    summary="Shadow rollouts' answers to copies of calls, with their scores (never in /records)",
)
async def list_shadow_records(
    request: Request,
    scenario: ScenarioPath,
    release_id: str | None = None,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> ShadowRecordList:
    svc, _, name = caller(request, scenario)
    rows = await asyncio.to_thread(
        svc.store.list_shadow_records, name, release_id, after, limit + 1
    )
    page = rows[:limit]
    return ShadowRecordList(
        data=[ShadowRecordOut(**dataclasses.asdict(r)) for r in page],
        has_more=len(rows) > limit,
        last_id=page[-1].id if page else None,
    )


def _forget(rollouts: Rollouts | None, name: str) -> None:
    """This process serves the rollout's end at once (others within the canary cache's TTL)."""
    if rollouts is not None:
        rollouts.forget(name)


def _is_ab(svc: Services, name: str) -> bool:
    """Whether the scenario's rollout is an A/B split (ended only by an operator)."""
    return svc.settings.rollout.for_scenario(name).mode == "ab"


def _has_body(request: Request) -> bool:
    return (
        request.headers.get("content-length", "0") != "0" or "transfer-encoding" in request.headers
    )
