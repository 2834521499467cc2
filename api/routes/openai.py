"""OpenAI-compatible routes: chat completions (plain and SSE) and the model list."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from reef.api.answers import (
    call_receipt,
    event_stream,
    json_replay,
    plain_answer,
    receipt_headers,
    start_call,
    stream_error,
)
from reef.api.bodies import read_json, validate
from reef.api.contract import CALL_HEADERS, TAGS_NOTE, events, inference, reads
from reef.api.services import caller, services
from reef.engines.chunks import disassemble
from reef.errors import ReefError
from reef.records import Record
from reef.wire import ChatCompletionOut, ChatCompletionRequest, ModelList

router = APIRouter(tags=["openai"])
log = logging.getLogger("reef.api")


def sse(data: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


def replay_stream(record: Record) -> StreamingResponse:
    """A stored chat.completion answered again as the SSE stream it was (an idempotent retry
    of a streaming request)."""
    options = record.request.get("stream_options") or {}
    chunks = disassemble(record.response, include_usage=bool(options.get("include_usage")))

    async def events() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield sse(chunk)
        yield b"data: [DONE]\n\n"

    return event_stream(events(), receipt_headers(record, True))


@router.post(
    "/v1/chat/completions",
    openapi_extra=reads(
        ChatCompletionRequest,
        headers=CALL_HEADERS,
        description="OpenAI's chat completions. Every answer carries its receipt "
        "(`x-reef-agent-record-id`): report feedback on it with POST /reef/report." + TAGS_NOTE,
    ),
    responses=inference(
        ChatCompletionOut,
        events(
            "data: a chat.completion.chunk as JSON (or an error object); the last is [DONE]",
            named=False,
            json=False,
        ),
        *(403, 404, 409, 429, 500, 502, 503),
    ),
    summary="Create a chat completion (OpenAI wire format); answers carry a receipt header",
)
async def chat_completions(request: Request) -> Response:
    svc, _, scenario_name = caller(request)
    body = await read_json(request, svc.settings.server.max_body_bytes)
    req = validate(ChatCompletionRequest, body)
    serving = svc.serving
    model = serving.resolve_model(req.model)
    serving.limits.check_chat(body)
    scenario = await serving.scenario(scenario_name)
    call = await start_call(
        request, svc, scenario, "chat.completions", body, {**body, "model": model}
    )
    if call.replay is not None:
        return replay_stream(call.replay) if req.stream else json_replay(svc, call)
    if not req.stream:
        return await plain_answer(svc, call)

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
                    svc.quotas.spend(call.record_id, done.response.get("usage"))
                    yield b"data: [DONE]\n\n"
        except ReefError as e:
            log.error("stream %s failed: %s", call.record_id, e.message)
            svc.metrics.errors.labels(e.type, e.code or "").inc()
            yield sse(stream_error(e))

    return event_stream(events(), call_receipt(call))


@router.get(
    "/v1/models", response_model=ModelList, summary="List the models this server answers to"
)
async def list_models(request: Request) -> Response:
    svc = services(request)
    svc.auth.principal(request)
    now = int(time.time())
    data = [
        {"id": m, "object": "model", "created": now, "owned_by": f"reef:{svc.engine.kind}"}
        for m in svc.serving.models()
    ]
    return Response(orjson.dumps({"object": "list", "data": data}), media_type="application/json")
