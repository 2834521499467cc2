"""What is scoped, and checked, over HTTP: report ids per scenario, Idempotency-Keys per route,
scenario names matched whole everywhere, and what scenario-scoped tokens do not see (where the
server keeps files)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from reef.api.auth import hash_token
from reef.cli.testing import InProcessReef
from reef.records import Release, new_id, utcnow
from reef.store.sql import open_store

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _receipt(server: InProcessReef, scenario: str) -> str:
    r = httpx.post(
        f"{server.url}/v1/chat/completions", json=CHAT, headers={"x-reef-scenario": scenario}
    )
    assert r.status_code == 200, r.text
    return r.headers["x-reef-agent-record-id"]


def test_report_ids_are_scoped_by_scenario(server: InProcessReef, scenario: str) -> None:
    other = f"{scenario}-b"
    theirs = {"report_id": "judge-1", "score": 1.0, "references": [_receipt(server, scenario)]}
    ours = {"report_id": "judge-1", "score": 0.0, "references": [_receipt(server, other)]}
    a = httpx.post(f"{server.url}/reef/report", json=theirs, headers={"x-reef-scenario": scenario})
    assert a.status_code == 201, a.text
    b = httpx.post(f"{server.url}/reef/report", json=ours, headers={"x-reef-scenario": other})
    assert b.status_code == 201, b.text  # another scenario's id does not block this one
    assert b.json()["score"] == 0.0
    again = httpx.post(f"{server.url}/reef/report", json=ours, headers={"x-reef-scenario": other})
    assert again.status_code == 200 and again.json()["created"] is False
    clash = httpx.post(
        f"{server.url}/reef/report",
        json={**ours, "score": 0.5},
        headers={"x-reef-scenario": other},
    )
    assert clash.status_code == 409
    assert scenario + "'" not in clash.text and "1.0" not in clash.text  # nothing of theirs


def test_idempotency_keys_are_scoped_by_route(server: InProcessReef, scenario: str) -> None:
    headers = {"x-reef-scenario": scenario, "Idempotency-Key": "same-key"}
    chat = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, headers=headers)
    assert chat.status_code == 200, chat.text
    msg = httpx.post(f"{server.url}/v1/messages", json=CHAT, headers=headers)
    assert msg.status_code == 200, msg.text  # another route's request, not a reuse of the key
    assert "x-reef-idempotent-replay" not in msg.headers
    assert msg.headers["x-reef-agent-record-id"] != chat.headers["x-reef-agent-record-id"]
    replay = httpx.post(f"{server.url}/v1/messages", json=CHAT, headers=headers)
    assert replay.headers["x-reef-idempotent-replay"] == "true"
    assert replay.headers["x-reef-agent-record-id"] == msg.headers["x-reef-agent-record-id"]
    reused = httpx.post(
        f"{server.url}/v1/chat/completions", json={**CHAT, "max_tokens": 3}, headers=headers
    )
    assert reused.status_code == 409


@pytest.mark.parametrize("name", ["abc\n", "abc\r\n", "\nabc", "a" * 65, "-abc"])
def test_scenario_names_are_matched_whole(server: InProcessReef, name: str) -> None:
    from urllib.parse import quote

    path = quote(name, safe="")
    for r in (
        httpx.get(f"{server.url}/reef/scenarios/{path}/records"),
        httpx.delete(f"{server.url}/reef/scenarios/{path}"),
        httpx.get(f"{server.url}/reef/harness", params={"scenario": name}),
        httpx.post(f"{server.url}/reef/scenarios", json={"name": name}),
        httpx.post(f"{server.url}/reef/engine/refresh", json={"scenario": name}),
        httpx.post(
            f"{server.url}/reef/engine/generate",
            json={"scenario": name, "messages": CHAT["messages"], "max_tokens": 1},
        ),
    ):
        assert r.status_code == 400, (r.request.url, r.text)
    names = [s["name"] for s in httpx.get(f"{server.url}/reef/scenarios").json()["data"]]
    assert name not in names


ADMIN, ALICE = "reef_admin_token", "reef_alice_token"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    tokens = [
        {"name": "ops", "sha256": hash_token(ADMIN), "admin": True},
        {"name": "alice", "sha256": hash_token(ALICE), "scenarios": ["s", "broken"]},
    ]
    with InProcessReef(tmp_path_factory.mktemp("scoped"), auth={"tokens": tokens}) as srv:
        yield srv


def _get(srv: InProcessReef, path: str, token: str, **params: str) -> dict[str, Any]:
    auth = {"Authorization": f"Bearer {token}"}
    r = httpx.get(srv.url + path, params=params, headers=auth, timeout=60)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _paths(value: Any) -> list[str]:
    """Every string in `value` that names a file: a file:// or s3:// uri, an absolute path, an
    artifact key."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _paths(v) + _paths(k)]
    if isinstance(value, list):
        return [p for v in value for p in _paths(v)]
    if isinstance(value, str) and (
        ("://" in value and not value.startswith("models:/"))
        or value.startswith(("/", "releases/", "harness/", "datasets/"))
    ):
        return [value]
    return []


def test_scoped_tokens_see_no_server_paths(guarded: InProcessReef) -> None:
    admin = {"Authorization": f"Bearer {ADMIN}"}
    files = {"AGENTS.md": "Be brief.", "harness.json": '{"inject": true}'}
    r = httpx.post(
        f"{guarded.url}/reef/scenarios/s/harness", json={"files": files}, headers=admin, timeout=60
    )
    assert r.status_code == 201, r.text
    assert _paths(r.json())  # the admin sees where the files are
    held = httpx.post(
        f"{guarded.url}/reef/scenarios/s/harness",
        json={"files": {**files, "scripts/run.sh": "#!/bin/sh\necho hi\n"}},
        headers=admin,
        timeout=60,
    )
    assert held.status_code == 202, held.text
    store = open_store(f"sqlite:///{guarded.state_dir / 'reef.db'}")
    try:  # a trained release, as a deploy stores it: its files in the artifact store
        head = store.head_release("s")
        root = (guarded.state_dir / "artifacts").resolve()
        store.publish_release(
            Release(
                id=new_id("rel"),
                scenario="s",
                seq=0,
                parent_id=head.id,
                kind="adapter",
                created_at=utcnow(),
                uri=(root / "releases/s/abc").as_uri(),
                operation="training",
                metadata={"artifact_key": "releases/s/abc", **head.metadata},
            )
        )
    finally:
        store.close()

    for path in ("/reef/scenarios/s/releases", "/reef/scenarios/s/candidates"):
        mine = _get(guarded, path, ALICE)
        assert mine["data"] and _paths(mine) == [], _paths(mine)
        theirs = _get(guarded, path, ADMIN)
        assert _paths(theirs)
    releases = _get(guarded, "/reef/scenarios/s/releases", ALICE)["data"]
    assert releases[0]["uri"] is None and "artifact_key" not in releases[0]["metadata"]
    assert releases[0]["metadata"]["harness"]["content_hash"]  # what it is, not where
    assert releases[0]["kind"] == "adapter" and releases[0]["model_uri"] is None


def test_scoped_tokens_see_no_server_paths_in_errors(guarded: InProcessReef) -> None:
    store = open_store(f"sqlite:///{guarded.state_dir / 'reef.db'}")
    try:  # a release whose harness files are gone from the artifact store
        head = store.ensure_scenario("broken").head_release_id
        missing = {"key": "harness/broken/gone", "uri": "file:///nowhere", "content_hash": "x"}
        store.publish_release(
            Release(
                id=new_id("rel"),
                scenario="broken",
                seq=0,
                parent_id=head,
                kind="base",
                created_at=utcnow(),
                operation="harness",
                metadata={"harness": missing},
            )
        )
    finally:
        store.close()
    state = str(guarded.state_dir)
    for token, shown in ((ALICE, False), (ADMIN, True)):
        r = httpx.get(
            f"{guarded.url}/reef/harness",
            params={"scenario": "broken"},
            headers={"Authorization": f"Bearer {token}"},
            timeout=60,
        )
        assert r.status_code == 404, r.text
        message = r.json()["error"]["message"]
        assert "harness/broken/gone" in message
        assert (state in message) is shown, message
