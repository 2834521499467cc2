"""DELETE /reef/scenarios/{s}: admin only; removes the scenario's rows and unloads its variants
from the engine, answers 202, then removes its files (every artifact prefix), its MLflow model,
versions and runs in the background. Twice is 404. With MLflow unreachable the answer still
comes at once, the background clean-up fails within MLflow's bounded retries, and the name
stays taken until `reef gc` finishes it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from reef.api.auth import hash_token, new_token
from reef.artifacts import artifacts_for, tree_hash
from reef.cli.main import main as reef_cli
from reef.cli.testing import InProcessReef
from reef.deploy.engine import EngineAdmin
from reef.deploy.release import deploy
from reef.models import resolve_model
from reef.records import Release, new_id, utcnow
from reef.settings import load_settings
from reef.store.sql import open_store
from reef.testing.process import free_port
from tests.api.conftest import wait_cleaned
from tests.engines.test_embedded_releases import lora
from tests.footprint import PREFIXES, footprint, mlflow_state
from tests.reefserver import wait_for

ADMIN, ALICE = new_token(), new_token()
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _config(path: Path, extra: str = "") -> Path:
    path.write_text(
        "auth:\n  tokens:\n"
        f"    - {{name: ops, sha256: {hash_token(ADMIN)}, admin: true}}\n"
        f"    - {{name: alice, sha256: {hash_token(ALICE)}, scenarios: [s1, s1-2]}}\n" + extra
    )
    return path


def _as(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[InProcessReef]:
    with InProcessReef(tmp_path / "state", config=_config(tmp_path / "serve.yaml")) as srv:
        yield srv


def test_delete_is_admin_only_and_leaves_nothing_behind(
    server: InProcessReef, tmp_path: Path
) -> None:
    s, neighbour = "s1", "s1-2"
    settings, artifacts = server.settings, artifacts_for(server.settings)
    for name in (s, neighbour):
        r = httpx.post(
            f"{server.base_url}/chat/completions",
            json=CHAT,
            headers={**_as(ALICE), "x-reef-scenario": name},
        )
        assert r.status_code == 200, r.text
        footprint(settings, artifacts, name)
    # a trained release of each, loaded in the engine as a variant
    tiny = resolve_model("tiny", Path.home() / ".cache" / "reef" / "models")
    lora(AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32), 3, tmp_path / "a")
    store = open_store(settings.database_url)
    admin = EngineAdmin(server.url, ADMIN)
    published: dict[str, str] = {}
    try:
        for name in (s, neighbour):
            head = store.head_release(name)
            release = Release(
                id=new_id("rel"),
                scenario=name,
                seq=head.seq + 1,
                parent_id=head.id,
                kind="adapter",
                created_at=utcnow(),
                # the release files in the artifact store, as registering puts them there
                uri=artifacts.put_tree(
                    f"releases/{name}/{tree_hash(tmp_path / 'a')}", tmp_path / "a"
                ),
                operation="training",
            )
            published[name] = deploy(store, admin, release)[0].id
    finally:
        admin.close()
        store.close()
    variants = httpx.get(f"{server.url}/reef/engine/variants", headers=_as(ADMIN)).json()
    assert sum(v.startswith(f"{s}@") for v in variants["data"]) == 1, variants

    url = f"{server.url}/reef/scenarios/{s}"
    r = httpx.delete(url, headers=_as(ALICE))  # may use the scenario, is no admin
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    assert httpx.get(url, headers=_as(ALICE)).status_code == 200
    r = httpx.delete(url, headers=_as(ADMIN), timeout=120)
    assert r.status_code == 202, r.text
    assert httpx.get(url, headers=_as(ADMIN)).status_code == 404
    assert httpx.delete(url, headers=_as(ADMIN)).status_code == 404  # twice: gone
    wait_cleaned(server, s)

    variants = httpx.get(f"{server.url}/reef/engine/variants", headers=_as(ADMIN)).json()
    assert not any(v.startswith(f"{s}@") for v in variants["data"])
    assert any(v.startswith(f"{neighbour}@") for v in variants["data"])
    for prefix in PREFIXES:
        assert artifacts.list_keys(f"{prefix}/{s}") == []
        assert artifacts.list_keys(f"{prefix}/{neighbour}") != []
    assert mlflow_state(settings, s) == {"versions": 0, "experiment": False, "runs": 0, "files": []}
    assert mlflow_state(settings, neighbour)["versions"] == 1

    # the name is free again: a new, empty scenario
    r = httpx.post(
        f"{server.base_url}/chat/completions",
        json=CHAT,
        headers={**_as(ALICE), "x-reef-scenario": s},
    )
    assert r.status_code == 200 and r.headers["x-reef-release-id"] != published[s]


@pytest.mark.faults  # an MLflow server started and stopped: ~11 s, in the fault matrix's stage
def test_mlflow_down_commits_the_deletion_and_reef_gc_finishes_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    # MLflow at a port nothing listens on, with the serving process's default bounds
    # (tracking.http_retries 2, tracking.http_timeout_s 10)
    down = _config(tmp_path / "down.yaml", f"tracking:\n  uri: http://127.0.0.1:{free_port()}\n")
    up = _config(tmp_path / "up.yaml")  # the default tracking store, MLflow "back"
    s = "s1"
    with InProcessReef(state, config=down) as server:
        headers = {**_as(ADMIN), "x-reef-scenario": s}
        assert httpx.post(f"{server.base_url}/chat/completions", json=CHAT, headers=headers)
        settings = load_settings(up, server={"state_dir": str(state)})
        footprint(settings, artifacts_for(settings), s)

        t0 = time.monotonic()
        r = httpx.delete(f"{server.url}/reef/scenarios/{s}", headers=_as(ADMIN), timeout=120)
        assert time.monotonic() - t0 < 2.0  # the clean-up is not on the request's path
        assert r.status_code == 202, r.text
        assert r.json()["status"] == "pending" and "reef gc" in r.json()["message"]
        assert httpx.get(f"{server.url}/reef/scenarios/{s}", headers=_as(ADMIN)).status_code == 404
        failed = "removing deleted scenario s1 failed (reef gc retries)"
        wait_for("the clean-up to give up on MLflow", lambda: failed in server.log(), server, 60)
        r = httpx.post(f"{server.base_url}/chat/completions", json=CHAT, headers=headers)
        assert r.status_code == 409 and r.json()["error"]["code"] == "scenario_deleting"
        assert mlflow_state(settings, s)["versions"] == 1

        gc = ["gc", "-c", str(up), "--state-dir", str(state)]
        assert reef_cli(gc) == 0
        assert mlflow_state(settings, s) == {
            "versions": 0,
            "experiment": False,
            "runs": 0,
            "files": [],
        }
        assert reef_cli(gc) == 0  # nothing left: a no-op
        r = httpx.post(f"{server.base_url}/chat/completions", json=CHAT, headers=headers)
        assert r.status_code == 200, r.text
