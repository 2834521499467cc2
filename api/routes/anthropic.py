"""Anthropic Messages route, translated to and from the engine's OpenAI form."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from reef import anthropic
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
from reef.api.services import caller
from reef.engines.chunks import disassemble
from reef.errors import ReefError
from reef.records import Record
from reef.wire import AnthropicMessageOut, AnthropicMessagesRequest

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

    return event_stream(events(), receipt_headers(record, True))


@router.post(
    "/v1/messages",
    openapi_extra=reads(
        AnthropicMessagesRequest,
        headers=CALL_HEADERS,
        description="Anthropic's Messages API. Every answer carries its receipt "
        "(`x-reef-agent-record-id`): report feedback on it with POST /reef/report. Errors "
        'also carry `"type": "error"`, as Anthropic\'s do.' + TAGS_NOTE,
    ),
    responses=inference(
        AnthropicMessageOut,
        events(
            "Anthropic's stream: message_start, content_block_start, content_block_delta, "
            "content_block_stop, message_delta, message_stop (or error)",
            named=True,
            json=True,
        ),
        *(403, 404, 409, 429, 500, 502, 503),
    ),
    summary="Create a message (Anthropic wire format); answers carry a receipt header",
)
async def messages(request: Request) -> Response:
    svc, _, scenario_name = caller(request)
    body = await read_json(request, svc.settings.server.max_body_bytes)
    req = validate(AnthropicMessagesRequest, body)
    serving = svc.serving
    model = serving.resolve_model(req.model)
    serving.limits.check_messages(body)
    scenario = await serving.scenario(scenario_name)
    engine_body = anthropic.to_openai({**body, "model": model})
    call = await start_call(request, svc, scenario, "messages", body, engine_body)
    if call.replay is not None:
        return replay_stream(call.replay) if req.stream else json_replay(svc, call)
    msg_id = anthropic.message_id()

    def render(response: dict[str, Any]) -> dict[str, Any]:
        return anthropic.from_openai(response, req.model, msg_id)

    if not req.stream:
        return await plain_answer(svc, call, render)

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
                    svc.quotas.spend(call.record_id, done.response.get("usage"))
                    yield event(*translator.stop())
        except ReefError as e:
            log.error("stream %s failed: %s", call.record_id, e.message)
            svc.metrics.errors.labels(e.type, e.code or "").inc()
            yield event("error", stream_error(e, anthropic=True))

    return event_stream(events(), call_receipt(call))
