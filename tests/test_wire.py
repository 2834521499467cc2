"""reef.wire without a server: tables of bodies the HTTP edge accepts (and what it reads from
them) and bodies it refuses, for the chat, Messages and Responses requests and Reef's own."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from reef.wire import (
    ID_PATTERN,
    SCENARIO_PATTERN,
    AnthropicMessagesRequest,
    ChatCompletionRequest,
    EngineGenerateIn,
    HarnessIn,
    ReleaseRef,
    ReportIn,
    ResponsesRequest,
    RolloutAbort,
    ScenarioIn,
)

HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("body", "max_tokens"),
    [
        ({"model": "m", "messages": HI}, None),
        ({"model": "m", "messages": HI, "max_tokens": 5}, 5),
        ({"model": "m", "messages": HI, "max_completion_tokens": 7}, 7),
        ({"model": "m", "messages": HI, "max_tokens": 5, "max_completion_tokens": 7}, 7),
    ],
)
def test_the_requested_max_tokens_prefers_max_completion_tokens(
    body: dict[str, Any], max_tokens: int | None
) -> None:
    assert ChatCompletionRequest.model_validate(body).requested_max_tokens == max_tokens


def test_a_chat_body_keeps_unknown_fields_and_parts() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}], "x_extra": 1},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
            {"role": "tool", "content": "42", "tool_call_id": "c1"},
        ],
        "stop": ["END"],
        "tool_choice": "auto",
        "logit_bias": {"1": 2},
    }
    got = ChatCompletionRequest.model_validate(body)
    assert got.model_extra == {"logit_bias": {"1": 2}}
    assert got.messages[1].model_extra == {"x_extra": 1}
    assert got.messages[1].content == [{"type": "text", "text": "hi"}]
    assert got.stop == ["END"] and got.messages[3].tool_call_id == "c1"


# (case, model, body): every one refused
REFUSED: list[tuple[str, type[BaseModel], dict[str, Any]]] = [
    ("chat: no messages", ChatCompletionRequest, {"model": "m", "messages": []}),
    ("chat: no model", ChatCompletionRequest, {"messages": HI}),
    ("chat: unknown role", ChatCompletionRequest, {"model": "m", "messages": [{"role": "bot"}]}),
    ("chat: max_tokens 0", ChatCompletionRequest, {"model": "m", "messages": HI, "max_tokens": 0}),
    (
        "chat: max_tokens as a string (strict)",
        ChatCompletionRequest,
        {"model": "m", "messages": HI, "max_tokens": "5"},
    ),
    (
        "chat: temperature above 2",
        ChatCompletionRequest,
        {"model": "m", "messages": HI, "temperature": 2.5},
    ),
    ("chat: top_p 0", ChatCompletionRequest, {"model": "m", "messages": HI, "top_p": 0}),
    ("chat: n 0", ChatCompletionRequest, {"model": "m", "messages": HI, "n": 0}),
    (
        "chat: top_logprobs 21",
        ChatCompletionRequest,
        {"model": "m", "messages": HI, "top_logprobs": 21},
    ),
    (
        "chat: stream as a string (strict)",
        ChatCompletionRequest,
        {"model": "m", "messages": HI, "stream": "true"},
    ),
    (
        "chat: content a number",
        ChatCompletionRequest,
        {"model": "m", "messages": [{"role": "user", "content": 5}]},
    ),
    ("messages: no max_tokens", AnthropicMessagesRequest, {"model": "m", "messages": HI}),
    (
        "messages: a system role in messages",
        AnthropicMessagesRequest,
        {"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
    ),
    (
        "messages: temperature above 1",
        AnthropicMessagesRequest,
        {"model": "m", "max_tokens": 5, "messages": HI, "temperature": 1.5},
    ),
    (
        "messages: top_k 0",
        AnthropicMessagesRequest,
        {"model": "m", "max_tokens": 5, "messages": HI, "top_k": 0},
    ),
    (
        "messages: content None",
        AnthropicMessagesRequest,
        {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": None}]},
    ),
    (
        "messages: tool_choice a string",
        AnthropicMessagesRequest,
        {"model": "m", "max_tokens": 5, "messages": HI, "tool_choice": "auto"},
    ),
    ("responses: no model", ResponsesRequest, {"input": "hi"}),
    ("responses: input a number", ResponsesRequest, {"model": "m", "input": 5}),
    ("responses: max_output_tokens 0", ResponsesRequest, {"model": "m", "max_output_tokens": 0}),
    ("responses: temperature above 2", ResponsesRequest, {"model": "m", "temperature": 3.0}),
    ("report: no references", ReportIn, {"score": 1.0, "references": []}),
    ("report: neither score nor feedback", ReportIn, {"references": ["rec_1"]}),
    ("report: repeated references", ReportIn, {"score": 1.0, "references": ["a", "a"]}),
    ("report: unknown field", ReportIn, {"score": 1.0, "references": ["a"], "extra": 1}),
    ("report: score NaN", ReportIn, {"score": float("nan"), "references": ["a"]}),
    ("report: score infinite", ReportIn, {"score": float("inf"), "references": ["a"]}),
    ("report: score as a string", ReportIn, {"score": "1", "references": ["a"]}),
    (
        "report: report_id with a space",
        ReportIn,
        {"report_id": "a b", "score": 1.0, "references": ["a"]},
    ),
    (
        "report: report_id starting with -",
        ReportIn,
        {"report_id": "-a", "score": 1.0, "references": ["a"]},
    ),
    ("scenario: a slash", ScenarioIn, {"name": "a/b"}),
    ("scenario: 65 characters", ScenarioIn, {"name": "a" * 65}),
    ("scenario: starts with .", ScenarioIn, {"name": ".a"}),
    ("scenario: unknown field", ScenarioIn, {"name": "a", "owner": "x"}),
    ("scenario: description too long", ScenarioIn, {"name": "a", "description": "x" * 2001}),
    ("release ref: empty", ReleaseRef, {"release_id": ""}),
    ("release ref: unknown field", ReleaseRef, {"release_id": "r", "force": True}),
    ("harness: unknown field", HarnessIn, {"files": {}, "tree": {}}),
    ("rollout abort: empty reason", RolloutAbort, {"reason": ""}),
    ("generate: bad scenario", EngineGenerateIn, {"scenario": "a b", "messages": HI}),
    ("generate: no messages", EngineGenerateIn, {"scenario": "a", "messages": []}),
    (
        "generate: max_tokens 0",
        EngineGenerateIn,
        {"scenario": "a", "messages": HI, "max_tokens": 0},
    ),
]


@pytest.mark.parametrize(("model", "body"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_a_body_out_of_bounds_is_refused(model: type[BaseModel], body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        model.model_validate(body)


# (case, model, body, fields read back)
ACCEPTED: list[tuple[str, type[BaseModel], dict[str, Any], dict[str, Any]]] = [
    (
        "messages: system blocks, stop sequences, unknown field kept",
        AnthropicMessagesRequest,
        {
            "model": "m",
            "max_tokens": 5,
            "messages": HI,
            "system": [{"type": "text", "text": "s"}],
            "stop_sequences": ["END"],
            "thinking": {"type": "disabled"},
        },
        {"system": [{"type": "text", "text": "s"}], "stream": False, "max_tokens": 5},
    ),
    (
        "responses: defaults",
        ResponsesRequest,
        {"model": "m"},
        {"input": None, "store": True, "stream": False, "previous_response_id": None},
    ),
    (
        "responses: a list of items and hosted-tool fields",
        ResponsesRequest,
        {"model": "m", "input": [{"role": "user", "content": "hi"}], "include": ["x"]},
        {"input": [{"role": "user", "content": "hi"}], "model_extra": {"include": ["x"]}},
    ),
    (
        "report: feedback only, an object",
        ReportIn,
        {"feedback": {"correction": "x"}, "references": ["rec_1"]},
        {"score": None, "feedback": {"correction": "x"}, "metadata": {}, "report_id": None},
    ),
    (
        "report: score 0 and an id with : and .",
        ReportIn,
        {"score": 0.0, "references": ["rec_1", "rec_2"], "report_id": "job:1.a_b-c"},
        {"score": 0.0, "report_id": "job:1.a_b-c", "references": ["rec_1", "rec_2"]},
    ),
    (
        "scenario: 64 characters",
        ScenarioIn,
        {"name": "A" + "b" * 63},
        {"name": "A" + "b" * 63, "description": None},
    ),
    (
        "rollout abort: default reason",
        RolloutAbort,
        {},
        {"reason": "aborted by an operator"},
    ),
    (
        "generate: defaults",
        EngineGenerateIn,
        {"scenario": "s", "messages": HI},
        {"release_id": None, "max_tokens": 64, "temperature": 0.0, "seed": None},
    ),
]


@pytest.mark.parametrize(
    ("model", "body", "fields"), [c[1:] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED]
)
def test_a_body_within_bounds_reads_back(
    model: type[BaseModel], body: dict[str, Any], fields: dict[str, Any]
) -> None:
    got = model.model_validate(body)
    assert {k: getattr(got, k) for k in fields} == fields


@pytest.mark.parametrize(
    ("pattern", "text", "matches"),
    [
        (SCENARIO_PATTERN, "default", True),
        (SCENARIO_PATTERN, "a.b_c-d", True),
        (SCENARIO_PATTERN, "a:b", False),
        (SCENARIO_PATTERN, "a\n", False),  # fullmatch: no trailing newline slips through
        (SCENARIO_PATTERN, "", False),
        (ID_PATTERN, "a:b", True),
        (ID_PATTERN, "a" * 128, True),
        (ID_PATTERN, "a" * 129, False),
        (ID_PATTERN, "_a", False),
    ],
)
def test_the_patterns_match_whole_strings(pattern: str, text: str, matches: bool) -> None:
    assert (re.fullmatch(pattern, text) is not None) == matches


def test_whole_number_floats_are_integers_and_are_forwarded_as_ints() -> None:
    """JSON Schema counts 6.0 as an integer (the spec says `integer`), so the edge takes it, and
    the body it forwards (and checks against caps) then holds the int; strings, booleans and
    fractions are still refused."""
    from reef.api.bodies import validate
    from reef.errors import BadRequest

    body: dict[str, Any] = {"model": "m", "messages": HI, "max_tokens": 6.0, "temperature": 1.0}
    assert validate(ChatCompletionRequest, body).max_tokens == 6
    assert type(body["max_tokens"]) is int and type(body["temperature"]) is float
    msg = {"model": "m", "messages": HI, "max_tokens": 4.0, "top_k": 2.0}
    validate(AnthropicMessagesRequest, msg)
    assert (type(msg["max_tokens"]), type(msg["top_k"])) == (int, int)
    for bad in ("6", 6.5, True):
        with pytest.raises(BadRequest, match="max_tokens"):
            validate(ChatCompletionRequest, {"model": "m", "messages": HI, "max_tokens": bad})
