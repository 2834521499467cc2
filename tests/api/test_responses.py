"""The OpenAI Responses API through the official openai SDK (`client.responses`), unchanged,
against Reef's app on the tiny model: plain and streamed responses with receipts, tools and
tool results as input items, `previous_response_id` continuing a conversation in its session,
retrieval, `store: false`, and errors in the API's own shape."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from reef import responses
from reef.cli.testing import InProcessReef
from tests.api.conftest import records_of

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]


def client(server: InProcessReef, scenario: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.base_url,
        api_key="unused",
        default_headers={"x-reef-scenario": scenario},
        max_retries=0,
    )


def test_create_answers_a_response_with_a_receipt(server: InProcessReef, scenario: str) -> None:
    raw = client(server, scenario).responses.with_raw_response.create(
        model="tiny",
        instructions="Be brief.",
        input="Say hello.",
        max_output_tokens=8,
        temperature=0,
    )
    receipt = raw.headers["x-reef-agent-record-id"]
    resp = raw.parse()
    assert resp.id == responses.response_id(receipt) and resp.object == "response"
    assert resp.status in ("completed", "incomplete") and resp.model == "tiny"
    assert resp.output[0].type == "message" and resp.output_text
    assert resp.usage is not None and 1 <= resp.usage.output_tokens <= 8
    (record,) = records_of(server, scenario)
    assert record["id"] == receipt and record["route"] == "responses"
    assert record["request"]["input"] == "Say hello."  # the client's body, as sent
    assert record["response"]["output"][0]["content"][0]["text"] == resp.output_text
    assert len(record["completion_token_ids"]) == resp.usage.output_tokens
    assert len(record["logprobs"]) == len(record["completion_token_ids"])
    # the engine saw the instructions as the system message
    assert record["prompt_token_ids"][:3] != []


def test_stream_emits_the_response_events(server: InProcessReef, scenario: str) -> None:
    api = client(server, scenario)
    with api.responses.with_streaming_response.create(
        model="tiny", input="Count to three.", max_output_tokens=6, temperature=0, stream=True
    ) as raw:
        receipt = raw.headers["x-reef-agent-record-id"]  # at stream start
        kinds, text, final = [], "", None
        for ev in raw.parse():
            kinds.append(ev.type)
            if ev.type == "response.output_text.delta":
                text += ev.delta
            if ev.type in ("response.completed", "response.incomplete"):
                final = ev.response
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:-1] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert final is not None and final.output_text == text and text
    assert final.id == responses.response_id(receipt)
    (record,) = records_of(server, scenario)
    assert record["stream"] is True and record["response"]["id"] == final.id
    # retrievable as it was answered
    got = api.responses.retrieve(final.id)
    assert got.output_text == text and got.id == final.id


def test_previous_response_id_continues_the_conversation(
    server: InProcessReef, scenario: str
) -> None:
    api = client(server, scenario)
    first = api.responses.create(model="tiny", input="My name is Ada.", max_output_tokens=4)
    second = api.responses.create(
        model="tiny",
        previous_response_id=first.id,
        input="What is my name?",
        max_output_tokens=4,
    )
    third = api.responses.create(
        model="tiny", previous_response_id=second.id, input="Again?", max_output_tokens=4
    )
    records = {r["id"]: r for r in records_of(server, scenario)}
    one, two, three = (records[responses.record_id_of(r.id) or ""] for r in (first, second, third))
    assert one["session_id"] == two["session_id"] == three["session_id"]
    assert [one["turn"], two["turn"], three["turn"]] == [0, 1, 2]
    assert three["parent_id"] == two["id"] and two["parent_id"] == one["id"]
    # the engine saw the whole conversation: each prompt extends the previous turn's tokens
    assert two["prompt_token_ids"][: len(one["prompt_token_ids"])] == one["prompt_token_ids"]
    assert len(three["prompt_token_ids"]) > len(two["prompt_token_ids"])


def test_tools_and_tool_results_round_trip(server: InProcessReef, scenario: str) -> None:
    api = client(server, scenario)
    resp = api.responses.create(
        model="tiny",
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="auto",
        parallel_tool_calls=True,
        reasoning={"effort": "low"},  # accepted; the engine has no reasoning
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city": "Paris"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21 C"},
        ],
        max_output_tokens=6,
    )
    assert resp.status in ("completed", "incomplete")
    (record,) = records_of(server, scenario)
    assert record["request"]["input"][1]["type"] == "function_call"  # kept as structured items
    # what the engine was given, in chat form: the call, then its result as a tool message
    chat = responses.to_chat(record["request"])
    assert chat["messages"][1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert chat["messages"][2] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "sunny, 21 C",
    }
    assert chat["tools"][0]["function"]["name"] == "get_weather"


def test_store_false_is_not_retrievable(server: InProcessReef, scenario: str) -> None:
    api = client(server, scenario)
    resp = api.responses.create(model="tiny", input="hi", store=False, max_output_tokens=2)
    assert len(records_of(server, scenario)) == 1  # recorded: that is its receipt
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(resp.id)
    with pytest.raises(openai.NotFoundError):
        api.responses.create(
            model="tiny", previous_response_id=resp.id, input="and?", max_output_tokens=2
        )


def test_errors_in_the_api_shape(server: InProcessReef, scenario: str) -> None:
    api = client(server, scenario)
    with pytest.raises(openai.BadRequestError) as e:
        api.responses.create(
            model="tiny",
            input="search",
            tools=[{"type": "computer_use_preview"}, {"type": "mystery"}],  # type: ignore[list-item]
            max_output_tokens=2,
        )
    assert e.value.body["param"] == "tools" and "mystery" in e.value.body["message"]  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve("resp_nope")
    r = httpx.post(
        f"{server.base_url}/responses",
        json={"model": "tiny", "input": "x", "max_output_tokens": 0},
        headers={"x-reef-scenario": scenario},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_output_tokens"
    r = httpx.post(  # bounded work: as many input items as a chat may have messages
        f"{server.base_url}/responses",
        json={"model": "tiny", "input": ["a"] * 1025, "max_output_tokens": 1},
        headers={"x-reef-scenario": scenario},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"


def test_an_idempotent_retry_replays_the_stream(server: InProcessReef, scenario: str) -> None:
    headers = {"x-reef-scenario": scenario, "idempotency-key": f"k-{scenario}"}
    body = {"model": "tiny", "input": "hi", "max_output_tokens": 3, "stream": True}

    def stream() -> tuple[list[str], dict[str, Any], str]:
        kinds: list[str] = []
        with httpx.stream("POST", f"{server.base_url}/responses", json=body, headers=headers) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    data = json.loads(line.removeprefix("data: "))
                    if not kinds or kinds[-1] != data["type"]:  # deltas may be cut otherwise
                        kinds.append(data["type"])
            return kinds, data["response"], r.headers["x-reef-agent-record-id"]

    first, second = stream(), stream()
    assert first == second  # the same events, the same final response, the same receipt
    assert len(records_of(server, scenario)) == 1


def test_tools_in_chat_form() -> None:
    """Function tools in OpenAI's key order, namespaces flattened, hosted tools left out."""
    fn = {"type": "function", "name": "f", "parameters": {"type": "object"}, "description": "d"}
    ns = {"type": "namespace", "name": "agents", "tools": [{**fn, "name": "spawn"}]}
    chat = responses.to_chat(
        {
            "model": "m",
            "input": "x",
            "tools": [fn, ns, {"type": "web_search"}],
            "tool_choice": "auto",
        }
    )
    assert [list(t["function"]) for t in chat["tools"]] == [
        ["name", "description", "parameters"]
    ] * 2
    assert [t["function"]["name"] for t in chat["tools"]] == ["f", "spawn"]
    only_hosted = responses.to_chat({"model": "m", "input": "x", "tools": [{"type": "web_search"}]})
    assert "tools" not in only_hosted and "tool_choice" not in only_hosted


def test_a_conversation_chain_is_read_back_a_bounded_number_of_hops(
    server: InProcessReef, scenario: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each `previous_response_id` hop is a record read: a chain longer than MAX_CHAIN is
    refused (send the input instead) rather than read back on every call. The bound is
    lowered to 8 here (the server runs in this process): 129 calls each reading back its
    whole chain took 11 s of the suite."""
    from reef.api.routes import responses as route

    assert route.MAX_CHAIN <= 128
    monkeypatch.setattr(route, "MAX_CHAIN", 8)
    MAX_CHAIN = route.MAX_CHAIN
    api = client(server, scenario)
    previous = None
    for _ in range(MAX_CHAIN + 1):  # the last one continues a chain of MAX_CHAIN
        previous = api.responses.create(
            model="tiny", input="x", max_output_tokens=1, previous_response_id=previous
        ).id
    with pytest.raises(openai.BadRequestError) as e:
        api.responses.create(model="tiny", input="x", previous_response_id=previous)
    assert e.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert f"longer than {MAX_CHAIN} responses" in e.value.message
