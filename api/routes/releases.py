"""Release chain routes: list releases and candidates, roll back, promote a pending candidate.

Rollback and promote deploy through the same path a flow's deploy takes (deploy.release):
stage the release in this process's engine, verify it, then move the head by compare-and-swap;
a publisher that lost the race gets 409 and nothing changes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from fastapi import APIRouter, Request

from api.answers import schema_ref
from api.bodies import read_json, validate
from api.services import Services, caller
from reef.errors import BadRequest, Conflict
from reef.harness import harness_release, register_harness
from reef.records import Candidate, Release, new_id, utcnow
from reef.variants import Variants
from reef.wire import CandidateList, CandidateOut, ReleaseList, ReleaseOut, ReleaseRef

log = logging.getLogger("reef.api")
router = APIRouter(prefix="/reef/scenarios", tags=["releases"])


def release_out(r: Release, head_id: str) -> ReleaseOut:
    return ReleaseOut(
        release_id=r.id,
        parent_release_id=r.parent_id,
        seq=r.seq,
        current=r.id == head_id,
        kind=r.kind,
        operation=r.operation,
        created_at=r.created_at,
        model_uri=r.model_uri,
        uri=r.uri,
        content_hash=r.content_hash,
        recipe=r.recipe,
        dataset_id=r.dataset_id,
        metrics=r.metrics,
        gate=r.gate,
        metadata=r.metadata,
    )


def candidate_out(c: Candidate) -> CandidateOut:
    d = dataclasses.asdict(c)
    return CandidateOut(
        release_id=c.id,
        parent_release_id=c.parent_id,
        **{k: v for k, v in d.items() if k not in ("id", "parent_id", "scenario", "uri")},
    )


@router.get(
    "/{scenario}/releases",
    response_model=ReleaseList,
    summary="The scenario's release chain, newest first; `current` marks the head",
)
async def list_releases(request: Request, scenario: str) -> ReleaseList:
    svc, _, name = caller(request, scenario)
    scen = await asyncio.to_thread(svc.store.get_scenario, name)
    chain = await asyncio.to_thread(svc.store.list_releases, name)
    return ReleaseList(data=[release_out(r, scen.head_release_id) for r in reversed(chain)])


@router.get(
    "/{scenario}/candidates",
    response_model=CandidateList,
    summary="Trained candidates, newest first",
)
async def list_candidates(
    request: Request, scenario: str, status: str | None = None
) -> CandidateList:
    svc, _, name = caller(request, scenario)
    await asyncio.to_thread(svc.store.get_scenario, name)
    rows = await asyncio.to_thread(svc.store.list_candidates, name, status)
    return CandidateList(data=[candidate_out(c) for c in rows])


class LocalEngine:
    """deploy.engine.EngineTarget for this process's engine, called from a worker thread."""

    def __init__(self, svc: Services, loop: asyncio.AbstractEventLoop):
        # None: an engine that cannot load releases (upstream): it serves base releases only,
        # with or without a harness
        self._variants: Variants | None = svc.variants
        self.engine_kind = svc.engine.kind
        self.serving = svc.serving
        self.loop = loop

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def _deployable(self) -> Variants:
        if self._variants is None:
            raise BadRequest(
                f"the {self.engine_kind} engine cannot load releases", code="not_deployable"
            )
        return self._variants

    def load(self, name: str, kind: str, source: str) -> dict[str, Any]:
        return dict(self._run(self._deployable().load(name, kind, source)))

    def verify(self, name: str) -> dict[str, Any]:
        return dict(self._run(self._deployable().verify(name)))

    def unload(self, name: str) -> None:
        self._run(self._deployable().unload(name))

    def variants(self) -> list[str]:
        return self._variants.loaded() if self._variants is not None else []

    def refresh(self, scenario: str) -> None:
        self.loop.call_soon_threadsafe(self.serving.forget, scenario)


def _register(svc: Services, release: Release) -> Release:
    """A model version in MLflow for `release` (the chain's mirror), before it is published."""
    from reef import registry

    uri = svc.settings.tracking_uri
    # A release that changed only the harness (it names the release whose weights it keeps) is
    # mirrored by its harness files; one with weights of its own, by its weights.
    cache, harness = svc.serving.harnesses, None
    if cache is not None and "weights_release_id" in release.metadata:
        harness = cache.get(release)
    if harness is not None:
        model_uri = register_harness(
            svc.settings,
            release,
            harness,
            recipe=release.recipe or "",
            gate=release.operation,
            dataset_id=release.dataset_id,
        )
    elif release.kind == "base":
        model_uri = registry.register_base(
            uri,
            release.scenario,
            release.id,
            svc.settings.engine.model,
            artifact_location=svc.settings.mlflow_artifact_location,
            s3_endpoint_url=svc.settings.artifacts.s3_endpoint_url,
        )
    else:
        assert svc.variants is not None and release.uri
        model_uri = registry.register_candidate(
            uri,
            release.scenario,
            release.id,
            svc.variants.local_files(release.uri),
            kind=release.kind,
            parent_id=release.parent_id or "",
            content_hash=release.content_hash or "",
            recipe=release.recipe or "",
            dataset_id=release.dataset_id or "",
            metrics={
                k: float(v) for k, v in release.metrics.items() if isinstance(v, (int, float))
            },
            gate=release.operation,
            base_model=svc.settings.engine.model,
            artifact_location=svc.settings.mlflow_artifact_location,
            s3_endpoint_url=svc.settings.artifacts.s3_endpoint_url,
        )
    return dataclasses.replace(release, model_uri=model_uri)


async def deploy_here(svc: Services, release: Release) -> ReleaseOut:
    """Deploy `release` into this process's engine (stage, verify, compare-and-swap of the
    head, MLflow alias), as rollback, promote and a harness release do."""
    from deploy.release import deploy
    from reef import registry

    if svc.variants is None and release.kind != "base":
        raise BadRequest(
            f"the {svc.engine.kind} engine cannot load {release.kind} releases",
            code="not_deployable",
        )
    target = LocalEngine(svc, asyncio.get_running_loop())

    def champion(r: Release) -> None:
        if r.model_uri:
            registry.set_champion(svc.settings.tracking_uri, r.scenario, r.model_uri)

    published, _ = await asyncio.to_thread(
        deploy,
        svc.store,
        target,
        release,
        keep=max(2, svc.settings.reef.max_staleness + 1),
        mirror=champion,
    )
    return release_out(published, published.id)


@router.post(
    "/{scenario}/rollback",
    response_model=ReleaseOut,
    status_code=201,
    openapi_extra=schema_ref(ReleaseRef),
    summary="Republish an earlier release's content as the new head (admin)",
    responses={409: {"description": "the head moved meanwhile; nothing changed"}},
)
async def rollback(request: Request, scenario: str) -> ReleaseOut:
    svc, principal, name = caller(request, scenario)
    principal.require_admin("rollback")
    body = validate(ReleaseRef, await read_json(request, svc.settings.server.max_body_bytes))
    target = await asyncio.to_thread(svc.store.get_release, name, body.release_id)
    head = await asyncio.to_thread(svc.store.head_release, name)
    if target.id == head.id:
        raise Conflict(f"release {target.id} is already the head of '{name}'", code="is_head")
    release = dataclasses.replace(
        target,
        id=new_id("rel"),
        parent_id=head.id,
        operation="rollback",
        created_at=utcnow(),
        model_uri=None,
        metadata={**target.metadata, "source_release_id": target.id},
    )
    release = await asyncio.to_thread(_register, svc, release)
    return await deploy_here(svc, release)


def promoted(cand: Candidate, head: Release) -> Release:
    """The release a promoted candidate becomes on top of today's head. A harness candidate
    brings only its harness: it keeps whatever weights the head serves now."""
    release = cand.release("promote")
    if cand.operation == "harness":  # today's head's weights, the candidate's harness
        rebased = harness_release(head, cand.metadata["harness"])
        return dataclasses.replace(
            release,
            parent_id=head.id,
            kind=rebased.kind,
            uri=rebased.uri,
            metadata=rebased.metadata,
        )
    return dataclasses.replace(
        release,
        parent_id=head.id,  # reviewed against the head it replaces now
        metadata={**release.metadata, "trained_on": cand.parent_id},
    )


@router.post(
    "/{scenario}/promote",
    response_model=ReleaseOut,
    status_code=201,
    openapi_extra=schema_ref(ReleaseRef),
    summary="Publish a pending candidate (held by the manual gate) as the new head (admin)",
    responses={409: {"description": "not pending, or the head moved meanwhile"}},
)
async def promote(request: Request, scenario: str) -> ReleaseOut:
    svc, principal, name = caller(request, scenario)
    principal.require_admin("promote")
    body = validate(ReleaseRef, await read_json(request, svc.settings.server.max_body_bytes))
    cand = await asyncio.to_thread(svc.store.get_candidate, name, body.release_id)
    if cand.status != "pending":
        raise Conflict(
            f"candidate {cand.id} is {cand.status}, not pending", code="candidate_status"
        )
    head = await asyncio.to_thread(svc.store.head_release, name)
    release = promoted(cand, head)
    # claim the candidate first: a concurrent promote (or the paused flow) gets 409
    await asyncio.to_thread(
        svc.store.set_candidate_status, name, cand.id, "published", expected="pending"
    )
    try:
        return await deploy_here(svc, release)
    except Exception as e:
        await asyncio.to_thread(
            svc.store.set_candidate_status,
            name,
            cand.id,
            "pending",
            expected="published",
            message=f"promote failed: {e}",
        )
        raise
