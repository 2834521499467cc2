"""Idempotency-Key through the real SDKs: a retry gets the same record, receipt and answer."""

from __future__ import annotations

import threading
import uuid

import anthropic
import httpx
import openai

from reef.cli.testing import InProcessReef
from tests.api.conftest import records_of

MESSAGES = [{"role": "user", "content": "Say hello."}]


def _client(server: InProcessReef, scenario: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.base_url,
        api_key="unused",
        default_headers={"x-reef-scenario": scenario},
        max_retries=0,
    )


def _key() -> str:
    return f"key-{uuid.uuid4().hex}"


def test_retry_with_the_same_key_gets_the_same_record(server: InProcessReef, scenario: str) -> None:
    c = _client(server, scenario)
    key = _key()
    # temperature 1: a second engine run would (almost surely) answer differently.
    kwargs = {"model": "tiny", "messages": MESSAGES, "max_tokens": 12, "temperature": 1.0}
    first = c.chat.completions.with_raw_response.create(
        **kwargs, extra_headers={"Idempotency-Key": key}
    )
    again = c.chat.completions.with_raw_response.create(
        **kwargs, extra_headers={"Idempotency-Key": key}
    )
    receipt = first.headers["x-reef-agent-record-id"]
    assert again.headers["x-reef-agent-record-id"] == receipt
    assert again.headers["x-reef-release-id"] == first.headers["x-reef-release-id"]
    assert "x-reef-idempotent-replay" not in first.headers
    assert again.headers["x-reef-idempotent-replay"] == "true"
    assert again.parse().model_dump() == first.parse().model_dump()
    assert [r["id"] for r in records_of(server, scenario)] == [receipt]

    metrics = httpx.get(f"{server.url}/metrics").text
    assert (
        f'reef_idempotent_replays_total{{route="chat.completions",scenario="{scenario}"}} 1.0'
        in metrics
    )


def test_stream_replay_parses_with_the_sdk(server: InProcessReef, scenario: str) -> None:
    c = _client(server, scenario)
    key = _key()
    kwargs = {
        "model": "tiny",
        "messages": MESSAGES,
        "max_tokens": 10,
        "temperature": 1.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "extra_headers": {"Idempotency-Key": key},
    }
    texts, receipts, usages = [], [], []
    for _ in range(2):
        with c.chat.completions.with_streaming_response.create(**kwargs) as raw:
            receipts.append(raw.headers["x-reef-agent-record-id"])
            chunks = list(raw.parse())
        texts.append("".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices))
        finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
        assert finish[-1] in ("stop", "length")
        usages.append(chunks[-1].usage.model_dump() if chunks[-1].usage else None)
    assert receipts[0] == receipts[1]
    assert texts[0] == texts[1]
    assert usages[0] == usages[1] and usages[0] is not None
    (record,) = records_of(server, scenario)
    assert record["id"] == receipts[0]
    assert record["response"]["choices"][0]["message"]["content"] == texts[0]


def test_same_key_with_a_different_body_conflicts(server: InProcessReef, scenario: str) -> None:
    c = _client(server, scenario)
    key = _key()
    c.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=4, extra_headers={"Idempotency-Key": key}
    )
    try:
        c.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=5, extra_headers={"Idempotency-Key": key}
        )
    except openai.ConflictError as e:
        assert e.status_code == 409
        assert e.code == "idempotency_key_reused"
    else:
        raise AssertionError("a reused key with another body must be refused")
    assert len(records_of(server, scenario)) == 1


def test_concurrent_identical_requests_make_one_record(
    server: InProcessReef, scenario: str
) -> None:
    key = _key()
    receipts: list[str] = []
    contents: list[str | None] = []
    barrier = threading.Barrier(6)

    def call() -> None:
        c = _client(server, scenario)
        barrier.wait()
        raw = c.chat.completions.with_raw_response.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=12,
            temperature=1.0,
            extra_headers={"Idempotency-Key": key},
        )
        receipts.append(raw.headers["x-reef-agent-record-id"])
        contents.append(raw.parse().choices[0].message.content)

    threads = [threading.Thread(target=call) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(receipts) == 6 and len(set(receipts)) == 1
    assert len(set(contents)) == 1
    assert [r["id"] for r in records_of(server, scenario)] == receipts[:1]


def test_key_is_scoped_per_scenario(server: InProcessReef) -> None:
    key = _key()
    one, two = f"t-{uuid.uuid4().hex[:12]}", f"t-{uuid.uuid4().hex[:12]}"
    a = _client(server, one).chat.completions.with_raw_response.create(
        model="tiny", messages=MESSAGES, max_tokens=4, extra_headers={"Idempotency-Key": key}
    )
    b = _client(server, two).chat.completions.with_raw_response.create(
        model="tiny", messages=MESSAGES, max_tokens=4, extra_headers={"Idempotency-Key": key}
    )
    assert a.headers["x-reef-agent-record-id"] != b.headers["x-reef-agent-record-id"]
    assert "x-reef-idempotent-replay" not in b.headers
    assert len(records_of(server, one)) == len(records_of(server, two)) == 1


def test_invalid_key_is_rejected(server: InProcessReef, scenario: str) -> None:
    r = httpx.post(
        f"{server.base_url}/chat/completions",
        headers={"x-reef-scenario": scenario, "Idempotency-Key": "k" * 256},
        json={"model": "tiny", "messages": MESSAGES},
    )
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_idempotency_key"


def test_anthropic_retry_and_stream_replay(server: InProcessReef, scenario: str) -> None:
    c = anthropic.Anthropic(
        base_url=server.url,
        api_key="unused",
        default_headers={"x-reef-scenario": scenario},
        max_retries=0,
    )
    kwargs = {
        "model": "tiny",
        "max_tokens": 8,
        "messages": MESSAGES,
        "extra_body": {"temperature": 1.0},
        "extra_headers": {"Idempotency-Key": _key()},
    }
    first = c.messages.with_raw_response.create(**kwargs)
    again = c.messages.with_raw_response.create(**kwargs)
    assert again.headers["x-reef-agent-record-id"] == first.headers["x-reef-agent-record-id"]
    assert again.headers["x-reef-idempotent-replay"] == "true"
    assert again.parse().model_dump() == first.parse().model_dump()

    stream_kwargs = {**kwargs, "extra_headers": {"Idempotency-Key": _key()}}
    finals = []
    for _ in range(2):
        with c.messages.stream(**stream_kwargs) as stream:
            finals.append(stream.get_final_message().model_dump())
    assert finals[0] == finals[1]
    assert len(records_of(server, scenario)) == 2
