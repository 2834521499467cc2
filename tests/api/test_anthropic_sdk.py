"""The official anthropic SDK, unchanged, against Reef's app on the tiny model."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from reef.cli.testing import InProcessReef
from tests.api.conftest import records_of


def client(server: InProcessReef, scenario: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.url, api_key="unused", default_headers={"x-reef-scenario": scenario}
    )


def test_messages_create_with_receipt(server: InProcessReef, scenario: str) -> None:
    raw = client(server, scenario).messages.with_raw_response.create(
        model="tiny",
        max_tokens=8,
        system="Be brief.",
        messages=[{"role": "user", "content": "Say hello."}],
        extra_body={"temperature": 0},  # this SDK version no longer types sampling knobs
    )
    receipt = raw.headers["x-reef-agent-record-id"]
    message = raw.parse()
    assert message.role == "assistant"
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert 1 <= message.usage.output_tokens <= 8
    record = httpx.get(f"{server.url}/reef/scenarios/{scenario}/records/{receipt}").json()
    assert record["route"] == "messages"
    assert record["request"]["system"] == "Be brief."
    assert record["response"]["id"] == message.id
    text = "".join(b.text for b in message.content if b.type == "text")
    assert record["response"]["content"] == ([{"type": "text", "text": text}] if text else [])
    assert len(record["completion_token_ids"]) == message.usage.output_tokens


def test_messages_stream_matches_plain_and_is_recorded(
    server: InProcessReef, scenario: str
) -> None:
    c = client(server, scenario)
    kwargs = dict(
        model="tiny",
        max_tokens=10,
        messages=[{"role": "user", "content": "Count."}],
        extra_body={"temperature": 0.0},
    )
    with c.messages.stream(**kwargs) as stream:  # type: ignore[arg-type]
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
        receipt = stream.response.headers["x-reef-agent-record-id"]
    plain = c.messages.create(**kwargs)  # type: ignore[arg-type]
    assert text == "".join(b.text for b in plain.content if b.type == "text")
    assert final.usage.output_tokens == plain.usage.output_tokens
    record = httpx.get(f"{server.url}/reef/scenarios/{scenario}/records/{receipt}").json()
    assert record["stream"] is True
    assert record["response"]["stop_reason"] == final.stop_reason


def test_missing_max_tokens_is_a_clear_400(server: InProcessReef, scenario: str) -> None:
    r = httpx.post(
        f"{server.url}/v1/messages",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-reef-scenario": scenario},
    )
    assert r.status_code == 400
    body = r.json()
    assert body["type"] == "error"
    assert "max_tokens" in body["error"]["message"]
    assert records_of(server, scenario) == []


def test_anthropic_sdk_sees_typed_error(server: InProcessReef, scenario: str) -> None:
    with pytest.raises(anthropic.NotFoundError):
        client(server, scenario).messages.create(
            model="claude-unknown", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
