"""Release chain routes: list releases and candidates, roll back, promote a pending candidate.

Rollback and promote go through the one release path (deploy.chain.ReleaseChain), as a flow's
deploy does: stage the release in this process's engine, verify it, then move the head by
compare-and-swap; a publisher that lost the race gets 409 and nothing changes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Annotated

from fastapi import APIRouter, Query, Request

from reef.api.answers import candidate_out, release_out
from reef.api.bodies import read_json, validate
from reef.api.contract import ScenarioPath, errors, reads
from reef.api.services import caller
from reef.records import CANDIDATE_STATUSES
from reef.wire import CandidateList, ReleaseList, ReleaseOut, ReleaseRef

log = logging.getLogger("reef.api")
router = APIRouter(prefix="/reef/scenarios", tags=["releases"])


@router.get(
    "/{scenario}/releases",
    response_model=ReleaseList,
    responses=errors(403, 404, 503),
    summary="The scenario's release chain, newest first; `current` marks the head",
)
async def list_releases(request: Request, scenario: ScenarioPath) -> ReleaseList:
    svc, principal, name = caller(request, scenario)
    scen = await asyncio.to_thread(svc.store.get_scenario, name)
    chain = await asyncio.to_thread(svc.store.list_releases, name)
    head = scen.head_release_id
    return ReleaseList(data=[release_out(r, head, admin=principal.admin) for r in reversed(chain)])


@router.get(
    "/{scenario}/candidates",
    response_model=CandidateList,
    responses=errors(403, 404, 503),
    summary="Trained candidates, newest first",
)
async def list_candidates(
    request: Request,
    scenario: ScenarioPath,
    # the store checks it (400 naming the statuses); declared here for the spec
    status: Annotated[
        str | None,
        Query(description="only these", json_schema_extra={"enum": sorted(CANDIDATE_STATUSES)}),
    ] = None,
) -> CandidateList:
    svc, principal, name = caller(request, scenario)
    await asyncio.to_thread(svc.store.get_scenario, name)
    rows = await asyncio.to_thread(svc.store.list_candidates, name, status)
    return CandidateList(data=[candidate_out(c, admin=principal.admin) for c in rows])


@router.post(
    "/{scenario}/rollback",
    response_model=ReleaseOut,
    status_code=201,
    openapi_extra=reads(ReleaseRef),
    summary="Republish an earlier release's content as the new head (admin)",
    responses=errors(404, 409, 500, 503, e409="the head moved meanwhile; nothing changed"),
)
async def rollback(request: Request, scenario: ScenarioPath) -> ReleaseOut:
    svc, principal, name = caller(request, scenario)
    principal.require_admin("rollback")
    body = validate(ReleaseRef, await read_json(request, svc.settings.server.max_body_bytes))
    release = await asyncio.to_thread(svc.chain.rollback, name, body.release_id)
    return release_out(release, release.id, admin=True)  # admins only


@router.post(
    "/{scenario}/promote",
    response_model=ReleaseOut,
    status_code=201,
    openapi_extra=reads(ReleaseRef),
    summary="Publish a pending candidate (held by the manual gate) as the new head (admin)",
    responses=errors(404, 409, 500, 503, e409="not pending, or the head moved meanwhile"),
)
async def promote(request: Request, scenario: ScenarioPath) -> ReleaseOut:
    svc, principal, name = caller(request, scenario)
    principal.require_admin("promote")
    body = validate(ReleaseRef, await read_json(request, svc.settings.server.max_body_bytes))
    promote = functools.partial(svc.chain.promote, by=principal.name)
    release = await asyncio.to_thread(promote, name, body.release_id)
    return release_out(release, release.id, admin=True)  # admins only
