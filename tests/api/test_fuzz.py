"""No 5xx on valid input: request bodies generated from the OpenAI chat-completions and Anthropic
messages schemas (string and array content, tools, tool calls and results, images, stop strings,
odd values wherever a field is loosely typed), sent to a served Reef on the tiny model. What the
server cannot serve it answers with a clear 4xx; what it serves it records as sent. Plus the odd
shapes that once reached an AttributeError or TypeError, NUL characters on Postgres, and the
fallback for unexpected errors (it never echoes the exception's text)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reef.cli.testing import InProcessReef

FUZZ = settings(
    max_examples=60,
    deadline=None,
    database=None,  # no .hypothesis directory in the working tree
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def http(server: InProcessReef) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def _send(http: httpx.Client, route: str, body: Any, scenario: str) -> httpx.Response:
    return http.post(route, json=body, headers={"x-reef-scenario": scenario})


def _check(r: httpx.Response, body: Any, http: httpx.Client, scenario: str) -> None:
    """No 5xx, no server error inside a stream, every error OpenAI-style; a served body is
    recorded as it was sent."""
    assert r.status_code < 500, (r.status_code, r.text[:2000], body)
    if r.status_code >= 400:
        assert r.json()["error"]["message"], r.text
        return
    if r.headers["content-type"].startswith("text/event-stream"):
        assert '"server_error"' not in r.text and '"engine_error"' not in r.text, r.text[-2000:]
    receipt = r.headers["x-reef-agent-record-id"]
    record = http.get(f"/reef/scenarios/{scenario}/records/{receipt}")
    assert record.status_code == 200, record.text
    assert record.json()["request"] == body


# --- the shapes that reached an AttributeError or TypeError ------------------------------------

USER = {"role": "user", "content": "hi"}
ODD_CHAT = [
    [{"role": "assistant", "content": None, "tool_calls": [{"function": "x"}]}, USER],
    [USER, {"role": "assistant", "content": "", "tool_calls": [{"function": "x"}]}],
    [{"role": "assistant", "content": None, "function_call": "x"}, USER],
    [{"role": "assistant", "function_call": ["x", 1]}, USER],
    [
        {"role": "assistant", "tool_calls": [{"function": {"name": 5, "arguments": {"a": [1]}}}]},
        USER,
    ],
    [{"role": "assistant", "tool_calls": [{"id": 1, "function": None}, {}]}, USER],
    [{"role": "user", "content": [{"type": "text", "text": 5}, {"type": "text"}]}],
    [{"role": "tool", "content": [{"type": "text", "text": None}], "tool_call_id": "c"}, USER],
]
ODD_MESSAGES = [
    [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": ["a"]}]}],
    [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": 5}]}],
    [{"role": "user", "content": [{"type": "tool_result", "content": [{"type": "text"}, "x"]}]}],
    [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": 7, "content": None}]}],
    [{"role": "user", "content": [{"type": "image", "source": "https://x.example/a.png"}]}],
    [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}],
    [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": 5}}]}],
    [{"role": "user", "content": [{"type": "text", "text": 5}, {"type": "text", "text": "a"}]}],
    [{"role": "user", "content": [{"type": "text"}]}],
    [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": 1, "name": None}]},
        {"role": "user", "content": "again"},
    ],
]


@pytest.mark.parametrize("messages", ODD_CHAT)
def test_odd_chat_messages_are_not_500(
    http: httpx.Client, scenario: str, messages: list[dict[str, Any]]
) -> None:
    body = {"model": "tiny", "messages": messages, "max_tokens": 2}
    _check(_send(http, "/v1/chat/completions", body, scenario), body, http, scenario)
    streamed = {**body, "stream": True}
    _check(_send(http, "/v1/chat/completions", streamed, scenario), streamed, http, scenario)


@pytest.mark.parametrize("messages", ODD_MESSAGES)
def test_odd_anthropic_messages_are_not_500(
    http: httpx.Client, scenario: str, messages: list[dict[str, Any]]
) -> None:
    body = {"model": "tiny", "messages": messages, "max_tokens": 2}
    _check(_send(http, "/v1/messages", body, scenario), body, http, scenario)
    streamed = {**body, "stream": True}
    _check(_send(http, "/v1/messages", streamed, scenario), streamed, http, scenario)


# --- bodies generated from the schemas ---------------------------------------------------------

TEXT = st.text(max_size=12)
ODD = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)
OBJECT = st.dictionaries(TEXT, ODD, max_size=3)


def _maybe(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A dict with any subset of `fields`."""
    return st.fixed_dictionaries({}, optional=fields)


def _merged(*parts: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.tuples(*parts).map(lambda ds: {k: v for d in ds for k, v in d.items()})


# OpenAI chat completions
ARGUMENTS = TEXT | ODD.map(lambda v: orjson.dumps(v).decode()) | ODD
TOOL_CALL = (
    _merged(
        st.fixed_dictionaries({"function": _maybe(name=TEXT | ODD, arguments=ARGUMENTS)}),
        _maybe(id=TEXT | ODD, type=st.just("function") | ODD, index=ODD),
    )
    | st.fixed_dictionaries({"function": ODD})
    | OBJECT
)
CHAT_PART = (
    st.fixed_dictionaries({"type": st.just("text"), "text": TEXT | ODD})
    | st.fixed_dictionaries(
        {"type": st.just("image_url"), "image_url": st.fixed_dictionaries({"url": TEXT}) | ODD}
    )
    | st.fixed_dictionaries({"type": st.sampled_from(["input_audio", "file", "refusal"])})
    | OBJECT
)
CHAT_MESSAGE = _merged(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "function"])}
    ),
    _maybe(
        content=st.none() | TEXT | st.lists(CHAT_PART, max_size=3),
        name=TEXT,
        tool_calls=st.lists(TOOL_CALL, max_size=2),
        tool_call_id=TEXT,
        function_call=ODD,
        refusal=ODD,
    ),
)
CHAT_TOOL = (
    st.fixed_dictionaries(
        {
            "type": st.just("function"),
            "function": _merged(
                st.fixed_dictionaries({"name": TEXT}),
                _maybe(description=TEXT | ODD, parameters=OBJECT, strict=ODD),
            ),
        }
    )
    | OBJECT
)
CHAT_BODY = _merged(
    st.fixed_dictionaries(
        {
            "model": st.just("tiny"),
            "messages": st.lists(CHAT_MESSAGE, min_size=1, max_size=4),
            "max_tokens": st.integers(1, 3),
        }
    ),
    _maybe(
        stream=st.booleans(),
        temperature=st.floats(0, 2),
        top_p=st.floats(0.01, 1),
        stop=TEXT | st.lists(TEXT, max_size=4),
        seed=st.integers(-(2**63), 2**63 - 1),
        logprobs=st.booleans(),
        top_logprobs=st.integers(0, 20),
        tools=st.lists(CHAT_TOOL, max_size=2),
        tool_choice=st.sampled_from(["auto", "none", "required"]) | OBJECT,
        response_format=OBJECT,
        stream_options=_maybe(include_usage=st.booleans()) | OBJECT,
        user=TEXT,
        metadata=OBJECT,
        presence_penalty=ODD,
        logit_bias=OBJECT,
        parallel_tool_calls=ODD,
    ),
)

# Anthropic messages
SOURCE = (
    _merged(
        st.fixed_dictionaries({"type": st.just("base64")}),
        _maybe(media_type=TEXT | ODD, data=TEXT | ODD),
    )
    | st.fixed_dictionaries({"type": st.just("url"), "url": TEXT | ODD})
    | ODD
)
TEXT_BLOCK = _merged(
    st.fixed_dictionaries({"type": st.just("text")}), _maybe(text=TEXT | ODD, cache_control=ODD)
)
BLOCK = (
    TEXT_BLOCK
    | _merged(st.fixed_dictionaries({"type": st.just("image")}), _maybe(source=SOURCE))
    | _merged(
        st.fixed_dictionaries({"type": st.just("tool_use")}),
        _maybe(id=TEXT | ODD, name=TEXT | ODD, input=ODD),
    )
    | _merged(
        st.fixed_dictionaries({"type": st.just("tool_result")}),
        _maybe(
            tool_use_id=TEXT | ODD,
            content=TEXT | st.lists(TEXT_BLOCK | TEXT | ODD, max_size=3) | ODD,
            is_error=ODD,
        ),
    )
    | st.fixed_dictionaries({"type": st.sampled_from(["thinking", "document", "server_tool_use"])})
    | OBJECT
)
ANTHROPIC_MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant"]),
        "content": TEXT | st.lists(BLOCK, max_size=3),
    }
)
ANTHROPIC_TOOL = (
    _merged(
        st.fixed_dictionaries({"name": TEXT}), _maybe(description=TEXT | ODD, input_schema=OBJECT)
    )
    | OBJECT
)
ANTHROPIC_BODY = _merged(
    st.fixed_dictionaries(
        {
            "model": st.just("tiny"),
            "messages": st.lists(ANTHROPIC_MESSAGE, min_size=1, max_size=4),
            "max_tokens": st.integers(1, 3),
        }
    ),
    _maybe(
        system=TEXT | st.lists(TEXT_BLOCK | OBJECT, max_size=2),
        stream=st.booleans(),
        temperature=st.floats(0, 1),
        top_p=st.floats(0.01, 1),
        top_k=st.integers(1, 10**6),
        stop_sequences=st.lists(TEXT, max_size=4),
        tools=st.lists(ANTHROPIC_TOOL, max_size=2),
        tool_choice=_merged(
            st.fixed_dictionaries({"type": st.sampled_from(["auto", "any", "tool", "none"])}),
            _maybe(name=TEXT | ODD, disable_parallel_tool_use=ODD),
        )
        | OBJECT,
        metadata=OBJECT,
        thinking=ODD,
    ),
)


@pytest.fixture(scope="module")
def fuzzed() -> str:
    return "fuzz"  # one scenario for every example: sessions stitch across them too


@FUZZ
@given(body=CHAT_BODY)
def test_generated_chat_completions_are_not_5xx(
    http: httpx.Client, fuzzed: str, body: dict[str, Any]
) -> None:
    _check(_send(http, "/v1/chat/completions", body, fuzzed), body, http, fuzzed)


@FUZZ
@given(body=ANTHROPIC_BODY)
def test_generated_anthropic_messages_are_not_5xx(
    http: httpx.Client, fuzzed: str, body: dict[str, Any]
) -> None:
    _check(_send(http, "/v1/messages", body, fuzzed), body, http, fuzzed)


# --- NUL characters on Postgres ----------------------------------------------------------------


@pytest.mark.postgres
def test_nul_characters_round_trip_on_postgres(
    tmp_path: Any, make_postgres_database: Callable[[], str]
) -> None:
    # Postgres refuses NUL (\u0000) in text and JSONB; bodies keep it all the same
    nul = "a\u0000b"
    with InProcessReef(tmp_path, store={"database_url": make_postgres_database()}) as srv:
        headers = {"x-reef-scenario": "nul"}
        chat = {"model": "tiny", "messages": [{"role": "user", "content": nul}], "max_tokens": 2}
        r = httpx.post(f"{srv.url}/v1/chat/completions", json=chat, headers=headers)
        assert r.status_code == 200, r.text
        receipt = r.headers["x-reef-agent-record-id"]
        record = httpx.get(f"{srv.url}/reef/scenarios/nul/records/{receipt}").json()
        assert record["request"] == chat
        report = {
            "score": 1.0,
            "feedback": {"correction": nul, nul: [nul]},
            "metadata": {"judge": nul},
            "references": [receipt],
        }
        r = httpx.post(f"{srv.url}/reef/report", json=report, headers=headers)
        assert r.status_code == 201, r.text
        (stored,) = httpx.get(f"{srv.url}/reef/scenarios/nul/reports").json()["data"]
        assert (stored["feedback"], stored["metadata"]) == (report["feedback"], report["metadata"])
        # where Postgres text cannot hold it (a name, an id), a clear 400, never a 503
        for r in (
            httpx.post(f"{srv.url}/reef/scenarios", json={"name": "nul2", "description": nul}),
            httpx.get(f"{srv.url}/reef/scenarios/nul/records/a%00b"),
            httpx.get(f"{srv.url}/reef/scenarios/nul/records", params={"after": nul}),
            httpx.post(
                f"{srv.url}/reef/report",
                json={**report, "references": [nul]},
                headers=headers,
            ),
        ):
            assert r.status_code in (400, 404), (r.request.url, r.text)


def test_unexpected_errors_do_not_echo_exception_text() -> None:
    from fastapi import FastAPI
    from starlette.testclient import TestClient

    from reef.api import errors

    app = FastAPI()
    errors.install(app)

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("secret at /srv/reef/state/keys: hunter2")

    with TestClient(app, raise_server_exceptions=False) as client:
        r = client.get("/boom")
    assert r.status_code == 500
    error = r.json()["error"]
    assert error["code"] == "internal_error" and error["type"] == "server_error"
    assert "hunter2" not in r.text and "/srv" not in r.text and "RuntimeError" not in r.text
    assert "reference err_" in error["message"]
