"""Overload degrades, never collapses: the engine's bounded line (reef.admission).

Reef in upstream mode in front of bench/echo_upstream.py, each call held by the upstream for
a while (`echo_upstream.delay_s`), with 2 running slots and a line of 2: more concurrent calls
than that are answered 429 (engine_busy, Retry-After, OpenAI's error JSON, Anthropic's on
/v1/messages) before anything starts, the admitted ones are answered and recorded, /readyz says
"busy" while the line is full and "ready" after. A second server refuses the call that waited
in line longer than engine.max_queue_wait_s.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from reef.cli.testing import InProcessReef
from tests.api.conftest import records_of
from tests.reefserver import EchoUpstream

HOLD_S = 2.0  # how long the upstream holds each admitted call


def _front(
    tmp: pytest.TempPathFactory, echo: EchoUpstream, name: str, **engine: object
) -> InProcessReef:
    state: Path = tmp.mktemp(name)
    return InProcessReef(
        state,
        engine={"kind": "upstream", "upstream": {"url": echo.base_url}, **engine},
    )


@pytest.fixture(scope="module")
def echo() -> Iterator[EchoUpstream]:
    with EchoUpstream("--model", "echo") as upstream:
        yield upstream


@pytest.fixture(scope="module")
def bounded(
    tmp_path_factory: pytest.TempPathFactory, echo: EchoUpstream
) -> Iterator[InProcessReef]:
    with _front(tmp_path_factory, echo, "bounded", max_running=2, max_queue=2) as front:
        yield front


def _slow_call(
    front: InProcessReef, scenario: str, hold_s: float = HOLD_S, key: str | None = None
) -> httpx.Response:
    body = {
        "model": "echo",
        "messages": [{"role": "user", "content": "take your time"}],
        "echo_upstream": {"delay_s": hold_s},
    }
    headers = {"x-reef-scenario": scenario}
    if key is not None:
        headers["Idempotency-Key"] = key
    return httpx.post(f"{front.url}/v1/chat/completions", json=body, headers=headers, timeout=60)


def _readiness(front: InProcessReef) -> tuple[int, dict]:
    r = httpx.get(f"{front.url}/readyz")
    return r.status_code, r.json()


def _wait_busy(front: InProcessReef) -> dict:
    deadline = time.monotonic() + HOLD_S
    while time.monotonic() < deadline:
        status, body = _readiness(front)
        if body["dependencies"]["engine"]["state"] == "busy":
            assert status == 200  # degraded, still serving
            return body
        time.sleep(0.02)
    pytest.fail(f"/readyz never said busy; last: {body}")


def _metric(front: InProcessReef, name: str) -> float:
    text = httpx.get(f"{front.url}/metrics").text
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert found is not None, f"{name} not in /metrics"
    return float(found.group(1))


def _assert_engine_busy(r: httpx.Response) -> None:
    assert r.status_code == 429, r.text
    assert int(r.headers["retry-after"]) >= 1
    error = r.json()["error"]
    assert error["type"] == "rate_limit_error"
    assert error["code"] == "engine_busy"
    assert "engine is busy" in error["message"]


def test_more_calls_than_slots_and_line_are_refused_fast(
    bounded: InProcessReef, scenario: str
) -> None:
    refused_before = _metric(bounded, 'reef_engine_refused_total{reason="queue_full"}')
    with ThreadPoolExecutor(8) as pool:
        started = time.monotonic()
        calls = [pool.submit(_slow_call, bounded, scenario) for _ in range(8)]
        answers = [c.result() for c in calls]
        took = time.monotonic() - started
    ok = [r for r in answers if r.status_code == 200]
    refused = [r for r in answers if r.status_code != 200]
    # 2 running + 2 waiting are served; the other 4 are refused at once, not after a wait
    assert len(ok) == 4, [r.status_code for r in answers]
    for r in refused:
        _assert_engine_busy(r)
        assert r.elapsed.total_seconds() < HOLD_S
    assert took >= 2 * HOLD_S * 0.9  # the line was served after the running pair, not beside
    # every acknowledged call has its record, and nothing else was recorded
    receipts = {r.headers["x-reef-agent-record-id"] for r in ok}
    assert {rec["id"] for rec in records_of(bounded, scenario)} == receipts
    refused_after = _metric(bounded, 'reef_engine_refused_total{reason="queue_full"}')
    assert refused_after - refused_before == 4
    assert _metric(bounded, "reef_engine_queue_depth") == 0
    assert _metric(bounded, "reef_engine_running") == 0


def test_busy_engine_refuses_every_route_in_its_own_shape_and_readiness_says_busy(
    bounded: InProcessReef, scenario: str
) -> None:
    status, body = _readiness(bounded)
    assert (status, body["status"], body["dependencies"]["engine"]["state"]) == (
        200,
        "ready",
        "ok",
    )
    headers = {"x-reef-scenario": scenario}
    oa = openai.OpenAI(
        base_url=bounded.base_url, api_key="unused", default_headers=headers, max_retries=0
    )
    an = anthropic.Anthropic(
        base_url=bounded.url, api_key="unused", default_headers=headers, max_retries=0
    )
    messages = [{"role": "user", "content": "hello"}]
    with ThreadPoolExecutor(4) as pool:
        held: list[Future[httpx.Response]] = [
            pool.submit(_slow_call, bounded, scenario) for _ in range(4)
        ]
        busy = _wait_busy(bounded)
        assert busy["status"] == "degraded"
        assert "2 of 2 waiting" in busy["dependencies"]["engine"]["reason"]
        assert _metric(bounded, "reef_engine_queue_depth") == 2
        with pytest.raises(openai.RateLimitError) as plain:
            oa.chat.completions.create(model="echo", messages=messages)  # type: ignore[arg-type]
        assert plain.value.code == "engine_busy"
        assert int(plain.value.response.headers["retry-after"]) >= 1
        # a stream is refused before it starts: a plain 429, no event stream
        with pytest.raises(openai.RateLimitError) as streamed:
            oa.chat.completions.create(model="echo", messages=messages, stream=True)  # type: ignore[arg-type]
        assert streamed.value.response.headers["content-type"].startswith("application/json")
        with pytest.raises(anthropic.RateLimitError) as anth:
            an.messages.create(model="echo", max_tokens=8, messages=messages)  # type: ignore[arg-type]
        assert anth.value.body["type"] == "error"  # type: ignore[index]
        assert anth.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
        assert "retry-after" in anth.value.response.headers
        answers = [c.result() for c in held]
    assert [r.status_code for r in answers] == [200] * 4
    receipts = {r.headers["x-reef-agent-record-id"] for r in answers}
    assert {rec["id"] for rec in records_of(bounded, scenario)} == receipts
    status, body = _readiness(bounded)
    assert (status, body["status"], body["dependencies"]["engine"]) == (
        200,
        "ready",
        {"state": "ok", "needed_to": "serve"},
    )


def test_a_call_that_waited_too_long_is_refused_not_run(
    tmp_path_factory: pytest.TempPathFactory, echo: EchoUpstream, scenario: str
) -> None:
    with (
        _front(
            tmp_path_factory, echo, "waits", max_running=1, max_queue=4, max_queue_wait_s=0.5
        ) as front,
        ThreadPoolExecutor(2) as pool,
    ):
        first = pool.submit(_slow_call, front, scenario)
        time.sleep(0.3)  # the first holds the only slot
        second = pool.submit(_slow_call, front, scenario, HOLD_S, "late-1")
        late, served = second.result(), first.result()
        assert served.status_code == 200
        _assert_engine_busy(late)
        assert "waited 0.5s" in late.json()["error"]["message"]
        assert 0.4 < late.elapsed.total_seconds() < HOLD_S  # refused at its deadline
        assert _metric(front, 'reef_engine_refused_total{reason="queue_wait"}') == 1
        (record,) = records_of(front, scenario)
        assert record["id"] == served.headers["x-reef-agent-record-id"]
        # the slot the refused call never took is free, and so is its Idempotency-Key: its
        # retry (the same body) is served at once, as a new answer, not a replay or a 409
        retried = _slow_call(front, scenario, HOLD_S, "late-1")
        assert retried.status_code == 200, retried.text
        assert retried.elapsed.total_seconds() < HOLD_S + 1.0
        assert "x-reef-idempotent-replay" not in retried.headers
        assert len(records_of(front, scenario)) == 2
        assert _metric(front, "reef_engine_running") == 0


def test_the_embedded_engine_is_given_its_batch_at_once(server: InProcessReef) -> None:
    """Default bounds: as many calls as the embedded engine decodes together run, 256 wait."""
    assert _metric(server, "reef_engine_max_running") == 8  # engine.embedded.max_batch_size
    assert _metric(server, "reef_engine_max_queue") == 256
