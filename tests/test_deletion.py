"""reef.deletion: after a scenario's rows are deleted (the commit point, a tombstone), its files
and MLflow entries go — at once, or by `reef gc` (collect_garbage) after a crash or an outage.
Real MLflow (SQLite tracking store, runs, logged models, a registered version made by Reef's
own registration), a real artifact directory, the store on SQLite and on Postgres."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reef.artifacts import artifacts_for
from reef.deletion import ARTIFACT_PREFIXES, collect_garbage, finish
from reef.errors import Conflict
from reef.settings import Settings, load_settings
from reef.store.sql import SQLStore
from tests.footprint import PREFIXES, footprint, mlflow_state

S, NEIGHBOUR = "doomed", "doomed2"  # the neighbour's keys start with the scenario's name


def test_the_prefixes_are_the_ones_deletion_removes() -> None:
    assert ARTIFACT_PREFIXES == PREFIXES


def _settings(tmp_path: Path, database_url: str, **more: Any) -> Settings:
    return load_settings(
        server={"state_dir": str(tmp_path / "state")},
        store={"database_url": database_url},
        **more,
    )


def test_gc_finishes_a_deletion_the_process_never_got_to(
    store: SQLStore, database_url: str, tmp_path: Path
) -> None:
    settings = _settings(tmp_path, database_url)
    artifacts = artifacts_for(settings)
    for name in (S, NEIGHBOUR):
        store.ensure_scenario(name)
        footprint(settings, artifacts, name)
    before = mlflow_state(settings, S)
    assert before["versions"] == 1 and before["runs"] == 2 and before["files"]

    store.delete_scenario(S)  # the commit point; the process dies before anything else
    with pytest.raises(Conflict):
        store.ensure_scenario(S)

    (done,) = collect_garbage(store, settings, artifacts)
    assert done.done and done.scenario == S and done.artifacts == len(ARTIFACT_PREFIXES)
    assert done.mlflow is not None
    assert (done.mlflow.model_versions, done.mlflow.runs, done.mlflow.experiment) == (1, 2, True)
    assert done.mlflow.logged_models == 1
    for prefix in ARTIFACT_PREFIXES:
        assert artifacts.list_keys(f"{prefix}/{S}") == []
        assert not (settings.server.state_dir / "cache" / prefix / S).exists()
        assert artifacts.list_keys(f"{prefix}/{NEIGHBOUR}") == [f"{prefix}/{NEIGHBOUR}/x/file.bin"]
    assert mlflow_state(settings, S) == {"versions": 0, "experiment": False, "runs": 0, "files": []}
    for path in before["files"]:
        assert not path.exists()
    neighbour = mlflow_state(settings, NEIGHBOUR)
    assert neighbour["versions"] == 1 and neighbour["runs"] == 2 and neighbour["files"]
    assert store.pending_deletions() == []
    assert collect_garbage(store, settings, artifacts) == []  # nothing left to do

    # the name is free again, and what it makes starts from scratch
    store.ensure_scenario(S)
    footprint(settings, artifacts, S)
    assert mlflow_state(settings, S)["versions"] == 1


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_an_outage_leaves_the_tombstone_and_a_rerun_finishes(
    store: SQLStore, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings(tmp_path, database_url)
    artifacts = artifacts_for(settings)
    store.ensure_scenario(S)
    footprint(settings, artifacts, S)
    store.delete_scenario(S)

    # MLflow unreachable: the files go, MLflow's entries and the tombstone stay
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    down = _settings(tmp_path, database_url, tracking={"uri": "http://127.0.0.1:9"})
    failed = finish(store, down, artifacts, S)
    assert not failed.done and failed.error
    assert [d.scenario for d in store.pending_deletions()] == [S]
    assert artifacts.list_keys(f"datasets/{S}") == []
    assert mlflow_state(settings, S)["versions"] == 1

    (done,) = collect_garbage(store, settings, artifacts)  # MLflow is back
    assert done.done and done.artifacts == 0 and done.mlflow is not None
    assert done.mlflow.model_versions == 1
    assert mlflow_state(settings, S)["runs"] == 0 and store.pending_deletions() == []
