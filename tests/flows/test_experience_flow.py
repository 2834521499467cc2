"""The materialize-experience flow on real Prefect (test server), real MLflow (SQLite) and a
real SQLite store: a good snapshot becomes the run's dataset input, a bad one fails the flow."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reef.contracts import ContractViolation
from reef.store.sql import open_store
from tests.experience.conftest import record, report, session

S = "flowy"


@pytest.fixture
def urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """A migrated SQLite store filled with experience, an artifact dir, an MLflow SQLite URI."""
    monkeypatch.chdir(tmp_path)  # anything MLflow writes relative to the cwd stays in tmp
    database_url = f"sqlite:///{tmp_path / 'reef.db'}"
    store = open_store(database_url)
    store.migrate()
    try:
        base = store.ensure_scenario(S).head_release_id
        recs = [record(S, base, answer=f"answer {k}") for k in range(4)]
        turns = session(S, base, 2)
        unscored, unreported = record(S, base), record(S, base)
        store.add_records([*recs, *turns, unscored, unreported])
        for k, rec in enumerate(recs):
            store.add_report(report(S, rec.id, score=float(k)))
        store.add_report(report(S, *(r.id for r in turns), score=0.5))
        store.add_report(report(S, unscored.id, score=None, feedback="too long"))
    finally:
        store.close()
    yield {
        "database_url": database_url,
        "artifacts_url": str(tmp_path / "artifacts"),
        "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
    }


@pytest.fixture
def run_flow(prefect_server: None) -> Any:
    from reef.flows.experience import materialize_experience

    return materialize_experience


def test_flow_logs_the_snapshot_as_the_runs_dataset_input(
    run_flow: Any, urls: dict[str, str], tmp_path: Path
) -> None:
    import mlflow

    out = run_flow(S, "scored", max_context=4096, **urls)

    path = tmp_path / "artifacts" / "datasets" / S / "scored" / f"{out['content_hash']}.parquet"
    assert path.is_file() and out["uri"] == path.as_uri() and out["rows"] == 5

    mlflow.set_tracking_uri(urls["tracking_uri"])
    run = mlflow.get_run(out["run_id"])
    assert run.info.status == "FINISHED"
    assert mlflow.get_experiment(run.info.experiment_id).name == f"reef/{S}"
    assert run.data.metrics["rows"] == 5
    assert run.data.metrics["dropped_no_score"] == 1
    assert run.data.metrics["awaiting_feedback"] == 1
    assert run.data.params["content_hash"] == out["content_hash"]

    (inp,) = run.inputs.dataset_inputs
    ds = inp.dataset
    assert ds.name == f"{S}/scored"
    assert out["content_hash"].startswith(ds.digest) and len(ds.digest) == 16
    assert json.loads(ds.source) == {"uri": out["uri"]} and ds.source_type == "local"
    columns = {c["name"]: c for c in json.loads(ds.schema)["mlflow_colspec"]}
    assert columns["score"]["type"] == "double" and columns["record_ids"]["type"] == "array"
    tags = {t.key: t.value for t in inp.tags}
    assert tags["mlflow.data.context"] == "training"
    assert tags["reef.content_hash"] == out["content_hash"]


def test_contract_violation_fails_the_flow_and_logs_no_input(
    run_flow: Any, urls: dict[str, str]
) -> None:
    import mlflow

    # every sample has 6 tokens: a context of 1 violates the length contract
    state = run_flow(S, "scored", max_context=1, return_state=True, **urls)

    assert state.is_failed()
    with pytest.raises(ContractViolation) as err:
        state.result()
    assert "expect_column_values_to_be_between on column 'n_tokens'" in err.value.message

    mlflow.set_tracking_uri(urls["tracking_uri"])
    (run,) = mlflow.search_runs(experiment_names=[f"reef/{S}"], output_format="list")
    assert run.info.status == "FAILED"
    assert not run.inputs.dataset_inputs
    assert "n_tokens" in run.data.tags["reef.contract_violation"]
