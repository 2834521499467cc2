"""Removing a deleted scenario from MLflow: its registered model ``reef-<scenario>`` with every
version, and the runs and logged models of its experiment ``reef/<scenario>`` with their
artifacts.

Idempotent: what is already gone is skipped, so an interrupted removal is simply run again.
On a database tracking store (SQLite, Postgres, ...) runs, logged models and the experiment are
removed for good, as ``mlflow gc`` does (through the same store methods it uses), which also
frees the experiment's name for a scenario created later under it. Through a tracking server
(http) MLflow offers no permanent deletion: the artifacts go, the runs and logged models are
moved to MLflow's deleted state (hidden, purged by ``mlflow gc`` on the server's store), and
the experiment stays, empty and usable.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from reef.registry.clients import does_not_exist, mlflow_client, s3_endpoint
from reef.registry.names import model_name

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Removed:
    """What one removal took away (counts; zero when it was gone already)."""

    model_versions: int = 0
    runs: int = 0
    logged_models: int = 0
    experiment: bool = False  # the experiment itself (database tracking stores only)


def experiment_name(scenario: str) -> str:
    return f"reef/{scenario}"


def remove_scenario(
    tracking_uri: str,
    scenario: str,
    *,
    registry_uri: str | None = None,
    s3_endpoint_url: str | None = None,
) -> Removed:
    """Remove what `scenario` has in MLflow (see the module docstring). MLflow errors propagate:
    the caller keeps the deletion pending and retries later."""
    from mlflow.entities import ViewType
    from mlflow.exceptions import MlflowException

    client = mlflow_client(tracking_uri, registry_uri)
    versions = 0
    name = model_name(scenario)
    try:
        versions = len(client.search_model_versions(f"name='{name}'"))
        client.delete_registered_model(name)  # its versions and aliases with it
    except MlflowException as e:
        if not does_not_exist(e):
            raise
        versions = 0
    experiment = client.get_experiment_by_name(experiment_name(scenario))
    if experiment is None:
        return Removed(model_versions=versions)
    store = client._tracking_client.store  # MLflow's own gc reaches the store the same way
    hard = all(
        hasattr(store, m)
        for m in ("_hard_delete_run", "_hard_delete_logged_model", "_hard_delete_experiment")
    )
    exp_id = experiment.experiment_id
    with s3_endpoint(s3_endpoint_url):
        models = _all(lambda token: client.search_logged_models([exp_id], page_token=token))
        for model in models:
            _delete_artifacts(model.artifact_location)
            client.delete_logged_model(model.model_id)
            if hard:
                store._hard_delete_logged_model(model.model_id)
        runs = _all(
            lambda token: client.search_runs(
                [exp_id], run_view_type=ViewType.ALL, max_results=1000, page_token=token
            )
        )
        for run in runs:
            _delete_artifacts(run.info.artifact_uri)
            if run.info.lifecycle_stage == "active":
                client.delete_run(run.info.run_id)
            if hard:
                store._hard_delete_run(run.info.run_id)
    gone = False
    if hard:
        if experiment.lifecycle_stage == "active":
            client.delete_experiment(exp_id)
        store._hard_delete_experiment(exp_id)
        gone = True
    removed = Removed(versions, len(runs), len(models), gone)
    log.info("removed scenario %s from MLflow %s: %s", scenario, tracking_uri, removed)
    return removed


def _all(page: Any) -> list[Any]:
    """Every item of a paged MLflow search."""
    out: list[Any] = []
    token = None
    while True:
        result = page(token)
        out += list(result)
        token = getattr(result, "token", None)
        if not token:
            return out


def _delete_artifacts(uri: str | None) -> None:
    """Delete everything under an artifact URI (a run's or a logged model's); none is fine."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    if not uri:
        return
    with contextlib.suppress(FileNotFoundError):
        get_artifact_repository(uri).delete_artifacts()
