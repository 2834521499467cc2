"""OpenAI Responses route (`POST /v1/responses`, `GET /v1/responses/{id}`), translated to and
from the engine's chat-completions form (reef.responses).

A response is a record: its id is the record's, its receipt is in `x-reef-agent-record-id`, and
`previous_response_id` continues the conversation of the records it names, in their session.
`store: false` is honoured for reading back (404) and continuing (404); Reef still records the
exchange, as it records every call: that is its receipt.

With `engine.upstream.responses` (an upstream that serves the Responses API itself) the body
goes to that upstream unchanged and its answer comes back as it sent it, recorded likewise;
ids, `previous_response_id` and retrieval are then the upstream's.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from reef import responses
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
from reef.api.contract import (
    CALL_HEADERS,
    RECEIPT_HEADERS,
    SCENARIO,
    TAGS_NOTE,
    errors,
    events,
    inference,
    reads,
)
from reef.api.services import Services, caller
from reef.engines.chunks import disassemble
from reef.errors import BadRequest, NotFound, ReefError
from reef.records import Record, Scenario
from reef.store.deadline import bounded
from reef.wire import ResponseObject, ResponsesRequest

router = APIRouter(tags=["openai"])
log = logging.getLogger("reef.api")

# How many earlier responses a `previous_response_id` chain may reach back: each is a record
# read on every call that continues it, so the cost of a call stays bounded.
MAX_CHAIN = 128


def event(data: dict[str, Any]) -> bytes:
    return b"event: " + str(data["type"]).encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


async def _stored(svc: Services, scenario: str, resp_id: str, param: str) -> Record:
    """The record of a stored response of this scenario; 404 for anything else."""
    missing = NotFound(f"response '{resp_id}' not found", code="response_not_found", param=param)
    record_id = responses.record_id_of(resp_id)
    if record_id is None:
        raise missing
    try:
        record = await bounded(svc.store_deadline_s, svc.store.get_record, scenario, record_id)
    except NotFound:
        raise missing from None
    if record.route != "responses" or record.request.get("store") is False:
        raise missing
    return record


async def _history(
    svc: Services, scenario: str, resp_id: str
) -> tuple[list[dict[str, Any]], Record]:
    """The conversation a `previous_response_id` continues, and the record it names."""
    chain: list[Record] = []
    current: str | None = resp_id
    while current:
        if len(chain) >= MAX_CHAIN:
            raise BadRequest(
                f"the conversation is longer than {MAX_CHAIN} responses: send its input instead",
                param="previous_response_id",
            )
        chain.append(await _stored(svc, scenario, current, "previous_response_id"))
        current = chain[-1].request.get("previous_response_id")
    messages: list[dict[str, Any]] = []
    for record in reversed(chain):
        messages += responses.input_messages(record.request)
        messages += responses.output_messages(record.response)
    return messages, chain[0]


def replay_stream(record: Record) -> StreamingResponse:
    """A stored response answered again as its event stream (an idempotent retry)."""
    stored = record.response
    message: dict[str, Any] = {"role": "assistant", "content": responses.output_text(stored)}
    calls = [i for i in stored.get("output") or [] if i.get("type") == "function_call"]
    if calls:
        message["tool_calls"] = [
            {
                "id": c["call_id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for c in calls
        ]
    finish = "stop" if stored.get("status") == "completed" else "length"
    chat = {"choices": [{"index": 0, "message": message, "finish_reason": finish}]}
    translator = responses.StreamTranslator(record.request, stored["id"])

    async def events() -> AsyncIterator[bytes]:
        for data in translator.start():
            yield event(data)
        for chunk in disassemble(chat):
            for data in translator.chunk(chunk):
                yield event(data)
        for data in translator.finish_events(stored):
            yield event(data)

    return event_stream(events(), receipt_headers(record, True))


@router.post(
    "/v1/responses",
    openapi_extra=reads(
        ResponsesRequest,
        headers=CALL_HEADERS,
        description="OpenAI's Responses API. Every answer carries its receipt "
        "(`x-reef-agent-record-id`): report feedback on it with POST /reef/report. "
        "`previous_response_id` continues a stored response of the scenario (404 otherwise)."
        + TAGS_NOTE,
    ),
    responses=inference(
        ResponseObject,
        events(
            "response.created, response.in_progress, output item and content events, then "
            "response.completed or response.incomplete (or error)",
            named=True,
            json=True,
        ),
        *(403, 404, 409, 429, 500, 502, 503),
    ),
    summary="Create a response (OpenAI Responses API); answers carry a receipt header",
)
async def create_response(request: Request) -> Response:
    svc, _, scenario_name = caller(request)
    body = await read_json(request, svc.settings.server.max_body_bytes)
    req = validate(ResponsesRequest, body)
    serving = svc.serving
    model = serving.resolve_model(req.model)
    serving.limits.check_responses(body)
    scenario = await serving.scenario(scenario_name)
    if serving.passes_responses_through:
        return await _passed_through(request, svc, scenario, {**body, "model": model})
    history, session_id = None, None
    if req.previous_response_id:
        history, previous = await _history(svc, scenario.name, req.previous_response_id)
        session_id = previous.session_id
    engine_body = responses.to_chat({**body, "model": model}, history)
    call = await start_call(
        request, svc, scenario, "responses", body, engine_body, session_id=session_id
    )
    if call.replay is not None:
        return replay_stream(call.replay) if req.stream else json_replay(svc, call)
    resp_id = responses.response_id(call.record_id)

    if not req.stream:
        return await plain_answer(svc, call, lambda chat: responses.from_chat(chat, body, resp_id))

    translator = responses.StreamTranslator(body, resp_id)
    items = await serving.open_stream(call, translator.final)

    async def events() -> AsyncIterator[bytes]:
        for data in translator.start():
            yield event(data)
        try:
            async for item in items:
                if isinstance(item, dict):
                    for data in translator.chunk(item):
                        yield event(data)
                else:
                    record, done = item
                    for data in translator.finish_events(record.response):
                        yield event(data)
                    svc.metrics.record_written(
                        scenario.name, call.route, done.response.get("usage")
                    )
                    svc.quotas.spend(call.record_id, done.response.get("usage"))
        except ReefError as e:
            log.error("stream %s failed: %s", call.record_id, e.message)
            svc.metrics.errors.labels(e.type, e.code or "").inc()
            err = stream_error(e)["error"]
            yield event(
                {
                    "type": "error",
                    "sequence_number": translator.seq,
                    "code": err.get("code"),
                    "message": err.get("message", ""),
                    "param": err.get("param"),
                }
            )

    return event_stream(events(), call_receipt(call))


async def _check_continued(svc: Services, scenario: str, previous: Any) -> None:
    """404 unless a record of `scenario` answered with the upstream response `previous`."""
    if previous is None:
        return
    found = None
    if isinstance(previous, str) and previous:
        state = responses.answered_state(previous)
        found = await bounded(
            svc.store_deadline_s, svc.store.find_session_parent, scenario, [state]
        )
    if found is None:
        raise NotFound(
            f"response '{previous}' not found",
            code="response_not_found",
            param="previous_response_id",
        )


async def _passed_through(
    request: Request, svc: Services, scenario: Scenario, body: dict[str, Any]
) -> Response:
    """The body to the upstream's own /v1/responses, unchanged; its answer (or its events, in
    its own sequence) back, recorded with a receipt like any call. The event that ends a
    stream leaves once the record is durable. A `previous_response_id` must be one this
    scenario's records answered with: the upstream keeps every scenario's responses."""
    await _check_continued(svc, scenario.name, body.get("previous_response_id"))
    call = await start_call(request, svc, scenario, "responses", body, body, native=True)
    stream = bool(body.get("stream"))
    if call.replay is not None:
        return replay_stream(call.replay) if stream else json_replay(svc, call)
    if not stream:
        return await plain_answer(svc, call)
    items = await svc.serving.open_stream(call, lambda last: last.get("response") or last)

    async def events() -> AsyncIterator[bytes]:
        seq = 0
        try:
            async for item in items:
                if isinstance(item, dict):
                    seq = int(item.get("sequence_number") or seq) + 1
                    yield event(item)
                else:
                    record, done = item
                    yield event(done.response)
                    svc.metrics.record_written(
                        scenario.name, call.route, record.response.get("usage")
                    )
                    svc.quotas.spend(call.record_id, record.response.get("usage"))
        except ReefError as e:
            log.error("stream %s failed: %s", call.record_id, e.message)
            svc.metrics.errors.labels(e.type, e.code or "").inc()
            err = stream_error(e)["error"]
            yield event(
                {
                    "type": "error",
                    "sequence_number": seq,
                    "code": err.get("code"),
                    "message": err.get("message", ""),
                    "param": err.get("param"),
                }
            )

    return event_stream(events(), call_receipt(call))


@router.get(
    "/v1/responses/{response_id}",
    openapi_extra=reads(headers=(SCENARIO,)),
    response_model=ResponseObject,
    responses={200: {"headers": RECEIPT_HEADERS}, **errors(403, 404, 503)},
    summary="A stored response (store was not false), as it was answered",
)
async def get_response(request: Request, response_id: str) -> Response:
    svc, _, scenario = caller(request)
    record = await _stored(svc, scenario, response_id, "response_id")
    return Response(
        orjson.dumps(record.response),
        media_type="application/json",
        headers=receipt_headers(record, False),
    )
