"""reef.responses without a server: tables of OpenAI Responses bodies and the chat bodies they
translate to, chat answers back as response objects, the stream's events, and the shapes that
are a 400."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from reef.errors import BadRequest
from reef.responses import (
    StreamTranslator,
    envelope,
    from_chat,
    input_messages,
    output_messages,
    output_text,
    record_id_of,
    response_id,
    to_chat,
)


@pytest.mark.parametrize(
    ("record", "response"), [("rec_abc", "resp_abc"), ("abc", "resp_abc"), ("rec_", "resp_")]
)
def test_a_response_id_is_its_records(record: str, response: str) -> None:
    assert response_id(record) == response


@pytest.mark.parametrize(
    ("response", "record"),
    [("resp_abc", "rec_abc"), ("resp_", None), ("chatcmpl-1", None), ("", None), ("rec_x", None)],
)
def test_the_record_a_response_id_names(response: str, record: str | None) -> None:
    assert record_id_of(response) == record


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# (case, Responses `input`, chat messages)
INPUTS: list[tuple[str, Any, list[dict[str, Any]]]] = [
    ("none", None, []),
    ("a string", "hi", [{"role": "user", "content": "hi"}]),
    (
        "a list of strings",
        ["a", "b"],
        [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    ),
    (
        "messages, type implied by role",
        [
            {"role": "developer", "content": "be brief"},
            {"type": "message", "role": "user", "content": "hi"},
            {"role": "system", "content": None},
        ],
        [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": "hi"},
            {"role": "system", "content": ""},
        ],
    ),
    (
        "text parts joined",
        [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "a"},
                    "b",
                    {"type": "text", "text": "c"},
                    {"type": "output_text", "text": None},
                ],
            }
        ],
        [{"role": "user", "content": "abc"}],
    ),
    (
        "an image keeps the parts",
        [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "what?"},
                    {"type": "input_image", "image_url": "data:image/png;base64,QUJD"},
                ],
            }
        ],
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}},
                ],
            }
        ],
    ),
    (
        "a refusal reads as text",
        [{"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}],
        [{"role": "assistant", "content": "no"}],
    ),
    (
        "a call alone, then its output",
        [
            {"type": "function_call", "call_id": "c1", "name": "get", "arguments": '{"k":1}'},
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
        ],
        [
            {"role": "assistant", "content": None, "tool_calls": [_call("c1", "get", '{"k":1}')]},
            {"role": "tool", "tool_call_id": "c1", "content": "42"},
        ],
    ),
    (
        "text then parallel calls: one assistant turn; object arguments serialized",
        [
            {"role": "assistant", "content": "looking"},
            {"type": "function_call", "call_id": "c1", "name": "a", "arguments": {"x": 1}},
            {"type": "function_call", "id": "fc_2", "name": "b"},
        ],
        [
            {
                "role": "assistant",
                "content": "looking",
                "tool_calls": [_call("c1", "a", '{"x":1}'), _call("fc_2", "b", "{}")],
            }
        ],
    ),
    (
        "a call after a user turn opens an assistant turn",
        [
            {"role": "user", "content": "go"},
            {"type": "function_call", "call_id": "c1", "name": "a", "arguments": "{}"},
        ],
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [_call("c1", "a", "{}")]},
        ],
    ),
    (
        "an output given as parts",
        [
            {
                "type": "function_call_output",
                "call_id": "c1",
                "output": [{"type": "input_text", "text": "o"}, {"type": "input_image"}],
            }
        ],
        [{"role": "tool", "tool_call_id": "c1", "content": "o"}],
    ),
    (
        "reasoning and item references dropped",
        [
            {"type": "reasoning", "summary": []},
            {"type": "item_reference", "id": "msg_1"},
            "hi",
        ],
        [{"role": "user", "content": "hi"}],
    ),
]


@pytest.mark.parametrize(("given", "expected"), [c[1:] for c in INPUTS], ids=[c[0] for c in INPUTS])
def test_input_translates_to_chat_messages(given: Any, expected: list[dict[str, Any]]) -> None:
    assert input_messages({"input": given}) == expected


# (case, Responses `input`, the 400's message)
BAD_INPUTS: list[tuple[str, Any, str]] = [
    ("a number", 5, "input must be a string or a list of items"),
    ("an item neither string nor object", [5], "input[0] must be an object"),
    ("an unknown role", [{"role": "tool", "content": "x"}], "input[0]: unknown role 'tool'"),
    (
        "content neither string nor list",
        [{"role": "user", "content": 5}],
        "input[0].content must be a string or a list",
    ),
    (
        "a part not an object",
        [{"role": "user", "content": [5]}],
        "input[0].content[0] must be an object",
    ),
    (
        "an image by file id",
        [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}],
        "input[0].content[0]: an input_image needs an image_url (file_id is not supported)",
    ),
    (
        "an audio part",
        [{"role": "user", "content": [{"type": "input_audio"}]}],
        "input[0].content[0]: content type 'input_audio' is not supported",
    ),
    (
        "an unknown item type",
        ["hi", {"type": "web_search_call"}],
        "input[1]: input item type 'web_search_call' is not supported",
    ),
    (
        "an item without type or role",
        [{"content": "x"}],
        "input[0]: input item type 'None' is not supported",
    ),
]


@pytest.mark.parametrize(
    ("given", "message"), [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS]
)
def test_malformed_input_is_a_bad_request(given: Any, message: str) -> None:
    with pytest.raises(BadRequest) as e:
        input_messages({"input": given})
    assert (str(e.value), e.value.status) == (message, 400)


FN_TOOL = {
    "type": "function",
    "name": "get",
    "description": "fetch",
    "parameters": {"type": "object"},
}
CHAT_FN_TOOL = {
    "type": "function",
    "function": {"name": "get", "description": "fetch", "parameters": {"type": "object"}},
}

# (case, Responses request, chat request)
REQUESTS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "input only",
        {"model": "m", "input": "hi"},
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    ),
    (
        "instructions lead, as a system message; parts joined",
        {"model": "m", "instructions": [{"type": "input_text", "text": "be brief"}], "input": "hi"},
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi"},
            ],
        },
    ),
    (
        "sampling and output limit",
        {
            "model": "m",
            "input": "hi",
            "max_output_tokens": 8,
            "temperature": 0,
            "top_p": 0.5,
            "seed": 3,
            "top_logprobs": 2,
            "stream": True,
            "store": False,
            "reasoning": {"effort": "low"},
            "metadata": {"a": "b"},
            "truncation": "auto",
        },
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 8,
            "temperature": 0,
            "top_p": 0.5,
            "seed": 3,
            "logprobs": True,
            "top_logprobs": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ),
    (
        "function tools, a namespace's functions, hosted tools left out, choice and parallel",
        {
            "model": "m",
            "input": "hi",
            "tools": [
                FN_TOOL,
                {"type": "web_search"},
                {
                    "type": "namespace",
                    "name": "ns",
                    "tools": [{"type": "function", "name": "inner"}, {"type": "other"}],
                },
            ],
            "tool_choice": {"type": "function", "name": "get"},
            "parallel_tool_calls": False,
        },
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [
                CHAT_FN_TOOL,
                {
                    "type": "function",
                    "function": {
                        "name": "inner",
                        "parameters": {"type": "object", "properties": {}},
                    },
                },
            ],
            "tool_choice": {"type": "function", "function": {"name": "get"}},
            "parallel_tool_calls": False,
        },
    ),
    (
        "tool choice without tools left out",
        {
            "model": "m",
            "input": "hi",
            "tools": [{"type": "file_search"}],
            "tool_choice": "required",
        },
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    ),
    (
        "a string tool choice passes",
        {"model": "m", "input": "hi", "tools": [FN_TOOL], "tool_choice": "none"},
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [CHAT_FN_TOOL],
            "tool_choice": "none",
        },
    ),
]


@pytest.mark.parametrize(
    ("body", "expected"), [c[1:] for c in REQUESTS], ids=[c[0] for c in REQUESTS]
)
def test_a_request_translates_to_chat(body: dict[str, Any], expected: dict[str, Any]) -> None:
    assert to_chat(body) == expected


def test_history_comes_between_the_instructions_and_the_input() -> None:
    history = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}]
    assert to_chat({"model": "m", "instructions": "sys", "input": "q2"}, history) == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "a1"},
            {"role": "user", "content": "q2"},
        ],
    }


# (case, Responses request, the 400's param)
BAD_REQUESTS: list[tuple[str, dict[str, Any], str]] = [
    ("no input at all", {"model": "m"}, "input"),
    ("instructions only is still no input", {"model": "m", "instructions": ""}, "input"),
    (
        "a nameless function tool",
        {"model": "m", "input": "x", "tools": [{"type": "function"}]},
        "tools",
    ),
    ("an unknown tool type", {"model": "m", "input": "x", "tools": [{"type": "custom"}]}, "tools"),
    ("a tool not an object", {"model": "m", "input": "x", "tools": ["get"]}, "tools"),
    (
        "a tool choice of another kind",
        {"model": "m", "input": "x", "tools": [FN_TOOL], "tool_choice": {"type": "mcp"}},
        "tool_choice",
    ),
]


@pytest.mark.parametrize(
    ("body", "param"), [c[1:] for c in BAD_REQUESTS], ids=[c[0] for c in BAD_REQUESTS]
)
def test_a_malformed_request_is_a_bad_request(body: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as e:
        to_chat(body)
    assert (e.value.param, e.value.status) == (param, 400)


BODY = {"model": "m", "input": "hi", "instructions": "sys", "max_output_tokens": 9, "user": "u"}


def test_the_envelope_echoes_the_request() -> None:
    assert envelope(BODY, "resp_1", 100.0) == {
        "id": "resp_1",
        "object": "response",
        "created_at": 100.0,
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": "sys",
        "max_output_tokens": 9,
        "model": "m",
        "output": [],
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": None,
        "store": True,
        "temperature": None,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": None,
        "truncation": "disabled",
        "usage": None,
        "user": "u",
        "metadata": {},
    }


def _chat(
    message: dict[str, Any], finish: str | None, usage: dict[str, Any] | None
) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage}


# (case, chat.completion, output items without their ids, status, incomplete_details, usage)
ANSWERS: list[tuple[str, dict[str, Any], list[dict[str, Any]], str, Any, Any]] = [
    (
        "text, stop",
        _chat(
            {"role": "assistant", "content": "hello"},
            "stop",
            {"prompt_tokens": 4, "completion_tokens": 2},
        ),
        [
            {
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "hello", "annotations": []}],
            }
        ],
        "completed",
        None,
        {
            "input_tokens": 4,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 2,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 6,
        },
    ),
    (
        "length: incomplete",
        _chat({"role": "assistant", "content": "hel"}, "length", None),
        [
            {
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "hel", "annotations": []}],
            }
        ],
        "incomplete",
        {"reason": "max_output_tokens"},
        None,
    ),
    (
        "content filter: incomplete",
        _chat({"role": "assistant", "content": None}, "content_filter", {}),
        [],
        "incomplete",
        {"reason": "max_output_tokens"},
        None,
    ),
    (
        "tool calls",
        _chat(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [_call("c1", "get", '{"k":1}'), _call("c2", "ls", "")],
            },
            "tool_calls",
            {"prompt_tokens": 1},
        ),
        [
            {
                "type": "function_call",
                "status": "completed",
                "call_id": "c1",
                "name": "get",
                "arguments": '{"k":1}',
            },
            {
                "type": "function_call",
                "status": "completed",
                "call_id": "c2",
                "name": "ls",
                "arguments": "",
            },
        ],
        "completed",
        None,
        {
            "input_tokens": 1,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 1,
        },
    ),
    ("no choices", {"choices": []}, [], "completed", None, None),
]


def _without_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in item.items() if k != "id"} for item in items]


@pytest.mark.parametrize(
    ("chat", "output", "status", "incomplete", "usage"),
    [c[1:] for c in ANSWERS],
    ids=[c[0] for c in ANSWERS],
)
def test_a_chat_completion_translates_to_a_response(
    chat: dict[str, Any], output: list[dict[str, Any]], status: str, incomplete: Any, usage: Any
) -> None:
    got = from_chat(chat, BODY, "resp_1", 100.0)
    assert _without_ids(got["output"]) == output
    assert [item["id"][:3] for item in got["output"]] == [
        "msg" if item["type"] == "message" else "fc_" for item in output
    ]
    assert (got["status"], got["incomplete_details"], got["usage"]) == (status, incomplete, usage)
    assert (got["id"], got["created_at"], got["instructions"]) == ("resp_1", 100.0, "sys")


RESPONSE = {
    "output": [
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "checking", "annotations": []}],
        },
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "get", "arguments": "{}"},
    ]
}


def test_a_responses_output_continues_as_chat_messages() -> None:
    assert output_messages(RESPONSE) == [
        {"role": "assistant", "content": "checking", "tool_calls": [_call("c1", "get", "{}")]}
    ]


@pytest.mark.parametrize(
    ("response", "text"),
    [
        (RESPONSE, "checking"),
        ({"output": []}, ""),
        ({}, ""),
        (
            {
                "output": [
                    {"type": "message", "content": [{"type": "output_text", "text": "a"}]},
                    {"type": "message", "content": [{"type": "refusal", "refusal": "x"}]},
                    {"type": "message", "content": [{"type": "output_text", "text": "b"}]},
                ]
            },
            "ab",
        ),
    ],
)
def test_output_text(response: dict[str, Any], text: str) -> None:
    assert output_text(response) == text


def _delta(finish: str | None = None, **delta: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_the_stream_of_text_then_a_tool_call() -> None:
    t = StreamTranslator({"model": "m", "input": "hi"}, "resp_1")
    # copied as emitted: the route serializes each event at once, and the translator goes on
    # updating the message item it announced
    events = copy.deepcopy(t.start())
    for chunk in (
        _delta(role="assistant"),
        _delta(content="he"),
        _delta(content="llo"),
        _delta(tool_calls=[{"index": 0, "id": "c1", "function": {"name": "get", "arguments": ""}}]),
        _delta(tool_calls=[{"index": 0, "function": {"arguments": '{"k":'}}]),
        _delta(tool_calls=[{"index": 0, "function": {"arguments": "1}"}}]),
        _delta("tool_calls"),
    ):
        events += copy.deepcopy(t.chunk(chunk))
    chat = _chat(
        {"role": "assistant", "content": "hello", "tool_calls": [_call("c1", "get", '{"k":1}')]},
        "tool_calls",
        {"prompt_tokens": 2, "completion_tokens": 3},
    )
    final = t.final(chat)
    events += t.finish_events(final)

    assert t.finish == "tool_calls"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    msg_id, fc_id = (item["id"] for item in t.output)
    assert msg_id.startswith("msg_") and fc_id.startswith("fc_")
    shown = [
        {k: v for k, v in e.items() if k not in ("sequence_number", "response")} for e in events
    ]
    message_done = {
        "id": msg_id,
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "hello", "annotations": []}],
    }
    call_done = {
        "id": fc_id,
        "type": "function_call",
        "status": "completed",
        "call_id": "c1",
        "name": "get",
        "arguments": '{"k":1}',
    }
    assert shown == [
        *_text_streamed(msg_id),
        *_call_streamed(fc_id),
        *_both_done(msg_id, fc_id, message_done, call_done),
    ]
    assert events[0]["response"]["status"] == "in_progress"
    assert final["output"] == [message_done, call_done]
    assert final["status"] == "completed" and final["usage"]["total_tokens"] == 5
    assert events[-1]["response"] is final


def _text_streamed(msg_id: str) -> list[dict[str, Any]]:
    """The events of the stream above up to its text: the response created, the message item
    and its text part opened, the text's two deltas."""
    return [
        {"type": "response.created"},
        {"type": "response.in_progress"},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {
                "id": msg_id,
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            },
        },
        {
            "type": "response.content_part.added",
            "item_id": msg_id,
            "output_index": 0,
            "content_index": 0,
            "part": {"type": "output_text", "text": "", "annotations": []},
        },
        {
            "type": "response.output_text.delta",
            "item_id": msg_id,
            "output_index": 0,
            "content_index": 0,
            "delta": "he",
            "logprobs": [],
        },
        {
            "type": "response.output_text.delta",
            "item_id": msg_id,
            "output_index": 0,
            "content_index": 0,
            "delta": "llo",
            "logprobs": [],
        },
    ]


def _call_streamed(fc_id: str) -> list[dict[str, Any]]:
    """Then the function call item opened and its arguments' two deltas."""
    return [
        {
            "type": "response.output_item.added",
            "output_index": 1,
            "item": {
                "id": fc_id,
                "type": "function_call",
                "status": "in_progress",
                "call_id": "c1",
                "name": "get",
                "arguments": "",
            },
        },
        {
            "type": "response.function_call_arguments.delta",
            "item_id": fc_id,
            "output_index": 1,
            "delta": '{"k":',
        },
        {
            "type": "response.function_call_arguments.delta",
            "item_id": fc_id,
            "output_index": 1,
            "delta": "1}",
        },
    ]


def _both_done(
    msg_id: str, fc_id: str, message_done: dict[str, Any], call_done: dict[str, Any]
) -> list[dict[str, Any]]:
    """Then, at the end, each item closed in order (the text, its part, the message; the
    arguments, the call) and the response completed."""
    return [
        {
            "type": "response.output_text.done",
            "item_id": msg_id,
            "output_index": 0,
            "content_index": 0,
            "text": "hello",
            "logprobs": [],
        },
        {
            "type": "response.content_part.done",
            "item_id": msg_id,
            "output_index": 0,
            "content_index": 0,
            "part": {"type": "output_text", "text": "hello", "annotations": []},
        },
        {"type": "response.output_item.done", "output_index": 0, "item": message_done},
        {
            "type": "response.function_call_arguments.done",
            "item_id": fc_id,
            "output_index": 1,
            "arguments": '{"k":1}',
        },
        {"type": "response.output_item.done", "output_index": 1, "item": call_done},
        {"type": "response.completed"},
    ]


def test_a_stream_cut_by_length_ends_incomplete() -> None:
    t = StreamTranslator({"model": "m", "input": "hi"}, "resp_1")
    events = t.chunk(_delta(content="he"))
    events += t.chunk(_delta("length"))
    final = t.final(_chat({"role": "assistant", "content": "he"}, "length", None))
    events += t.finish_events(final)
    assert t.finish == "length"
    assert events[-1]["type"] == "response.incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}


def test_an_empty_stream_keeps_the_answers_items() -> None:
    t = StreamTranslator({"model": "m", "input": "hi"}, "resp_1")
    final = t.final(_chat({"role": "assistant", "content": None}, "stop", None))
    assert final["output"] == []
    assert [e["type"] for e in t.finish_events(final)] == ["response.completed"]
