"""Anthropic Messages route, translated to and from the engine's OpenAI form."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from api.bodies import read_json, tags_of, validate
from api.errors import error_body
from api.routes.openai import RECEIPT, RELEASE, SSE_HEADERS, _schema_ref
from api.services import caller
from reef import anthropic
from reef.errors import ReefError
from reef.wire import AnthropicMessagesRequest

router = APIRouter(tags=["anthropic"])
log = logging.getLogger("reef.api")


def event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


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
    call = serving.new_call(scenario, "messages", body, engine_body, tags_of(request))
    headers = {RECEIPT: call.record_id, RELEASE: call.release_id}
    msg_id = anthropic.message_id()

    def render(response: dict[str, Any]) -> dict[str, Any]:
        return anthropic.from_openai(response, req.model, msg_id)

    if not req.stream:
        record, done = await serving.complete(call, render)
        svc.metrics.record_written(scenario.name, call.route, done.response.get("usage"))
        return Response(
            orjson.dumps(record.response), media_type="application/json", headers=headers
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
