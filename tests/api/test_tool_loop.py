"""An agent's tool loop through Reef on the embedded engine, with the official SDKs unchanged:
the tiny model taught to call `get_weather` (tests/toolmodel.py) answers with a call, which
Reef parses out of the model's `<tool_call>` text into OpenAI tool calls, Anthropic `tool_use`
blocks and Responses `function_call` items; the client runs the tool and sends the result
back; the model answers with text. Records keep the calls and results as structured items
(export's `tool_calls` column, the next turn's `tool` message) in one session."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from reef.cli.testing import InProcessReef
from tests.api.conftest import records_of
from tests.toolmodel import ANSWER, ASK, CALL, FUNCTION, RESULT, TOOLS, taught_model

MODEL = "tiny-tools"


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    # taught once per machine, next to the tiny model in the model cache
    taught = taught_model(Path.home() / ".cache" / "reef" / "models")
    model = tmp_path_factory.mktemp("taught") / MODEL  # served under this name
    model.symlink_to(taught, target_is_directory=True)
    with InProcessReef(
        tmp_path_factory.mktemp("reef-tools"),
        engine={"model": str(model), "default_max_tokens": 48},
    ) as srv:
        yield srv


def _openai(server: InProcessReef, scenario: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.base_url,
        api_key="unused",
        default_headers={"x-reef-scenario": scenario},
        max_retries=0,
    )


def test_chat_tool_loop(tool_server: InProcessReef, scenario: str) -> None:
    api = _openai(tool_server, scenario)
    messages: list[Any] = [{"role": "user", "content": ASK}]
    first = api.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=TOOLS,
        temperature=0,  # type: ignore[arg-type]
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == CALL["arguments"]  # type: ignore[union-attr]
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": RESULT},
    ]
    # streamed: the SDK assembles the answer's deltas
    with api.chat.completions.stream(
        model=MODEL,
        messages=messages,
        tools=TOOLS,  # type: ignore[arg-type]
        temperature=0,
    ) as stream:
        second = stream.get_final_completion()
    assert second.choices[0].message.content == ANSWER
    assert second.choices[0].finish_reason == "stop"

    one, two = sorted(records_of(tool_server, scenario), key=lambda r: r["turn"])
    assert one["response"]["choices"][0]["message"]["tool_calls"][0]["id"] == call.id
    assert two["request"]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": call.id,
        "content": RESULT,
    }
    assert two["parent_id"] == one["id"]
    assert two["session_id"] == one["session_id"]


def test_a_streamed_call_arrives_as_tool_call_deltas(
    tool_server: InProcessReef, scenario: str
) -> None:
    api = _openai(tool_server, scenario)
    with api.chat.completions.stream(
        model=MODEL,
        messages=[{"role": "user", "content": ASK}],
        tools=TOOLS,  # type: ignore[arg-type]
        temperature=0,
    ) as stream:
        done = stream.get_final_completion()
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    (record,) = records_of(tool_server, scenario)
    assert (
        record["stream"]
        and record["response"]["choices"][0]["message"]["tool_calls"][0]["id"] == call.id
    )


def test_responses_tool_loop(tool_server: InProcessReef, scenario: str) -> None:
    api = _openai(tool_server, scenario)
    tools: Any = [{"type": "function", **FUNCTION}]
    first = api.responses.create(model=MODEL, input=ASK, tools=tools, temperature=0)
    (item,) = first.output
    assert item.type == "function_call" and item.name == "get_weather"
    assert json.loads(item.arguments) == CALL["arguments"]
    output = [{"type": "function_call_output", "call_id": item.call_id, "output": RESULT}]
    events = api.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=output,  # type: ignore[arg-type]
        tools=tools,
        temperature=0,
        stream=True,
    )
    final = next(e for e in events if e.type == "response.completed").response
    assert final.output_text == ANSWER

    from reef.experience import completion_tool_calls
    from reef.records import Record

    one, two = sorted(records_of(tool_server, scenario), key=lambda r: r["turn"])
    assert two["session_id"] == one["session_id"]
    stored = Record(**{k: v for k, v in one.items() if k in Record.__dataclass_fields__})
    (call,) = completion_tool_calls(stored)
    assert call["id"] == item.call_id and call["function"]["name"] == "get_weather"


def test_anthropic_tool_loop(tool_server: InProcessReef, scenario: str) -> None:
    api = anthropic.Anthropic(
        base_url=tool_server.url,
        api_key="unused",
        default_headers={"x-reef-scenario": scenario},
        max_retries=0,
    )
    tools: Any = [
        {
            "name": FUNCTION["name"],
            "description": FUNCTION["description"],
            "input_schema": FUNCTION["parameters"],
        }
    ]
    messages: list[Any] = [{"role": "user", "content": ASK}]
    greedy: Any = {"temperature": 0}
    first = api.messages.create(
        model=MODEL, max_tokens=48, messages=messages, tools=tools, extra_body=greedy
    )
    assert first.stop_reason == "tool_use"
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.input == CALL["arguments"]
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": RESULT}],
        },
    ]
    with api.messages.stream(
        model=MODEL, max_tokens=48, messages=messages, tools=tools, extra_body=greedy
    ) as stream:
        second = stream.get_final_message()
    assert second.stop_reason == "end_turn"
    assert "".join(b.text for b in second.content if b.type == "text") == ANSWER


def test_export_sees_the_calls(tool_server: InProcessReef, scenario: str) -> None:
    api = _openai(tool_server, scenario)
    api.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": ASK}],
        tools=TOOLS,  # type: ignore[arg-type]
        temperature=0,
    )
    from reef.export import pages
    from reef.store.sql import open_store

    store = open_store(tool_server.settings.database_url)
    try:
        ((row,),) = list(pages(store, scenario))
    finally:
        store.close()
    (call,) = json.loads(row["tool_calls"])
    assert call["function"]["name"] == "get_weather"
