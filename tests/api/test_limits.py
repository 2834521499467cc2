"""Bounded work per request: caps on what one call may ask of the engine, a default
max_tokens for engines that would otherwise generate to the end of the context, and vLLM's
sampling extensions passed through only when the operator lists them.

The server under test forwards to bench/echo_upstream.py (a real OpenAI-compatible server),
so that every cap is Reef's own: nothing here relies on an engine refusing the request.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from reef.cli.testing import InProcessReef
from tests.api.conftest import records_of
from tests.reefserver import EchoUpstream

CAP = 512  # server.max_tokens_cap of the servers below


@pytest.fixture(scope="module")
def echo() -> Iterator[EchoUpstream]:
    with EchoUpstream("--model", "echo") as upstream:
        yield upstream


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory, echo: EchoUpstream) -> Iterator[InProcessReef]:
    """Reef in front of the echo upstream, every limit at its default; the configured default
    max_tokens is above the cap on purpose."""
    state: Path = tmp_path_factory.mktemp("limits")
    (state / "serve.yaml").write_text(
        f"server:\n  max_tokens_cap: {CAP}\nengine:\n  default_max_tokens: 9999\n"
    )
    with InProcessReef(
        state,
        config=state / "serve.yaml",
        engine={"kind": "upstream", "upstream": {"url": echo.base_url}},
    ) as srv:
        yield srv


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": "echo", "messages": [{"role": "user", "content": "one two three"}], **extra}


def _tool(i: int) -> dict[str, Any]:
    return {"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}}


def _post(
    srv: InProcessReef, scenario: str, body: dict[str, Any], route: str = "/v1/chat/completions"
) -> httpx.Response:
    return httpx.post(
        f"{srv.url}{route}", json=body, headers={"x-reef-scenario": scenario}, timeout=60
    )


def _many_messages(count: int) -> list[dict[str, str]]:
    roles = ("user", "assistant")
    return [{"role": roles[i % 2], "content": f"m{i}"} for i in range(count - 1)] + [
        {"role": "user", "content": "last"}
    ]


OVER_OPENAI = {
    "n": ({"n": 5}, "n"),
    "stop-count": ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    "stop-length": ({"stop": "x" * 257}, "stop"),
    "messages": ({"messages": _many_messages(1025)}, "messages"),
    "tools": ({"tools": [_tool(i) for i in range(129)]}, "tools"),
    # max_completion_tokens wins for vLLM and Reef, but another upstream may read max_tokens:
    # both are capped.
    "max_tokens-beside-max_completion_tokens": (
        {"max_completion_tokens": 8, "max_tokens": CAP + 1},
        "max_tokens",
    ),
}


@pytest.mark.parametrize("case", OVER_OPENAI)
def test_openai_request_over_a_cap_is_400_naming_the_param(
    front: InProcessReef, scenario: str, case: str
) -> None:
    extra, param = OVER_OPENAI[case]
    r = _post(front, scenario, _chat(**extra))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert param in error["message"]
    assert records_of(front, scenario) == []


def test_openai_request_at_the_caps_is_served(front: InProcessReef, scenario: str) -> None:
    body = _chat(
        n=4,
        stop=["q" * 256, "r", "s", "t"],
        tools=[_tool(i) for i in range(128)],
        messages=_many_messages(1024),
        max_tokens=CAP,
    )
    r = _post(front, scenario, body)
    assert r.status_code == 200, r.text


OVER_ANTHROPIC = {
    "stop-count": ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
    "stop-length": ({"stop_sequences": ["x" * 257]}, "stop_sequences"),
    "messages": ({"messages": _many_messages(1025)}, "messages"),
    "tools": (
        {"tools": [{"name": f"f{i}", "input_schema": {"type": "object"}} for i in range(129)]},
        "tools",
    ),
}


@pytest.mark.parametrize("case", OVER_ANTHROPIC)
def test_anthropic_request_over_a_cap_is_400_naming_the_param(
    front: InProcessReef, scenario: str, case: str
) -> None:
    extra, param = OVER_ANTHROPIC[case]
    body = {
        "model": "echo",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
        **extra,
    }
    r = _post(front, scenario, body, "/v1/messages")
    assert r.status_code == 400, r.text
    payload = r.json()
    assert payload["type"] == "error"  # the Anthropic SDK's shape as well
    assert payload["error"]["param"] == param
    assert records_of(front, scenario) == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("ignore_eos", True),
        ("min_tokens", 100),
        ("prompt_logprobs", 20),
        ("repetition_penalty", 1.3),
    ],
)
def test_vllm_extensions_are_refused_unless_listed(
    front: InProcessReef, scenario: str, field: str, value: Any
) -> None:
    r = _post(front, scenario, _chat(**{field: value}))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field
    assert "engine.passthrough_extensions" in error["message"]


def test_fields_reef_does_not_gate_still_pass_through(front: InProcessReef, scenario: str) -> None:
    # Standard OpenAI fields and fields no engine Reef knows of reach the upstream unchanged
    # (here the echo server's own control field); so does vLLM's return_token_ids, which Reef
    # itself honours, and top_k, which Reef's Anthropic route translates.
    body = _chat(
        user="u-1", top_k=5, return_token_ids=True, echo_upstream={"reflect": True}, max_tokens=3
    )
    r = _post(front, scenario, body)
    assert r.status_code == 200, r.text
    sent = r.json()["echo_request"]["body"]
    assert (sent["user"], sent["top_k"], sent["return_token_ids"]) == ("u-1", 5, True)


def test_listed_extension_passes_through(tmp_path: Path, echo: EchoUpstream, scenario: str) -> None:
    (tmp_path / "serve.yaml").write_text("engine:\n  passthrough_extensions: [min_tokens]\n")
    with InProcessReef(
        tmp_path,
        config=tmp_path / "serve.yaml",
        engine={"kind": "upstream", "upstream": {"url": echo.base_url}},
    ) as srv:
        r = _post(srv, scenario, _chat(min_tokens=2, echo_upstream={"reflect": True}))
        assert r.status_code == 200, r.text
        assert r.json()["echo_request"]["body"]["min_tokens"] == 2
        refused = _post(srv, scenario, _chat(ignore_eos=True))
        assert refused.status_code == 400
        assert refused.json()["error"]["param"] == "ignore_eos"


def test_default_max_tokens_is_sent_upstream_within_the_cap(
    front: InProcessReef, scenario: str
) -> None:
    reflect = {"echo_upstream": {"reflect": True}}
    r = _post(front, scenario, _chat(**reflect))
    assert r.status_code == 200, r.text
    sent = r.json()["echo_request"]["body"]
    # engine.default_max_tokens (9999) held to server.max_tokens_cap
    assert sent["max_completion_tokens"] == CAP
    assert "max_tokens" not in sent
    # The record keeps the request as the client sent it.
    (record,) = records_of(front, scenario)
    assert "max_completion_tokens" not in record["request"]

    for asked in ({"max_tokens": 2}, {"max_completion_tokens": 3}):
        sent = _post(front, scenario, _chat(**asked, **reflect)).json()["echo_request"]["body"]
        assert {k: sent.get(k) for k in ("max_tokens", "max_completion_tokens")} == {
            "max_tokens": None,
            "max_completion_tokens": None,
            **asked,
        }
