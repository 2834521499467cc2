"""Anthropic Messages route, translated to and from the engine's OpenAI form."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from api.bodies import call_headers, read_json, validate
from api.errors import error_body
from api.routes.openai import RECEIPT, RELEASE, SSE_HEADERS, _schema_ref, receipt_headers
from api.services import caller
from reef import anthropic
from reef.engines.chunks import disassemble
from reef.errors import ReefError
from reef.records import Record
from reef.wire import AnthropicMessagesRequest

router = APIRouter(tags=["anthropic"])
log = logging.getLogger("reef.api")


def event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def replay_stream(record: Record) -> StreamingResponse:
    """A stored Anthropic message answered again as its event stream: the same translator a
    live stream goes through, fed with the chunks the answer adds up to."""
    message = record.response
    translator = anthropic.StreamTranslator(message.get("model", ""), message.get("id", ""))

    async def events() -> AsyncIterator[bytes]:
        for name, data in translator.start():
            yield event(name, data)
        for chunk in disassemble(anthropic.to_openai_response(message)):
            for name, data in translator.chunk(chunk):
                yield event(name, data)
        for name, data in translator.finish(message):
            yield event(name, data)
        yield event(*translator.stop())

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={**receipt_headers(record, True), **SSE_HEADERS},
    )


@router.post(
    "/v1/messages",
    openapi_extra=_schema_ref(AnthropicMessagesRequest),
    summary="Create a message (Anthropic wire format); answers carry a receipt header",
)
async def messages(request: Request) -> Response:
    svc, _, scenario_name = caller(request)
    body = await read_json(request, svc.settings.server.max_body_bytes)
    req = validate(AnthropicMessagesRequest, body)
    serving = svc.serving
    model = serving.resolve_model(req.model)
    serving.check_max_tokens(req.max_tokens)
    scenario = await serving.scenario(scenario_name)
    engine_body = anthropic.to_openai({**body, "model": model})
    asked = call_headers(request)
    call = await serving.new_call(
        scenario,
        "messages",
        body,
        engine_body,
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
    msg_id = anthropic.message_id()

    def render(response: dict[str, Any]) -> dict[str, Any]:
        return anthropic.from_openai(response, req.model, msg_id)

    if not req.stream:
        record, done = await serving.complete(call, render)
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

    items = await serving.open_stream(call, render)
    translator = anthropic.StreamTranslator(req.model, msg_id)

    async def events() -> AsyncIterator[bytes]:
        for name, data in translator.start():
            yield event(name, data)
        try:
            async for item in items:
                if isinstance(item, dict):
                    for name, data in translator.chunk(item):
                        yield event(name, data)
                else:
                    record, done = item
                    for name, data in translator.finish(record.response):
                        yield event(name, data)
                    svc.metrics.record_written(
                        scenario.name, call.route, done.response.get("usage")
                    )
                    yield event(*translator.stop())
        except ReefError as e:
            log.error("stream %s failed: %s", call.record_id, e.message)
            svc.metrics.errors.labels(e.type, e.code or "").inc()
            yield event("error", error_body(e, anthropic=True))

    return StreamingResponse(
        events(), media_type="text/event-stream", headers={**headers, **SSE_HEADERS}
    )
