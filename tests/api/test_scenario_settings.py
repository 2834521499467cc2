"""GET/PUT /reef/scenarios/{s}/settings over real HTTP: an admin changes a scenario's learning
settings without a restart, the status route and readiness read them at once, every change is
kept with who made it, bad keys are 400 naming them, a stale version 409, and only admins may
read or change them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from reef.api.auth import hash_token
from reef.cli.testing import InProcessReef

ADMIN, TEAM = "sk-ops-settings", "sk-team-settings"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    tokens = [
        {"name": "ops", "sha256": hash_token(ADMIN), "admin": True},
        {"name": "team", "sha256": hash_token(TEAM), "scenarios": ["team"]},
    ]
    state: Path = tmp_path_factory.mktemp("reef-settings")
    with InProcessReef(
        state,
        auth={"tokens": tokens},
        reef={"batch_size": 8},
        gate={"holdout": 0.0},
        scenarios={"team": {"reef": {"params": {"epochs": 1}}}},
    ) as srv:
        # made here, so that each test stands alone (any order, any xdist worker)
        made = httpx.post(f"{srv.url}/reef/scenarios", json={"name": "team"}, headers=_h(ADMIN))
        assert made.status_code == 201, made.text
        yield srv


def _h(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_an_admin_changes_a_scenario_live(server: InProcessReef) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key=TEAM, max_retries=0)
    for i in range(3):
        raw = client.chat.completions.with_raw_response.create(
            model="tiny",
            messages=[{"role": "user", "content": f"q{i}"}],
            max_tokens=2,
            extra_headers={"x-reef-scenario": "team"},
        )
        receipt = raw.headers["x-reef-agent-record-id"]
        body = {"references": [receipt], "score": 1.0}
        r = httpx.post(
            f"{server.url}/reef/report", json=body, headers={**_h(TEAM), "x-reef-scenario": "team"}
        )
        assert r.status_code == 201, r.text
    url = f"{server.url}/reef/scenarios/team"
    status = httpx.get(f"{url}/status", headers=_h(TEAM)).json()
    assert (status["batch_size"], status["eligible"], status["ready"]) == (8, 3, False)

    before = httpx.get(f"{url}/settings", headers=_h(ADMIN)).json()
    assert before["version"] == 0 and before["history"] == []
    assert before["effective"]["reef"]["params"] == {"epochs": 1}  # the configuration's

    r = httpx.put(
        f"{url}/settings",
        json={"reef": {"batch_size": 3, "recipe": "kto"}, "expected_version": 0},
        headers=_h(ADMIN),
    )
    assert r.status_code == 200, r.text
    after = r.json()
    assert after["version"] == 1 and after["history"][0]["changed_by"] == "ops"
    assert after["effective"]["reef"]["batch_size"] == 3
    assert after["effective"]["reef"]["recipe"] == "kto"
    assert after["effective"]["reef"]["params"] == {"epochs": 1}  # merged, not replaced
    status = httpx.get(f"{url}/status", headers=_h(TEAM)).json()
    assert (status["recipe"], status["batch_size"], status["ready"]) == ("kto", 3, True)

    stale = httpx.put(
        f"{url}/settings", json={"reef": {}, "expected_version": 0}, headers=_h(ADMIN)
    )
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "settings_changed"
    again = httpx.put(f"{url}/settings", json={"gate": {"policy": "manual"}}, headers=_h(ADMIN))
    assert again.json()["version"] == 2
    assert again.json()["effective"]["reef"]["batch_size"] == 8  # a PUT replaces the last one
    assert [v["version"] for v in again.json()["history"]] == [2, 1]


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"reef": {"batch_size": 0}}, "batch_size"),
        ({"gate": {"nope": 1}}, "unknown key 'nope'"),
        ({"reef": {"worker_priority": "low"}}, "process-wide"),
        ({"engine": {"model": "other"}}, "unknown key 'engine.model'"),
        ({"engine": {"sampling_defaults": {"temperature": 3}}}, "between 0 and 2"),
    ],
)
def test_bad_settings_are_400_naming_the_key(
    server: InProcessReef, body: dict[str, object], said: str
) -> None:
    r = httpx.put(f"{server.url}/reef/scenarios/team/settings", json=body, headers=_h(ADMIN))
    assert r.status_code == 400 and said in r.json()["error"]["message"], r.text


def test_the_review_queue_policies_are_set_at_run_time(server: InProcessReef) -> None:
    """review.* (what fills the scenario's annotation queue) changes as the other sections do:
    applied over the configuration, shown among what applies now, a bad value 400."""
    url = f"{server.url}/reef/scenarios/review-live"
    made = httpx.post(
        f"{server.url}/reef/scenarios", json={"name": "review-live"}, headers=_h(ADMIN)
    )
    assert made.status_code == 201, made.text
    r = httpx.put(f"{url}/settings", json={"review": {"sample": 0.25}}, headers=_h(ADMIN))
    assert r.status_code == 200, r.text
    assert r.json()["effective"]["review"]["sample"] == 0.25
    bad = httpx.put(f"{url}/settings", json={"review": {"sample": 2}}, headers=_h(ADMIN))
    assert bad.status_code == 400 and "sample" in bad.json()["error"]["message"], bad.text


def test_only_admins_read_or_change_settings(server: InProcessReef) -> None:
    url = f"{server.url}/reef/scenarios/team/settings"
    assert httpx.get(url, headers=_h(TEAM)).status_code == 403
    assert httpx.put(url, json={"reef": {"batch_size": 2}}, headers=_h(TEAM)).status_code == 403
    missing = f"{server.url}/reef/scenarios/nobody/settings"
    assert httpx.get(missing, headers=_h(ADMIN)).status_code == 404
