"""Readiness asks the recipe class which experience it takes: a harness scenario's status and
/metrics count exactly the samples the harness recipe trains on, as its kind ("scored"; a
table kept beside the classes once said "trajectory")."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from reef.api.app import create_app
from reef.cli.serve import build_engine
from reef.experience import collect
from reef.readiness import EMPTY_POOL, readiness
from reef.recipes.harness.recipe import HarnessRecipe
from reef.settings import load_settings
from reef.store.sql import SQLStore, open_store
from tests.experience.conftest import record, report, session

S = "harness-ready"


def _traffic(store: SQLStore) -> None:
    base = store.ensure_scenario(S).head_release_id
    turns = session(S, base, 3)  # one report on a whole session
    single = record(S, base)
    store.add_records([*turns, single])
    store.add_report(report(S, *(r.id for r in turns), score=0.0))
    store.add_report(report(S, single.id, score=0.0, feedback={"correction": "Hi."}))


def test_harness_readiness_counts_what_the_recipe_trains_on(store: SQLStore) -> None:
    _traffic(store)
    settings = load_settings(reef={"recipe": "harness", "batch_size": 2})
    trains_on = collect(store, S, HarnessRecipe.kind, recipe="harness")
    r = readiness(store, S, settings.reef)
    assert (r.kind, r.eligible, r.ready) == ("scored", len(trains_on.samples), True)
    assert r.eligible == 2 and not r.dropped


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_harness_status_and_metrics(database_url: str, tmp_path: Path) -> None:
    settings = load_settings(
        server={"state_dir": str(tmp_path / "state"), "metrics_scenario_labels": True},
        store={"database_url": database_url},
        engine={"model": "tiny"},
        reef={"recipe": "harness", "batch_size": 2, "auto": False},
    )
    store = open_store(database_url)
    store.migrate()
    try:
        _traffic(store)
    finally:
        store.close()
    app = create_app(settings, build_engine(settings))
    with TestClient(app, base_url="http://localhost") as client:  # a Host it answers for
        status = client.get(f"/reef/scenarios/{S}/status").json()
        assert (status["recipe"], status["kind"]) == ("harness", "scored")
        # a full batch, but the gate would have nothing to decide on: not ready, and why
        assert (status["eligible"], status["ready"], status["dropped"]) == (2, False, {})
        assert status["waiting"] == EMPTY_POOL
        line = f'reef_experience_eligible{{kind="scored",scenario="{S}"}} 2.0'
        deadline, text = time.monotonic() + 30, ""
        while line not in text and time.monotonic() < deadline:
            text = client.get("/metrics").text  # computed in the background: poll
            time.sleep(0.2)
        assert line in text
        assert f'reef_experience_ready{{kind="scored",scenario="{S}"}} 0.0' in text
