"""A stream cut before its end still leaves a record under the receipt its headers carried: the
client closing it early (the official openai and anthropic SDKs), or the engine failing in the
middle (bench/echo_upstream.py dropping its stream). The record holds what was streamed so far
and says it is incomplete (`reef.incomplete`); a report may quote it, and it is never trained
on; a retry with the same Idempotency-Key runs again rather than replaying the cut answer."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from reef.cli.testing import InProcessReef
from tests.reefserver import EchoUpstream

WORDS = " ".join(f"w{i}" for i in range(30))
MESSAGES = [{"role": "user", "content": WORDS}]
SLOW = {"echo_upstream": {"chunk_delay_s": 0.05}}


def _front(tmp: Path, *echo_args: str) -> Iterator[InProcessReef]:
    with EchoUpstream("--model", "echo", *echo_args) as echo:
        engine = {"kind": "upstream", "upstream": {"url": echo.base_url}}
        with InProcessReef(tmp, engine=engine) as srv:
            yield srv


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    yield from _front(tmp_path_factory.mktemp("cut-streams"))


@pytest.fixture(scope="module")
def slow_front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    """Every stream slow (Anthropic's wire format has no room to steer the echo upstream)."""
    yield from _front(tmp_path_factory.mktemp("cut-streams-slow"), "--chunk-delay-s", "0.05")


def _client(srv: InProcessReef, scenario: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=srv.base_url,
        api_key="none",
        max_retries=0,
        default_headers={"x-reef-scenario": scenario},
    )


def _record(srv: InProcessReef, scenario: str, receipt: str, wait_s: float = 10) -> Any:
    """The record under `receipt`, once there (a stream the client closed is noticed by the
    server a moment later)."""
    deadline = time.monotonic() + wait_s
    while True:
        r = httpx.get(f"{srv.url}/reef/scenarios/{scenario}/records/{receipt}")
        if r.status_code == 200 or time.monotonic() > deadline:
            assert r.status_code == 200, r.text
            return r.json()
        time.sleep(0.1)


def test_a_stream_the_client_closes_early_leaves_its_record(
    front: InProcessReef, scenario: str
) -> None:
    client = _client(front, scenario)
    with client.chat.completions.with_streaming_response.create(
        model="echo", messages=MESSAGES, stream=True, extra_body=SLOW
    ) as response:
        receipt = response.headers["x-reef-agent-record-id"]
        got = ""
        for n, chunk in enumerate(response.parse()):
            got += (chunk.choices[0].delta.content or "") if chunk.choices else ""
            if n == 3:
                break  # leaving the block closes the stream: the rest is never read
    record = _record(front, scenario, receipt)
    assert record["tags"]["reef.incomplete"] == "stream_closed"
    choice = record["response"]["choices"][0]
    content = choice["message"]["content"]
    # what the client read, and at most what the server had sent when it noticed: not all
    assert got and content.startswith(got) and len(content) < len(WORDS), (got, content)
    assert choice["finish_reason"] is None
    assert record["stream"] is True and record["request"]["messages"] == MESSAGES

    # the whole answer is served (and recorded whole) for the next call
    full = client.chat.completions.with_raw_response.create(model="echo", messages=MESSAGES)
    whole = _record(front, scenario, full.headers["x-reef-agent-record-id"])
    assert "reef.incomplete" not in whole["tags"]


def test_a_stream_the_engine_drops_leaves_its_record_before_the_error(
    front: InProcessReef, scenario: str
) -> None:
    client = _client(front, scenario)
    raw = client.chat.completions.with_raw_response.create(
        model="echo",
        messages=MESSAGES,
        stream=True,
        extra_body={"echo_upstream": {"die_after": 3, "chunk_delay_s": 0.02}},
    )
    receipt = raw.headers["x-reef-agent-record-id"]
    got, error = "", None
    try:
        for chunk in raw.parse():
            got += (chunk.choices[0].delta.content or "") if chunk.choices else ""
    except openai.APIError as e:
        error = e
    assert error is not None and got
    # stored before the error event was sent: there at once
    record = _record(front, scenario, receipt, wait_s=0)
    assert record["tags"]["reef.incomplete"] == "engine_error"
    assert record["response"]["choices"][0]["message"]["content"] == got

    # a report may quote the receipt (it names a stored exchange), and the cut answer is not
    # experience: the status counts it as dropped, never eligible
    r = httpx.post(
        f"{front.url}/reef/report",
        json={"references": [receipt], "score": 1.0},
        headers={"x-reef-scenario": scenario},
    )
    assert r.status_code == 201, r.text
    status = httpx.get(f"{front.url}/reef/scenarios/{scenario}/status").json()
    assert status["dropped"] == {"incomplete": 1} and status["eligible"] == 0, status


def test_a_retry_of_a_cut_stream_runs_again(front: InProcessReef, scenario: str) -> None:
    client = _client(front, scenario)
    key = {"Idempotency-Key": f"cut-{scenario}"}
    with client.chat.completions.with_streaming_response.create(
        model="echo", messages=MESSAGES, stream=True, extra_body=SLOW, extra_headers=key
    ) as response:
        cut = response.headers["x-reef-agent-record-id"]
        for n, _ in enumerate(response.parse()):
            if n == 2:
                break
    assert _record(front, scenario, cut)["tags"]["reef.incomplete"] == "stream_closed"
    again = client.chat.completions.with_raw_response.create(
        model="echo", messages=MESSAGES, extra_headers=key
    )
    retry = again.headers["x-reef-agent-record-id"]
    assert retry != cut and again.parse().choices[0].message.content == WORDS
    assert "reef.incomplete" not in _record(front, scenario, retry)["tags"]
    replayed = client.chat.completions.with_raw_response.create(
        model="echo", messages=MESSAGES, extra_headers=key
    )
    assert replayed.headers["x-reef-agent-record-id"] == retry  # the key now names the whole


def test_an_anthropic_stream_closed_early_leaves_its_record(
    slow_front: InProcessReef, scenario: str
) -> None:
    front = slow_front
    client = anthropic.Anthropic(
        base_url=front.url, api_key="none", default_headers={"x-reef-scenario": scenario}
    )
    with client.messages.with_streaming_response.create(
        model="echo", max_tokens=64, messages=MESSAGES, stream=True
    ) as response:
        receipt = response.headers["x-reef-agent-record-id"]
        for n, _ in enumerate(response.parse()):
            if n == 4:
                break
    record = _record(front, scenario, receipt)
    assert record["route"] == "messages" and record["response"]["stop_reason"] is None
    assert record["tags"]["reef.incomplete"] == "stream_closed"
    (block,) = record["response"]["content"]
    assert block["type"] == "text" and 0 < len(block["text"]) < len(WORDS)


def test_a_responses_stream_closed_early_leaves_its_record(
    slow_front: InProcessReef, scenario: str
) -> None:
    client = _client(slow_front, scenario)
    with client.responses.with_streaming_response.create(
        model="echo", input=WORDS, stream=True
    ) as response:
        receipt = response.headers["x-reef-agent-record-id"]
        for n, _ in enumerate(response.parse()):
            if n == 6:
                break
    record = _record(slow_front, scenario, receipt)
    assert record["route"] == "responses"
    assert record["tags"]["reef.incomplete"] == "stream_closed"
    assert record["response"]["status"] == "incomplete"


def test_a_retry_of_a_cut_turn_forks_the_conversation(front: InProcessReef, scenario: str) -> None:
    """The cut answer holds its turn of the session; the retry is a second answer to that
    turn, a fork (a new session naming the same parent), as any second answer is."""
    client = _client(front, scenario)
    first = client.chat.completions.with_raw_response.create(
        model="echo", messages=[{"role": "user", "content": "hello"}]
    )
    turn0 = _record(front, scenario, first.headers["x-reef-agent-record-id"])
    history: Any = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": first.parse().choices[0].message.content},
        {"role": "user", "content": WORDS},
    ]
    with client.chat.completions.with_streaming_response.create(
        model="echo", messages=history, stream=True, extra_body=SLOW
    ) as response:
        cut_id = response.headers["x-reef-agent-record-id"]
        for n, _ in enumerate(response.parse()):
            if n == 2:
                break
    cut = _record(front, scenario, cut_id)
    retried = client.chat.completions.with_raw_response.create(model="echo", messages=history)
    retry = _record(front, scenario, retried.headers["x-reef-agent-record-id"])
    assert (cut["session_id"], cut["turn"], cut["parent_id"]) == (
        turn0["session_id"],
        1,
        turn0["id"],
    )
    assert retry["parent_id"] == turn0["id"] and retry["turn"] == 1
    assert retry["session_id"] != turn0["session_id"]  # the fork
