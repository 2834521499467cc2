"""Bad input gets a clear 4xx in OpenAI's error shape, and nothing is recorded for it."""

from __future__ import annotations

import json

import httpx
import pytest

from reef.cli.testing import InProcessReef
from tests.api.conftest import records_of

GOOD = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _post(server: InProcessReef, scenario: str, content: bytes) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/chat/completions",
        content=content,
        headers={"x-reef-scenario": scenario, "content-type": "application/json"},
    )


@pytest.mark.parametrize(
    ("content", "status", "code", "word"),
    [
        (b"{not json", 400, "invalid_json", "not valid JSON"),
        (b"", 400, "invalid_json", "empty"),
        (b"[1, 2]", 400, "invalid_json", "JSON object"),
        (b'{"model": "tiny"}', 400, "invalid_value", "messages"),
        (b'{"model": "tiny", "messages": []}', 400, "invalid_value", "messages"),
        (
            b'{"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]}',
            400,
            "invalid_value",
            "role",
        ),
        (
            b'{"model": 5, "messages": [{"role": "user", "content": "x"}]}',
            400,
            "invalid_value",
            "model",
        ),
        (
            b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}',
            400,
            "invalid_value",
            "max_tokens",
        ),
        (
            b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "temperature": 7}',
            400,
            "invalid_value",
            "temperature",
        ),
    ],
)
def test_bad_chat_bodies(
    server: InProcessReef, scenario: str, content: bytes, status: int, code: str, word: str
) -> None:
    r = _post(server, scenario, content)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code
    assert err["type"] == "invalid_request_error"
    assert word in err["message"]
    assert records_of(server, scenario) == []


def test_body_over_cap_is_413(server: InProcessReef, scenario: str) -> None:
    big = {**GOOD, "messages": [{"role": "user", "content": "x" * 70_000}]}
    r = httpx.post(
        f"{server.url}/v1/chat/completions", json=big, headers={"x-reef-scenario": scenario}
    )
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "payload_too_large"
    assert records_of(server, scenario) == []


def test_body_over_cap_without_content_length_is_413(server: InProcessReef, scenario: str) -> None:
    def chunks():  # chunked transfer: no Content-Length to trust
        yield b'{"model": "tiny", "messages": [{"role": "user", "content": "'
        for _ in range(80):
            yield b"x" * 1000
        yield b'"}]}'

    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        content=chunks(),
        headers={"x-reef-scenario": scenario, "content-type": "application/json"},
    )
    assert r.status_code == 413


def test_context_overflow_is_400(server: InProcessReef, scenario: str) -> None:
    long = {**GOOD, "messages": [{"role": "user", "content": "word " * 6000}], "max_tokens": 10}
    r = httpx.post(
        f"{server.url}/v1/chat/completions", json=long, headers={"x-reef-scenario": scenario}
    )
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert records_of(server, scenario) == []


def test_bad_scenario_name(server: InProcessReef) -> None:
    r = httpx.post(
        f"{server.url}/v1/chat/completions", json=GOOD, headers={"x-reef-scenario": "../etc"}
    )
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_scenario"


def test_unknown_route_and_record(server: InProcessReef, scenario: str) -> None:
    r = httpx.get(f"{server.url}/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    assert _post(server, scenario, json.dumps(GOOD).encode()).status_code == 200
    r = httpx.get(f"{server.url}/reef/scenarios/{scenario}/records/rec_missing")
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "not_found_error"
