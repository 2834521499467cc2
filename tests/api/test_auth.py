"""Tokens from the config, stored as hashes: admin or limited to named scenarios."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from reef.api.auth import hash_token
from reef.cli.testing import InProcessReef

ADMIN, ALICE = "admin-secret-token", "alice-secret-token"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    state: Path = tmp_path_factory.mktemp("reef-auth")
    config = state / "serve.yaml"
    config.write_text(
        "auth:\n  tokens:\n"
        f"    - {{name: ops, sha256: {hash_token(ADMIN)}, admin: true}}\n"
        f"    - {{name: alice, sha256: {hash_token(ALICE)}, scenarios: [alice]}}\n"
    )
    assert ADMIN not in config.read_text()  # only hashes are stored
    with InProcessReef(state, config=config) as srv:
        yield srv


def _chat(srv: InProcessReef, token: str | None, scenario: str) -> httpx.Response:
    headers = {"x-reef-scenario": scenario}
    if token:
        headers["authorization"] = f"Bearer {token}"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return httpx.post(f"{srv.url}/v1/chat/completions", json=body, headers=headers)


def test_missing_and_wrong_tokens_are_401(secured: InProcessReef) -> None:
    for token in (None, "wrong"):
        r = _chat(secured, token, "alice")
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=secured.base_url, api_key="wrong").models.list()


def test_scenario_token_is_confined(secured: InProcessReef) -> None:
    ok = _chat(secured, ALICE, "alice")
    assert ok.status_code == 200
    receipt = ok.headers["x-reef-agent-record-id"]
    other = _chat(secured, ADMIN, "bob")
    assert other.status_code == 200
    bob_receipt = other.headers["x-reef-agent-record-id"]

    h = {"authorization": f"Bearer {ALICE}"}
    assert _chat(secured, ALICE, "bob").status_code == 403
    assert httpx.get(f"{secured.url}/reef/scenarios/bob/records", headers=h).status_code == 403
    assert (
        httpx.get(f"{secured.url}/reef/scenarios/bob/records/{bob_receipt}", headers=h).status_code
        == 403
    )
    report = {"score": 1, "references": [bob_receipt]}
    r = httpx.post(
        f"{secured.url}/reef/report", json=report, headers={**h, "x-reef-scenario": "bob"}
    )
    assert r.status_code == 403
    assert r.json()["error"]["type"] == "permission_error"
    assert (
        httpx.get(f"{secured.url}/reef/scenarios/alice/records/{receipt}", headers=h).status_code
        == 200
    )
    listed = httpx.get(f"{secured.url}/reef/scenarios", headers=h).json()["data"]
    assert [s["name"] for s in listed] == ["alice"]


def test_x_api_key_works_for_the_anthropic_sdk(secured: InProcessReef) -> None:
    c = anthropic.Anthropic(
        base_url=secured.url, api_key=ALICE, default_headers={"x-reef-scenario": "alice"}
    )
    msg = c.messages.create(
        model="tiny", max_tokens=2, messages=[{"role": "user", "content": "hi"}]
    )
    assert msg.role == "assistant"
    with pytest.raises(anthropic.PermissionDeniedError):
        c.messages.create(
            model="tiny",
            max_tokens=2,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-reef-scenario": "bob"},
        )
