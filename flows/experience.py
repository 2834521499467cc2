"""Prefect tasks and a flow that turn a scenario's eligible experience into a validated dataset
snapshot, logged to MLflow as a dataset input of the run that uses it."""

from __future__ import annotations

from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from reef.artifacts import open_artifacts
from reef.contracts import ContractViolation, ValidationReport, validate
from reef.datasets import Snapshot, load, materialize
from reef.experience import Experience, Rule, collect
from reef.flows.stages import timed
from reef.recipe import RECIPES, recipe_class
from reef.records import Consumption, Slice
from reef.store.sql import open_store


# Tasks take URLs, not open connections: a worker on another host opens its own. No task is
# cached: the same inputs meet new experience on every run (a snapshot is written once per
# content hash anyway).
# Retries only where the network is touched (database, artifact store), where a failure may be
# transient; a contract violation is a verdict on the data, and retrying cannot change it.
@task(retries=2, retry_delay_seconds=5, cache_policy=NO_CACHE)
@timed("materialize")
def materialize_snapshot(
    database_url: str,
    artifacts_url: str,
    scenario: str,
    kind: str,
    *,
    recipe: str,
    max_staleness: int | None = None,
    artifacts_endpoint_url: str | None = None,
    rule: Rule = "latest",
    select: Slice | None = None,
    metric: str = "score",
    judgments: bool = True,
) -> tuple[Snapshot, Experience]:
    """collect -> materialize; returns the snapshot and the experience it came from. `rule`
    picks the report that counts among several on the same receipts (the recipe's); `select`
    is the slice the recipe learns from (`reef.select`); `metric` what its scores are
    (`reef.metric`)."""
    store = open_store(database_url)
    try:
        experience = collect(
            store,
            scenario,
            kind,
            recipe=recipe,
            max_staleness=max_staleness,
            rule=rule,
            select=select,
            metric=metric,
            judgments=judgments,
        )
    finally:
        store.close()
    artifacts = open_artifacts(artifacts_url, endpoint_url=artifacts_endpoint_url)
    return materialize(experience, kind, artifacts), experience


@task(retries=0, cache_policy=NO_CACHE)
@timed("validate")
def validate_snapshot(
    snapshot: Snapshot,
    artifacts_url: str,
    *,
    max_context: int | None = None,
    max_staleness: int | None = None,
    artifacts_endpoint_url: str | None = None,
) -> ValidationReport:
    """contracts.validate; a ContractViolation fails the task with its readable report."""
    table = load(open_artifacts(artifacts_url, endpoint_url=artifacts_endpoint_url), snapshot.key)
    return validate(table, snapshot.kind, max_context=max_context, max_staleness=max_staleness)


@task(retries=2, retry_delay_seconds=5, cache_policy=NO_CACHE)
@timed("consume")
def consume(
    database_url: str,
    experience: Experience,
    sample_ids: set[str],
    batch_id: str,
) -> int:
    """Consumption receipts for the samples a run trained on (accepted or not): late or repeated
    feedback never trains them again for this recipe. Evaluation samples are never consumed
    (reef.evaluation_pool)."""
    return _store_receipts(database_url, batch_receipts(experience, sample_ids, batch_id))


def batch_receipts(
    experience: Experience, sample_ids: set[str], batch_id: str
) -> list[Consumption]:
    """The consumption receipts of the samples a run trained on (reef.experience.receipts):
    what `consume` writes, or, for a published batch, the head's compare-and-swap."""
    from reef.experience import receipts

    samples = [s for s in experience.samples if s.sample_id in sample_ids]
    return receipts(experience.scenario, experience.recipe, samples, batch_id)


@task(retries=2, retry_delay_seconds=5, cache_policy=NO_CACHE)
def add_receipts(database_url: str, receipts: list[Consumption]) -> int:
    """Store consumption receipts (idempotent: a receipt already stored stays)."""
    return _store_receipts(database_url, receipts)


def _store_receipts(database_url: str, receipts: list[Consumption]) -> int:
    store = open_store(database_url)
    try:
        store.add_consumptions(receipts)
        return len(receipts)
    finally:
        store.close()


@task(retries=2, retry_delay_seconds=5, cache_policy=NO_CACHE)
@timed("pool")
def evaluation_samples(
    database_url: str,
    scenario: str,
    kind: str,
    *,
    recipe: str,
    share: float,
    max_n: int,
    max_age_s: float,
    rule: Rule = "latest",
    select: Slice | None = None,
    metric: str = "score",
    judgments: bool = True,
) -> list[dict[str, Any]]:
    """The scenario's evaluation pool as dataset rows (reef.evaluation_pool): its evaluation
    samples of any staleness (of the slice `select`, scored by `metric`), the newest `max_n`
    no older than `max_age_s`."""
    from reef.evaluation_pool import pool

    store = open_store(database_url)
    try:
        experience = collect(
            store,
            scenario,
            kind,
            recipe=recipe,
            max_staleness=None,
            rule=rule,
            select=select,
            metric=metric,
            judgments=judgments,
        )
    finally:
        store.close()
    return pool(experience, share, max_n=max_n, max_age_s=max_age_s)


@flow(name="materialize-experience")
def materialize_experience(
    scenario: str,
    kind: str,
    database_url: str | None = None,
    artifacts_url: str | None = None,
    tracking_uri: str | None = None,
    max_staleness: int | None = 0,
    recipe: str | None = None,
    max_context: int | None = None,
    artifacts_endpoint_url: str | None = None,
    context: str = "training",
    config: str | None = None,
) -> dict[str, Any]:
    """Materialize and validate a scenario's experience inside an MLflow run of experiment
    "reef/<scenario>"; the snapshot becomes the run's dataset input only once it passed its
    contract (a violation fails the run and the flow). Returns the snapshot's uri and hash.

    URLs left out come from the settings where the flow runs (`config`, a YAML file, and the
    REEF_* environment): leave `database_url` out when it carries a password, since a flow
    run's parameters are stored and shown in the Prefect UI."""
    import mlflow

    from reef.settings import load_settings
    from reef.tracking import log_snapshot_input

    if database_url is None or artifacts_url is None or tracking_uri is None:
        settings = load_settings(config)
        database_url = database_url or settings.database_url
        artifacts_url = artifacts_url or settings.artifacts_url
        tracking_uri = tracking_uri or settings.tracking_uri
        artifacts_endpoint_url = artifacts_endpoint_url or settings.artifacts.s3_endpoint_url
    recipe = recipe or _recipe_for(kind)
    snapshot, experience = materialize_snapshot(
        database_url,
        artifacts_url,
        scenario,
        kind,
        recipe=recipe,
        max_staleness=max_staleness,
        artifacts_endpoint_url=artifacts_endpoint_url,
    )
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment(f"reef/{scenario}")
    with mlflow.start_run(run_name=f"materialize-{kind}") as run:
        asked = {
            "scenario": scenario,
            "kind": kind,
            "recipe": recipe,
            "max_staleness": max_staleness,
            "max_context": max_context,
        }
        _log_materialized(snapshot, experience, asked)
        try:
            validate_snapshot(
                snapshot,
                artifacts_url,
                max_context=max_context,
                max_staleness=max_staleness,
                artifacts_endpoint_url=artifacts_endpoint_url,
            )
        except ContractViolation as e:
            # the run ends FAILED (start_run's exit) with the report readable in the UI
            mlflow.set_tag("reef.contract_violation", e.message[:5000])
            raise
        log_snapshot_input(snapshot, context=context)
    return {
        "uri": snapshot.uri,
        "content_hash": snapshot.content_hash,
        "rows": snapshot.rows,
        "run_id": run.info.run_id,
    }


def _log_materialized(snapshot: Snapshot, experience: Experience, asked: dict[str, Any]) -> None:
    """In the run open now: what was asked and the snapshot made (parameters), and how many
    rows it has, how many records await feedback and why samples were dropped (metrics)."""
    import mlflow

    from reef.tracking import public_params

    mlflow.log_params(
        public_params(
            {
                **asked,
                "snapshot_uri": snapshot.uri,
                "content_hash": snapshot.content_hash,
            }
        )
    )
    mlflow.log_metrics(
        {
            "rows": snapshot.rows,
            "awaiting_feedback": experience.awaiting_feedback,
            **{f"dropped_{reason}": n for reason, n in sorted(experience.dropped.items())},
        }
    )


def _recipe_for(kind: str) -> str:
    # the first built-in recipe that takes this kind: its consumption receipts count
    return next((name for name in RECIPES if recipe_class(name).kind == kind), "sft")
