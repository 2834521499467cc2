"""The evolve flow: materialize → validate → train or search → evaluate → gate → register →
release.

The flow runs in a worker process (the local evolve worker `reef serve` starts, or a Prefect
worker of the `evolve` deployment), never in the API process. Each step is a task in the module
of its noun: flows.experience (materialize, validate, consume), flows.weights or flows.harness
(the recipe's candidate, evaluated and judged by the gate), flows.release (register, approval,
deploy). The flow itself is four steps: `prepare` (settings, recipe, head), `take_batch` (the
validated snapshot, split into train and held-out rows), `make_candidate` (by the recipe's
target) and `release_candidate` (the gate's verdict carried out). Everything is logged to one MLflow run of experiment "reef/<scenario>": parameters,
training and evaluation metrics, the gate's numbers, the dataset snapshot as the run's input,
and the candidate as a model version.

A failed or rejected run leaves serving untouched: the head moves only in the deploy task, by
compare-and-swap, after the engine has loaded and smoke-tested the candidate.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from prefect import flow, get_run_logger

from reef import cores, evaluation_pool, events, faults, telemetry
from reef.artifacts import artifacts_for
from reef.datasets import Snapshot, load
from reef.errors import NothingToTrain, ReefError
from reef.experience import Experience, reports_of
from reef.flows import composite, harness, stages, weights
from reef.flows.experience import (
    batch_receipts,
    consume,
    evaluation_samples,
    materialize_snapshot,
    validate_snapshot,
)
from reef.flows.release import Registered, keep_guard_answers, prefect_run, recover, release
from reef.judge import judge_quality
from reef.readiness import EMPTY_POOL, judge_refusal
from reef.recipe import Recipe, WeightsRecipe, load_recipe
from reef.recipes.composite.recipe import CompositeRecipe
from reef.recipes.harness.recipe import HarnessRecipe
from reef.records import Release, new_id
from reef.settings import Settings, load_settings
from reef.store.sql import open_store


@dataclass(frozen=True)
class Prepared:
    """What one run evolves: its settings (with the recipe's own gate), the recipe, the head
    it starts from and, for a weights recipe, the model files it trains from."""

    scenario: str
    settings: Settings
    recipe: Recipe
    head: Release
    model: Path | None  # None: a harness recipe keeps the weights (weights, composite: set)


@dataclass(frozen=True)
class Batch:
    """The run's batch: the validated snapshot and the rows it trains on and holds out."""

    snapshot: Snapshot
    experience: Experience
    train_rows: list[dict[str, Any]]
    held_out: list[dict[str, Any]]

    @property
    def trained_ids(self) -> set[str]:
        return {r["sample_id"] for r in self.train_rows}


@dataclass(frozen=True)
class NotReady:
    """Why the run trains nothing yet: fewer eligible samples than a batch, or the recipe
    waits for more (e.g. a grid not complete)."""

    eligible: int
    batch_size: int
    reason: str | None = None

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "status": "not_ready",
            "eligible": self.eligible,
            "batch_size": self.batch_size,
        }
        return out if self.reason is None else {**out, "reason": self.reason}


@flow(name="evolve")
def evolve(
    scenario: str,
    config: str | None = None,
    overrides: dict[str, Any] | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Evolve `scenario` once from its eligible experience. Returns what happened: status
    "not_ready" | "nothing_to_train" | "rejected" | "pending" | "published" | "canary" (it
    serves a share of sessions first: rollout.mode canary), with the candidate and release
    ids. The run and its four steps are spans (telemetry.otlp_endpoint); a run that raises is
    an `evolve.failed` event (events.webhooks)."""
    settings = load_settings(config, **(overrides or {}))
    traces = telemetry.for_process(settings.telemetry)
    try:
        with traces.span("reef.evolve", {"reef.scenario": scenario, "reef.forced": force}) as span:
            span.set({"reef.flow_run_id": prefect_run().get("flow_run_id")})
            result = _evolve(scenario, settings, force, traces)
            span.set(_outcome(result))
        return result
    except Exception as e:
        _failed(settings, scenario, e)
        raise
    finally:
        traces.flush()


def _evolve(
    scenario: str, settings: Settings, force: bool, traces: telemetry.Telemetry
) -> dict[str, Any]:
    """The four steps, each a span of its own; each stage's seconds in the MLflow run."""
    with stages.clock() as times:
        return _steps(scenario, settings, force, traces, times, time.perf_counter())


def _steps(
    scenario: str,
    settings: Settings,
    force: bool,
    traces: telemetry.Telemetry,
    times: dict[str, float],
    started: float,
) -> dict[str, Any]:
    import mlflow

    with traces.span("reef.evolve.prepare", {"reef.scenario": scenario}) as span:
        run = prepare(scenario, settings)
        span.set({"reef.recipe": run.recipe.name, "reef.head_release_id": run.head.id})
    with traces.span("reef.evolve.take_batch", {"reef.scenario": scenario}) as span:
        batch = take_batch(run, force)
        if isinstance(batch, NotReady):
            span.set({"reef.status": "not_ready", "reef.eligible": batch.eligible})
            return batch.result()
        span.set({"reef.train_rows": len(batch.train_rows), "reef.held_out": len(batch.held_out)})
    with tracked(run, batch) as run_id:
        try:
            with traces.span("reef.evolve.make_candidate", {"mlflow.run_id": run_id}) as span:
                registered = make_candidate(run, batch, run_id)
                span.set(_outcome({"candidate_id": registered.candidate.id}))
        except NothingToTrain as e:
            # Nothing in this batch can teach the recipe (e.g. no answer passed the threshold):
            # consume it, or every new report would retrain on it again.
            mlflow.set_tag("reef.nothing_to_train", e.message[:5000])
            consume(run.settings.database_url, batch.experience, batch.trained_ids, new_id("batch"))
            return {"status": "nothing_to_train", "reason": e.message}
        with traces.span("reef.evolve.release_candidate", {"mlflow.run_id": run_id}) as span:
            result = release_candidate(run, batch, registered, run_id)
            span.set(_outcome(result))
        stages.record(times, started, get_run_logger(), scenario)
        return result


def _outcome(result: dict[str, Any]) -> dict[str, Any]:
    """A run's (or step's) result as span attributes."""
    gate = result.get("gate") or {}
    return {
        "reef.status": result.get("status"),
        "reef.candidate_id": result.get("candidate_id"),
        "reef.release_id": result.get("release_id"),
        "reef.gate.status": gate.get("status"),
        "reef.gate.broken_guard": gate.get("broken_guard"),
        "mlflow.run_id": result.get("run_id"),
    }


def _failed(settings: Settings, scenario: str, error: Exception) -> None:
    """The run raised: an `evolve.failed` event for the webhooks that take it (the failure is
    durable already: nothing of the run was released). Storing it never hides the error."""
    message = error.message if isinstance(error, ReefError) else f"{type(error).__name__}: {error}"
    data = {"error": message[:2000], **prefect_run()}
    found = events.deliveries(settings.events, "evolve.failed", scenario, data)
    if not found:
        return
    try:
        store = open_store(settings.database_url)
        try:
            events.add(store, found)
        finally:
            store.close()
    except Exception as e:
        get_run_logger().warning("storing the evolve.failed event of %s failed: %s", scenario, e)


@stages.timed("prepare")
def prepare(scenario: str, settings: Settings) -> Prepared:
    """The scenario's settings (`scenarios.<name>` and the run-time ones over the top-level
    ones), its recipe (with
    its own gate when the configuration names none), the head and the model a weights recipe
    trains from."""
    from reef.scenario_settings import learning_settings

    store = open_store(settings.database_url)
    try:
        settings = learning_settings(settings, store, scenario)
    finally:
        store.close()
    loop = settings.reef
    # Training shares the machine with the serving engine: measured on 2 cores, SmolLM2 SFT
    # steps ran 3-5x slower on 2 threads than on 1 while the engine answered, and 0.6-0.7x
    # the time while it did not (bench/train_while_serving.py): `auto` chooses per step.
    cores.use(loop.train_threads)
    recipe = load_recipe(loop.recipe, loop.params)
    if recipe.default_gate is not None and "policy" not in settings.gate.model_fields_set:
        # The recipe's own gate when the configuration names none (tttd: `always`).
        gate = settings.gate.model_copy(update={"policy": recipe.default_gate})
        settings = settings.model_copy(update={"gate": gate})
    # A harness recipe keeps the weights: it needs no weights of its own (any engine serves).
    model = weights.base_model(settings) if recipe.target != "harness" else None
    store = open_store(settings.database_url)
    try:
        store.ensure_scenario(scenario)
    finally:
        store.close()
    recover(settings, scenario)  # what a run that died left, before this one starts
    store = open_store(settings.database_url)
    try:
        head = store.head_release(scenario)
    finally:
        store.close()
    return Prepared(scenario, settings, recipe, head, model)


def _judge_refused(run: Prepared) -> str | None:
    """Why the judge's verdicts may not train this run (judge.min_agreement not shown)."""
    own = run.settings.judge
    if own.min_agreement is None:
        return None
    store = open_store(run.settings.database_url)
    try:
        quality = judge_quality(reports_of(store, run.scenario), own.agreement_window)
    finally:
        store.close()
    return judge_refusal(quality, own.min_agreement)


def take_batch(run: Prepared, force: bool) -> Batch | NotReady:
    """Materialize and validate the eligible experience, let the recipe select its rows (the
    rows it can never train on are consumed now), and split off the gate's held-out rows."""
    settings, recipe, loop = run.settings, run.recipe, run.settings.reef
    refused = _judge_refused(run)
    if refused:  # the judge's verdicts count for nothing this run; people's reports still train
        get_run_logger().warning("%s: %s; its verdicts do not train", run.scenario, refused)
    snapshot, experience = materialize_snapshot(
        settings.database_url,
        settings.artifacts_url,
        run.scenario,
        recipe.kind,
        recipe=loop.recipe,
        max_staleness=loop.max_staleness,
        artifacts_endpoint_url=settings.artifacts.s3_endpoint_url,
        rule=recipe.report_rule,
        select=loop.select.slice(),
        metric=loop.metric,
        judgments=refused is None,
    )
    faults.reached("materialized", run.scenario)
    if snapshot.rows < loop.batch_size and not (force and snapshot.rows):
        get_run_logger().info(
            "%s: %d eligible samples of %d needed", run.scenario, snapshot.rows, loop.batch_size
        )
        return NotReady(snapshot.rows, loop.batch_size)
    validate_snapshot(
        snapshot,
        settings.artifacts_url,
        max_staleness=loop.max_staleness,
        artifacts_endpoint_url=settings.artifacts.s3_endpoint_url,
    )
    selection = recipe.select(load(artifacts_for(settings), snapshot.key).to_pylist())
    if selection.discard:  # rows that can never train (e.g. a grid of mixed releases)
        discarded = {r["sample_id"] for r in selection.discard}
        consume(settings.database_url, experience, discarded, new_id("batch"))
    if selection.waiting is not None:
        get_run_logger().info("%s: %s", run.scenario, selection.waiting)
        return NotReady(snapshot.rows, loop.batch_size, selection.waiting)
    # Evaluation samples never train; the gate scores the scenario's pool of them, gathered
    # across rounds (reef.evaluation_pool), not just this batch's.
    share = 0.0 if selection.whole else evaluation_pool.fraction(settings)
    train_rows, _ = evaluation_pool.split(selection.rows, share)
    if len(train_rows) < loop.batch_size and not (force and train_rows):
        get_run_logger().info(
            "%s: %d training samples of %d", run.scenario, len(train_rows), loop.batch_size
        )
        return NotReady(len(train_rows), loop.batch_size, None)
    held_out = (
        evaluation_samples(
            settings.database_url,
            run.scenario,
            recipe.kind,
            recipe=loop.recipe,
            share=share,
            max_n=settings.gate.pool_max,
            max_age_s=settings.gate.pool_max_age_s,
            rule=recipe.report_rule,
            select=loop.select.slice(),
            metric=loop.metric,
            judgments=refused is None,
        )
        if share
        else []
    )
    if share and not held_out:  # nothing to decide on: keep the batch for when there is
        get_run_logger().info("%s: %s", run.scenario, EMPTY_POOL)
        return NotReady(len(train_rows), loop.batch_size, EMPTY_POOL)
    return Batch(snapshot, experience, train_rows, held_out)


@contextmanager
def tracked(run: Prepared, batch: Batch) -> Iterator[str]:
    """The run's MLflow run in experiment "reef/<scenario>", with its parameters and the
    snapshot as its input; yields the MLflow run id."""
    import mlflow

    from reef import registry
    from reef.tracking import log_snapshot_input, public_params

    settings, recipe = run.settings, run.recipe
    experiment = registry.ensure_experiment(
        settings.tracking_uri, f"reef/{run.scenario}", settings.mlflow_artifact_location
    )
    mlflow.set_tracking_uri(settings.tracking_uri)
    with (
        registry.s3_endpoint(settings.artifacts.s3_endpoint_url),
        mlflow.start_run(experiment_id=experiment, run_name=f"evolve-{recipe.name}") as active,
    ):
        mlflow.log_params(
            public_params(
                {
                    "scenario": run.scenario,
                    "recipe": settings.reef.recipe,
                    "batch_size": settings.reef.batch_size,
                    "max_staleness": settings.reef.max_staleness,
                    "head_release_id": run.head.id,
                    "train_rows": len(batch.train_rows),
                    "held_out_rows": len(batch.held_out),
                    **{f"gate.{k}": v for k, v in settings.gate.model_dump().items()},
                    **{f"params.{k}": v for k, v in recipe.describe()["params"].items()},
                }
            )
        )
        log_snapshot_input(batch.snapshot, context="training")
        yield active.info.run_id


def make_candidate(run: Prepared, batch: Batch, run_id: str) -> Registered:
    """The recipe's candidate, judged by the gate and registered: trained weights, a searched
    harness, or both (by the recipe's target). Raises NothingToTrain."""
    if run.recipe.target == "harness":
        return harness.candidate(
            run.settings,
            cast(HarnessRecipe, run.recipe),
            run.head,
            batch.train_rows,
            batch.held_out,
            batch.snapshot.content_hash,
            run_id,
        )
    assert run.model is not None  # prepare found it for every weights recipe
    if run.recipe.target == "composite":  # a harness step and a weights step, one candidate
        return composite.candidate(
            run.settings,
            cast(CompositeRecipe, run.recipe),
            run.model,
            run.head,
            batch.snapshot,
            batch.train_rows,
            batch.held_out,
            run_id,
        )
    return weights.candidate(
        run.settings,
        cast(WeightsRecipe, run.recipe),
        run.model,
        run.head,
        batch.snapshot,
        batch.train_rows,
        batch.held_out,
        run_id,
    )


def release_candidate(
    run: Prepared, batch: Batch, registered: Registered, run_id: str
) -> dict[str, Any]:
    """Carry out the gate's verdict (flows.release); the run's result."""
    candidate, decision = registered.candidate, registered.decision

    # The batch is consumed once the run has decided its candidate (rejected, declined, or
    # published: then in the head's swap); a run that fails before that leaves it eligible,
    # so it is tried again.
    receipts = batch_receipts(batch.experience, batch.trained_ids, candidate.id)

    result: dict[str, Any] = {
        "status": candidate.status,
        "candidate_id": candidate.id,
        "model_uri": candidate.model_uri,
        "gate": decision.as_dict(),
        "dataset": batch.snapshot.manifest(),
        "run_id": run_id,
    }
    if registered.steps is not None:  # composite: which step passed its gate, and why
        result["steps"] = registered.steps
    # before the verdict is carried out: a manual gate may wait days for its approval
    kept = keep_guard_answers(run.settings, registered)
    if kept:
        result["guard_answers_kept"] = kept
    return {**result, **release(run.settings, registered, receipts)}
