"""OpenAI-compatible routes: chat completions (plain and SSE) and the model list."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from api.bodies import call_headers, read_json, validate
from api.errors import error_body
from api.services import caller, services
from reef.engines.chunks import disassemble
from reef.errors import ReefError
from reef.records import Record
from reef.wire import ChatCompletionRequest

router = APIRouter(tags=["openai"])
log = logging.getLogger("reef.api")

RECEIPT = "x-reef-agent-record-id"
RELEASE = "x-reef-release-id"
REPLAY = "x-reef-idempotent-replay"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def _schema_ref(model: type) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}
            },
        }
    }


def sse(data: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


def receipt_headers(record: Record, replay: bool) -> dict[str, str]:
    headers = {RECEIPT: record.id, RELEASE: record.release_id}
    if replay:
        headers[REPLAY] = "true"
    return headers


def replay_stream(record: Record) -> StreamingResponse:
    """A stored chat.completion answered again as the SSE stream it was (an idempotent retry
    of a streaming request)."""
    options = record.request.get("stream_options") or {}
    chunks = disassemble(record.response, include_usage=bool(options.get("include_usage")))

    async def events() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield sse(chunk)
        yield b"data: [DONE]\n\n"

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={**receipt_headers(record, True), **SSE_HEADERS},
    )


@router.post(
    "/v1/chat/completions",
    openapi_extra=_schema_ref(ChatCompletionRequest),
    summary="Create a chat completion (OpenAI wire format); answers carry a receipt header",
    response_description="chat.completion, or an SSE stream of chat.completion.chunk",
)
async def chat_completions(request: Request) -> Response:
    svc, _, scenario_name = caller(request)
    body = await read_json(request, svc.settings.server.max_body_bytes)
    req = validate(ChatCompletionRequest, body)
    serving = svc.serving
    model = serving.resolve_model(req.model)
    param = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
    serving.check_max_tokens(req.requested_max_tokens, param)
    scenario = await serving.scenario(scenario_name)
    asked = call_headers(request)
    call = await serving.new_call(
        scenario,
        "chat.completions",
        body,
        {**body, "model": model},
        asked.tags,
        session_id=asked.session_id,
        idempotency_key=asked.idempotency_key,
    )
    if call.replay is not None:
        svc.metrics.idempotent_replays.labels(scenario.name, call.route).inc()
        if req.stream:
            return replay_stream(call.replay)
        return Response(
            orjson.dumps(call.replay.response),
            media_type="application/json",
            headers=receipt_headers(call.replay, True),
        )
    headers = {RECEIPT: call.record_id, RELEASE: call.release_id}

    if not req.stream:
        record, done = await serving.complete(call)
        replayed = record.id != call.record_id  # another replica stored this key's answer
        if replayed:
            svc.metrics.idempotent_replays.labels(scenario.name, call.route).inc()
        else:
            svc.metrics.record_written(scenario.name, call.route, done.response.get("usage"))
        return Response(
            orjson.dumps(record.response),
            media_type="application/json",
            headers=receipt_headers(record, replayed),
        )

    items = await serving.open_stream(call)

    async def events() -> AsyncIterator[bytes]:
        try:
            async for item in items:
                if isinstance(item, dict):
                    yield sse(item)
                else:
                    _, done = item
                    svc.metrics.record_written(
                        scenario.name, call.route, done.response.get("usage")
                    )
                    yield b"data: [DONE]\n\n"
        except ReefError as e:
            log.error("stream %s failed: %s", call.record_id, e.message)
            svc.metrics.errors.labels(e.type, e.code or "").inc()
            yield sse(error_body(e))

    return StreamingResponse(
        events(), media_type="text/event-stream", headers={**headers, **SSE_HEADERS}
    )


@router.get("/v1/models", summary="List the models this server answers to")
async def list_models(request: Request) -> Response:
    svc = services(request)
    svc.auth.principal(request)
    now = int(time.time())
    data = [
        {"id": m, "object": "model", "created": now, "owned_by": f"reef:{svc.engine.kind}"}
        for m in svc.engine.models()
    ]
    return Response(orjson.dumps({"object": "list", "data": data}), media_type="application/json")
