"""reef.anthropic without a server: tables of Anthropic Messages bodies and the OpenAI chat
bodies they translate to, both ways, the stream's events, and the shapes that are a 400."""

from __future__ import annotations

from typing import Any

import pytest

from reef.anthropic import (
    StreamTranslator,
    assistant_message,
    from_openai,
    to_openai,
    to_openai_response,
)
from reef.errors import BadRequest


def _request(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "max_tokens": 16, "messages": list(messages), **extra}


USER_HI = {"role": "user", "content": "hi"}

# (case, Anthropic request, OpenAI chat request)
REQUESTS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "plain user turn",
        _request(USER_HI),
        {"model": "tiny", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
    ),
    (
        "system string",
        _request(USER_HI, system="be brief"),
        {
            "model": "tiny",
            "max_tokens": 16,
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi"},
            ],
        },
    ),
    (
        "system blocks joined",
        _request(USER_HI, system=[{"type": "text", "text": "be "}, {"type": "text", "text": "x"}]),
        {
            "model": "tiny",
            "max_tokens": 16,
            "messages": [{"role": "system", "content": "be x"}, {"role": "user", "content": "hi"}],
        },
    ),
    (
        "empty system left out",
        _request(USER_HI, system=""),
        {"model": "tiny", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
    ),
    (
        "text blocks joined into one string",
        _request(
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ),
        {"model": "tiny", "max_tokens": 16, "messages": [{"role": "user", "content": "ab"}]},
    ),
    (
        "base64 image and text stay parts",
        _request(
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/jpeg", "data": "QUJD"},
                    },
                ],
            }
        ),
        {
            "model": "tiny",
            "max_tokens": 16,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this?"},
                        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,QUJD"}},
                    ],
                }
            ],
        },
    ),
    (
        "url image",
        _request(
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": {"type": "url", "url": "https://x/cat.png"}}
                ],
            }
        ),
        {
            "model": "tiny",
            "max_tokens": 16,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "https://x/cat.png"}}],
                }
            ],
        },
    ),
    (
        "file-id image dropped",
        _request(
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "see"},
                    {"type": "image", "source": {"type": "file", "file_id": "f1"}},
                ],
            }
        ),
        {"model": "tiny", "max_tokens": 16, "messages": [{"role": "user", "content": "see"}]},
    ),
    (
        "tool use and tool result",
        _request(
            USER_HI,
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "checking"},
                    {"type": "tool_use", "id": "tu_1", "name": "get", "input": {"k": 1}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "tu_1",
                        "content": [{"type": "text", "text": "42"}],
                    },
                    {"type": "text", "text": "and?"},
                ],
            },
        ),
        {
            "model": "tiny",
            "max_tokens": 16,
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": "checking",
                    "tool_calls": [
                        {
                            "id": "tu_1",
                            "type": "function",
                            "function": {"name": "get", "arguments": '{"k":1}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "tu_1", "content": "42"},
                {"role": "user", "content": "and?"},
            ],
        },
    ),
    (
        "tool result alone, string content, no user message",
        _request(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "tu_2", "content": "ok"}],
            }
        ),
        {
            "model": "tiny",
            "max_tokens": 16,
            "messages": [{"role": "tool", "tool_call_id": "tu_2", "content": "ok"}],
        },
    ),
    (
        "assistant tool use only: content None",
        _request(
            USER_HI,
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "tu_3", "name": "ls", "input": {}}],
            },
        ),
        {
            "model": "tiny",
            "max_tokens": 16,
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "tu_3",
                            "type": "function",
                            "function": {"name": "ls", "arguments": "{}"},
                        }
                    ],
                },
            ],
        },
    ),
    (
        "assistant string",
        _request(USER_HI, {"role": "assistant", "content": "hello"}),
        {
            "model": "tiny",
            "max_tokens": 16,
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
            ],
        },
    ),
    (
        "sampling, stop sequences, stream",
        _request(
            USER_HI,
            temperature=0.5,
            top_p=0.9,
            top_k=5,
            stop_sequences=["END"],
            stream=True,
            metadata={"user_id": "u"},
        ),
        {
            "model": "tiny",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "hi"}],
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 5,
            "stop": ["END"],
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ),
    (
        "temperature 0 kept, empty stop sequences dropped",
        _request(USER_HI, temperature=0, stop_sequences=[], stream=False),
        {
            "model": "tiny",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "hi"}],
            "temperature": 0,
        },
    ),
    (
        "tools and a named tool choice",
        _request(
            USER_HI,
            tools=[
                {
                    "name": "get",
                    "description": "fetch",
                    "input_schema": {"type": "object", "properties": {"k": {"type": "integer"}}},
                },
                {"name": "bare"},
            ],
            tool_choice={"type": "tool", "name": "get"},
        ),
        {
            "model": "tiny",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "get",
                        "description": "fetch",
                        "parameters": {
                            "type": "object",
                            "properties": {"k": {"type": "integer"}},
                        },
                    },
                },
                {
                    "type": "function",
                    "function": {
                        "name": "bare",
                        "description": "",
                        "parameters": {"type": "object"},
                    },
                },
            ],
            "tool_choice": {"type": "function", "function": {"name": "get"}},
        },
    ),
]


@pytest.mark.parametrize(
    ("body", "expected"), [c[1:] for c in REQUESTS], ids=[c[0] for c in REQUESTS]
)
def test_a_request_translates_to_chat(body: dict[str, Any], expected: dict[str, Any]) -> None:
    assert to_openai(body) == expected


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "any"}, "required"),
        ({"type": "auto"}, "auto"),
        ({"type": "none"}, "none"),
        ({"type": "something-new"}, "auto"),
        ({"type": "tool", "name": "f"}, {"type": "function", "function": {"name": "f"}}),
    ],
)
def test_tool_choice_translates(choice: dict[str, Any], expected: Any) -> None:
    assert (
        to_openai(_request(USER_HI, tools=[{"name": "f"}], tool_choice=choice))["tool_choice"]
        == expected
    )


# (case, Anthropic request, the 400's param)
BAD_REQUESTS: list[tuple[str, dict[str, Any], str]] = [
    ("system neither string nor list", _request(USER_HI, system={"text": "x"}), "system"),
    ("system block not an object", _request(USER_HI, system=[1]), "system[0]"),
    (
        "text block's text not a string",
        _request({"role": "user", "content": [{"type": "text", "text": 3}]}),
        "messages[0].content[0].text",
    ),
    (
        "image source not an object",
        _request({"role": "user", "content": [{"type": "image", "source": "x"}]}),
        "messages[0].content[0].source",
    ),
    (
        "base64 image data not a string",
        _request(
            {
                "role": "user",
                "content": [{"type": "image", "source": {"type": "base64", "data": 1}}],
            }
        ),
        "messages[0].content[0].source",
    ),
    (
        "url image without a url",
        _request({"role": "user", "content": [{"type": "image", "source": {"type": "url"}}]}),
        "messages[0].content[0].source.url",
    ),
    (
        "tool result content a number",
        _request(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": 5}]}
        ),
        "messages[0].content[0].content",
    ),
    (
        "assistant text block not a string",
        _request(USER_HI, {"role": "assistant", "content": [{"type": "text", "text": None}]}),
        "messages[1].content[0].text",
    ),
]


@pytest.mark.parametrize(
    ("body", "param"), [c[1:] for c in BAD_REQUESTS], ids=[c[0] for c in BAD_REQUESTS]
)
def test_a_malformed_request_is_a_bad_request(body: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as e:
        to_openai(body)
    assert (e.value.param, e.value.code, e.value.status) == (param, "invalid_value", 400)


def _chat(
    message: dict[str, Any], finish: str | None, usage: dict[str, Any] | None
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }
    if usage is not None:
        out["usage"] = usage
    return out


# (case, OpenAI chat.completion, Anthropic content, stop_reason, usage)
RESPONSES: list[tuple[str, dict[str, Any], list[dict[str, Any]], str, dict[str, int]]] = [
    (
        "text, stop",
        _chat(
            {"role": "assistant", "content": "hello"},
            "stop",
            {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9},
        ),
        [{"type": "text", "text": "hello"}],
        "end_turn",
        {"input_tokens": 7, "output_tokens": 2},
    ),
    (
        "length",
        _chat({"role": "assistant", "content": "hel"}, "length", {"prompt_tokens": 1}),
        [{"type": "text", "text": "hel"}],
        "max_tokens",
        {"input_tokens": 1, "output_tokens": 0},
    ),
    (
        "tool calls, no text, no usage",
        _chat(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get", "arguments": '{"k": 1}'},
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "ls", "arguments": ""},
                    },
                    {
                        "id": "call_3",
                        "type": "function",
                        "function": {"name": "bad", "arguments": "{not json"},
                    },
                ],
            },
            "tool_calls",
            None,
        ),
        [
            {"type": "tool_use", "id": "call_1", "name": "get", "input": {"k": 1}},
            {"type": "tool_use", "id": "call_2", "name": "ls", "input": {}},
            {"type": "tool_use", "id": "call_3", "name": "bad", "input": {"_raw": "{not json"}},
        ],
        "tool_use",
        {"input_tokens": 0, "output_tokens": 0},
    ),
    (
        "no finish reason reads as end_turn",
        _chat({"role": "assistant", "content": "x"}, None, None),
        [{"type": "text", "text": "x"}],
        "end_turn",
        {"input_tokens": 0, "output_tokens": 0},
    ),
    (
        "unknown finish reason reads as end_turn",
        _chat({"role": "assistant", "content": ""}, "content_filter", None),
        [],
        "end_turn",
        {"input_tokens": 0, "output_tokens": 0},
    ),
]


@pytest.mark.parametrize(
    ("chat", "content", "stop_reason", "usage"),
    [c[1:] for c in RESPONSES],
    ids=[c[0] for c in RESPONSES],
)
def test_a_chat_completion_translates_to_a_message(
    chat: dict[str, Any], content: list[dict[str, Any]], stop_reason: str, usage: dict[str, int]
) -> None:
    assert from_openai(chat, "claude-x", "msg_1") == {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage,
    }


def test_a_tool_call_without_an_id_gets_one() -> None:
    chat = _chat(
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
        "tool_calls",
        None,
    )
    (block,) = from_openai(chat, "m", "msg_1")["content"]
    assert block["id"].startswith("toolu_") and len(block["id"]) == len("toolu_") + 16


MESSAGE_WITH_TOOL = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "m",
    "content": [
        {"type": "text", "text": "let me look"},
        {"type": "tool_use", "id": "tu_1", "name": "get", "input": {"k": 1}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 5, "output_tokens": 3},
}


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            MESSAGE_WITH_TOOL,
            {
                "role": "assistant",
                "content": "let me look",
                "tool_calls": [
                    {
                        "id": "tu_1",
                        "type": "function",
                        "function": {"name": "get", "arguments": '{"k":1}'},
                    }
                ],
            },
        ),
        ({"content": [{"type": "text", "text": "ok"}]}, {"role": "assistant", "content": "ok"}),
        ({"content": []}, {"role": "assistant", "content": None}),
        ({}, {"role": "assistant", "content": None}),
    ],
)
def test_a_message_sent_back_is_the_assistant_turn(
    message: dict[str, Any], expected: dict[str, Any]
) -> None:
    assert assistant_message(message) == expected


@pytest.mark.parametrize(
    ("stop_reason", "finish"),
    [("end_turn", "stop"), ("max_tokens", "length"), ("tool_use", "tool_calls"), (None, "stop")],
)
def test_a_message_translates_back_to_a_chat_completion(
    stop_reason: str | None, finish: str
) -> None:
    message = {**MESSAGE_WITH_TOOL, "stop_reason": stop_reason}
    assert to_openai_response(message) == {
        "id": "msg_1",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "let me look",
                    "tool_calls": [
                        {
                            "id": "tu_1",
                            "type": "function",
                            "function": {"name": "get", "arguments": '{"k":1}'},
                        }
                    ],
                },
                "finish_reason": finish,
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3},
    }


def _delta(**delta: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta}]}


def test_the_stream_of_text_then_a_tool_call() -> None:
    t = StreamTranslator("m", "msg_1")
    events = t.start()
    for chunk in (
        _delta(role="assistant"),
        _delta(content="he"),
        _delta(content="llo"),
        _delta(tool_calls=[{"index": 0, "id": "call_1", "function": {"name": "get"}}]),
        _delta(tool_calls=[{"index": 0, "function": {"arguments": '{"k":'}}]),
        _delta(tool_calls=[{"index": 0, "function": {"arguments": "1}"}}]),
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}},
    ):
        events += t.chunk(chunk)
    events += t.finish(
        {"stop_reason": "tool_use", "usage": {"input_tokens": 3, "output_tokens": 4}}
    )
    events.append(t.stop())

    def delta(index: int, d: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})

    assert events == [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "m",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 0, "output_tokens": 0},
                },
            },
        ),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        delta(0, {"type": "text_delta", "text": "he"}),
        delta(0, {"type": "text_delta", "text": "llo"}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "tool_use", "id": "call_1", "name": "get", "input": {}},
            },
        ),
        delta(1, {"type": "input_json_delta", "partial_json": '{"k":'}),
        delta(1, {"type": "input_json_delta", "partial_json": "1}"}),
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {"input_tokens": 3, "output_tokens": 4},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


def test_parallel_tool_calls_stream_as_separate_blocks() -> None:
    t = StreamTranslator("m", "msg_1")
    events = t.chunk(
        _delta(
            tool_calls=[
                {"index": 0, "id": "a", "function": {"name": "f", "arguments": "{}"}},
                {"index": 1, "id": "b", "function": {"name": "g", "arguments": "{}"}},
            ]
        )
    )
    events += t.finish({"stop_reason": "tool_use", "usage": {}})
    assert [(name, data.get("index")) for name, data in events] == [
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
        ("message_delta", None),
    ]
    assert [
        data["content_block"]["id"] for name, data in events if name == "content_block_start"
    ] == [
        "a",
        "b",
    ]


def test_an_empty_stream_finishes_with_no_block() -> None:
    t = StreamTranslator("m", "msg_1")
    assert t.chunk(_delta(content="")) == []
    assert t.finish({}) == [
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {},
            },
        )
    ]
