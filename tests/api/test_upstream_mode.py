"""The upstream engine (`reef serve --engine upstream`): Reef in front of another
OpenAI-compatible server.

The upstream is either a second Reef serving the tiny model (real generation, token ids
through vLLM's `return_token_ids` extension) or bench/echo_upstream.py, which fails on
request so the error paths can be driven over real HTTP.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from reef.cli.testing import InProcessReef
from reef.testing.process import ReefServer
from tests.api.conftest import records_of
from tests.reefserver import EchoUpstream


@pytest.fixture(scope="module")
def chained(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[InProcessReef, InProcessReef]]:
    """front (upstream engine, token capture on) → back (embedded tiny model)."""
    back_dir: Path = tmp_path_factory.mktemp("back")
    front_dir: Path = tmp_path_factory.mktemp("front")
    (front_dir / "serve.yaml").write_text("engine:\n  upstream:\n    capture_tokens: true\n")
    with InProcessReef(back_dir) as back:
        front = InProcessReef(
            front_dir,
            config=front_dir / "serve.yaml",
            engine={"kind": "upstream", "upstream": {"url": back.base_url}},
        )
        with front:
            yield front, back


def test_front_records_the_upstreams_tokens(
    chained: tuple[InProcessReef, InProcessReef], scenario: str
) -> None:
    front, back = chained
    c = openai.OpenAI(
        base_url=front.base_url, api_key="unused", default_headers={"x-reef-scenario": scenario}
    )
    raw = c.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=6, temperature=0
    )
    answer = raw.parse()
    assert answer.choices[0].logprobs is None  # the client did not ask; capture is Reef's business
    front_rec = httpx.get(
        f"{front.url}/reef/scenarios/{scenario}/records/{raw.headers['x-reef-agent-record-id']}"
    ).json()
    (back_rec,) = records_of(back, "default")[-1:]
    assert front_rec["completion_token_ids"] == back_rec["completion_token_ids"]
    assert front_rec["prompt_token_ids"] == back_rec["prompt_token_ids"]
    assert front_rec["logprobs"] == pytest.approx(back_rec["logprobs"], abs=1e-4)
    assert (
        front_rec["response"]["choices"][0]["message"]["content"]
        == answer.choices[0].message.content
    )


def test_front_streams_and_records(
    chained: tuple[InProcessReef, InProcessReef], scenario: str
) -> None:
    front, _ = chained
    c = openai.OpenAI(
        base_url=front.base_url, api_key="unused", default_headers={"x-reef-scenario": scenario}
    )
    with c.chat.completions.with_streaming_response.create(
        model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=6, stream=True
    ) as response:
        receipt = response.headers["x-reef-agent-record-id"]
        text = "".join(ch.choices[0].delta.content or "" for ch in response.parse() if ch.choices)
    record = httpx.get(f"{front.url}/reef/scenarios/{scenario}/records/{receipt}").json()
    assert record["response"]["choices"][0]["message"]["content"] == text
    assert 1 <= len(record["completion_token_ids"]) <= 6
    assert len(record["logprobs"]) == len(record["completion_token_ids"])


@pytest.fixture(scope="module")
def over_echo(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[InProcessReef, EchoUpstream]]:
    with EchoUpstream("--model", "echo") as echo:
        state: Path = tmp_path_factory.mktemp("over-echo")
        with InProcessReef(
            state, engine={"kind": "upstream", "upstream": {"url": echo.base_url}}
        ) as front:
            yield front, echo


def _chat(front: InProcessReef | ReefServer, scenario: str, **extra: object) -> httpx.Response:
    body = {"model": "echo", "messages": [{"role": "user", "content": "hi there"}], **extra}
    return httpx.post(
        f"{front.url}/v1/chat/completions", json=body, headers={"x-reef-scenario": scenario}
    )


def test_upstream_5xx_is_502_and_nothing_recorded(
    over_echo: tuple[InProcessReef, EchoUpstream], scenario: str
) -> None:
    front, _ = over_echo
    r = _chat(front, scenario, echo_upstream={"status": 500, "message": "GPU on fire"})
    assert r.status_code == 502
    assert r.json()["error"]["type"] == "upstream_error"
    assert "GPU on fire" in r.json()["error"]["message"]
    assert records_of(front, scenario) == []


def test_upstream_4xx_is_relayed(
    over_echo: tuple[InProcessReef, EchoUpstream], scenario: str
) -> None:
    front, _ = over_echo
    r = _chat(front, scenario, echo_upstream={"status": 422, "message": "bad tool schema"})
    assert r.status_code == 422
    assert "bad tool schema" in r.json()["error"]["message"]
    assert records_of(front, scenario) == []


def test_tools_and_response_format_pass_through(
    over_echo: tuple[InProcessReef, EchoUpstream], scenario: str
) -> None:
    front, _ = over_echo
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    fmt = {"type": "json_object"}
    r = _chat(
        front,
        scenario,
        tools=tools,
        response_format=fmt,
        echo_upstream={"reflect": True, "call_tool": True},
    )
    assert r.status_code == 200
    seen = r.json()["echo_request"]["body"]
    assert seen["tools"] == tools and seen["response_format"] == fmt
    assert r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "lookup"
    (record,) = records_of(front, scenario)
    assert (
        record["response"]["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "lookup"
    )


def test_unreachable_upstream_is_502(tmp_path: Path, scenario: str) -> None:
    """Through the `reef serve` command line (a subprocess: no torch to load with this engine),
    so its `--engine upstream --upstream-url --upstream-model` flags are what configure it."""
    with EchoUpstream("--model", "echo") as echo:
        front = ReefServer(
            tmp_path,
            "--engine",
            "upstream",
            "--upstream-url",
            echo.base_url,
            "--upstream-model",
            "echo",
        )
        front.start()
    try:  # the upstream is gone now
        r = _chat(front, scenario)
        assert r.status_code == 502
        assert r.json()["error"]["type"] == "upstream_error"
        deadline = time.monotonic() + 10  # the engine caches its readiness for a moment
        while httpx.get(f"{front.url}/readyz").status_code != 503:
            assert time.monotonic() < deadline, "readyz never noticed the upstream is gone"
            time.sleep(0.2)
        assert records_of(front, scenario) == []
    finally:
        front.stop()
