"""How calls are answered: inference in either wire format (receipts, replays, plain answers),
and the release chain's rows."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from reef.api.auth import PRINCIPAL
from reef.api.bodies import call_headers
from reef.api.errors import error_body
from reef.api.services import Services
from reef.errors import ReefError
from reef.records import Candidate, Record, Release, Scenario
from reef.serving import Call
from reef.wire import CandidateOut, ReleaseOut

RECEIPT = "x-reef-agent-record-id"
RELEASE = "x-reef-release-id"
REPLAY = "x-reef-idempotent-replay"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def receipt_headers(record: Record, replay: bool) -> dict[str, str]:
    headers = {RECEIPT: record.id, RELEASE: record.release_id}
    if replay:
        headers[REPLAY] = "true"
    return headers


def call_receipt(call: Call) -> dict[str, str]:
    """The headers of a live call, sent before its record exists (streams)."""
    return {RECEIPT: call.record_id, RELEASE: call.release_id}


async def start_call(
    request: Request,
    svc: Services,
    scenario: Scenario,
    route: str,
    body: dict[str, Any],
    engine_body: dict[str, Any],
    *,
    session_id: str | None = None,
    native: bool = False,
) -> Call:
    """The call for this request, placed in its session (or a replay of an idempotent retry).
    An explicit session (the x-reef-session-id header) wins over `session_id`, the session a
    route found itself (a continued response's). `native`: see Serving.new_call."""
    asked = call_headers(request)
    principal = request.scope.get(PRINCIPAL)
    # A full line refuses before the quota counts the call or its session is looked up.
    svc.serving.check_admission()
    counters = await svc.quotas.admit(principal.name, scenario.name) if principal else []
    call = await svc.serving.new_call(
        scenario,
        route,
        body,
        engine_body,
        asked.tags,
        session_id=asked.session_id or session_id,
        idempotency_key=asked.idempotency_key,
        native=native,
        # the end user, which keeps one rollout arm with rollout.sticky "user"
        user_id=asked.user_id,
    )
    if call.replay is None:
        svc.quotas.hold(call.record_id, counters)
    return call


def json_answer(record: Record, replay: bool) -> Response:
    return Response(
        orjson.dumps(record.response),
        media_type="application/json",
        headers=receipt_headers(record, replay),
    )


def json_replay(svc: Services, call: Call) -> Response:
    """An idempotent retry of a plain request: the stored answer, nothing served or recorded."""
    assert call.replay is not None
    svc.metrics.idempotent_replays.labels(call.scenario.name, call.route).inc()
    return json_answer(call.replay, True)


async def plain_answer(
    svc: Services, call: Call, render: Callable[[dict[str, Any]], dict[str, Any]] | None = None
) -> Response:
    """Serve without streaming; the answer leaves once its record is durable."""
    if render is None:
        record, done = await svc.serving.complete(call)
    else:
        record, done = await svc.serving.complete(call, render)
    replayed = record.id != call.record_id  # another replica stored this key's answer first
    if replayed:
        svc.metrics.idempotent_replays.labels(call.scenario.name, call.route).inc()
    else:
        svc.metrics.record_written(call.scenario.name, call.route, done.response.get("usage"))
        svc.quotas.spend(call.record_id, done.response.get("usage"))
    return json_answer(record, replayed)


def stream_error(err: ReefError, *, anthropic: bool = False) -> dict[str, Any]:
    """The error event that ends a stream which failed after its headers went out."""
    return error_body(err, anthropic=anthropic)


def event_stream(events: AsyncIterator[bytes], headers: dict[str, str]) -> StreamingResponse:
    return StreamingResponse(
        events, media_type="text/event-stream", headers={**headers, **SSE_HEADERS}
    )


def without_locations(metadata: dict[str, Any]) -> dict[str, Any]:
    """Release or candidate metadata without where the server keeps files (the artifact key,
    the harness tree's key and uri): what a scenario-scoped token is shown. What the files are
    (content hashes, counts) stays."""
    out = {k: v for k, v in metadata.items() if k != "artifact_key"}
    harness = out.get("harness")
    if isinstance(harness, dict):
        out["harness"] = {k: v for k, v in harness.items() if k not in ("key", "uri")}
    return out


def release_out(r: Release, head_id: str, *, admin: bool = False) -> ReleaseOut:
    """A release row; `uri` and the file locations in `metadata` for admins only."""
    return ReleaseOut(
        release_id=r.id,
        parent_release_id=r.parent_id,
        seq=r.seq,
        current=r.id == head_id,
        kind=r.kind,
        operation=r.operation,
        created_at=r.created_at,
        model_uri=r.model_uri,
        uri=r.uri if admin else None,
        content_hash=r.content_hash,
        recipe=r.recipe,
        dataset_id=r.dataset_id,
        metrics=r.metrics,
        gate=r.gate,
        metadata=r.metadata if admin else without_locations(r.metadata),
    )


def candidate_out(c: Candidate, *, admin: bool = False) -> CandidateOut:
    """A candidate row; the file locations in `metadata` for admins only (its `uri` for none:
    the release it becomes shows it)."""
    d = dataclasses.asdict(c)
    if not admin:
        d["metadata"] = without_locations(c.metadata)
    return CandidateOut(
        release_id=c.id,
        parent_release_id=c.parent_id,
        **{k: v for k, v in d.items() if k not in ("id", "parent_id", "scenario", "uri")},
    )
