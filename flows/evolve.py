"""The evolve flow: materialize → validate → train or search → evaluate → gate → register →
release.

The flow runs in a worker process (the local evolve worker `reef serve` starts, or a Prefect
worker of the `evolve` deployment), never in the API process. Each step is a task in the module
of its noun: flows.experience (materialize, validate, consume), flows.weights or flows.harness
(the recipe's candidate, evaluated and judged by the gate), flows.release (register, approval,
deploy). Everything is logged to one MLflow run of experiment "reef/<scenario>": parameters,
training and evaluation metrics, the gate's numbers, the dataset snapshot as the run's input,
and the candidate as a model version.

A failed or rejected run leaves serving untouched: the head moves only in the deploy task, by
compare-and-swap, after the engine has loaded and smoke-tested the candidate.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from flows import harness, weights
from flows.experience import consume, evaluation_samples, materialize_snapshot, validate_snapshot
from flows.release import release
from recipes.harness.recipe import HarnessRecipe
from reef import evaluation_pool
from reef.artifacts import artifacts_for
from reef.datasets import load
from reef.gate import Decision
from reef.recipe import WeightsRecipe, load_recipe
from reef.records import Candidate, new_id
from reef.settings import load_settings
from reef.store.sql import open_store


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
    ids."""
    import mlflow

    from reef import registry
    from reef.tracking import log_snapshot_input, public_params

    logger = get_run_logger()
    settings = load_settings(config, **(overrides or {}))
    loop = settings.reef
    if loop.train_threads:
        import torch

        # Training shares the machine with the serving engine: measured on 2 cores, SmolLM2
        # SFT steps ran 3-4x slower on torch's default 2 threads than on 1.
        torch.set_num_threads(loop.train_threads)
    recipe = load_recipe(loop.recipe, loop.params)
    if recipe.default_gate is not None and "policy" not in settings.gate.model_fields_set:
        # The recipe's own gate when the configuration names none (tttd: `always`).
        gate = settings.gate.model_copy(update={"policy": recipe.default_gate})
        settings = settings.model_copy(update={"gate": gate})
    # A harness recipe keeps the weights: it needs no weights of its own (any engine serves).
    model = weights.base_model(settings) if isinstance(recipe, WeightsRecipe) else None
    store = open_store(settings.database_url)
    try:
        store.ensure_scenario(scenario)
        head = store.head_release(scenario)
    finally:
        store.close()

    snapshot, experience = materialize_snapshot(
        settings.database_url,
        settings.artifacts_url,
        scenario,
        recipe.kind,
        recipe=loop.recipe,
        max_staleness=loop.max_staleness,
        artifacts_endpoint_url=settings.artifacts.s3_endpoint_url,
        rule=recipe.report_rule,
    )
    if snapshot.rows < loop.batch_size and not (force and snapshot.rows):
        logger.info(
            "%s: %d eligible samples of %d needed", scenario, snapshot.rows, loop.batch_size
        )
        return {"status": "not_ready", "eligible": snapshot.rows, "batch_size": loop.batch_size}
    validate_snapshot(
        snapshot,
        settings.artifacts_url,
        max_staleness=loop.max_staleness,
        artifacts_endpoint_url=settings.artifacts.s3_endpoint_url,
    )
    selection = recipe.select(load(artifacts_for(settings), snapshot.key).to_pylist())
    if selection.discard:  # rows that can never train (e.g. a grid of mixed releases)
        consume(
            settings.database_url,
            experience,
            {r["sample_id"] for r in selection.discard},
            new_id("batch"),
        )
    if selection.waiting is not None:
        logger.info("%s: %s", scenario, selection.waiting)
        return {
            "status": "not_ready",
            "eligible": snapshot.rows,
            "batch_size": loop.batch_size,
            "reason": selection.waiting,
        }
    # Evaluation samples never train; the gate scores the scenario's pool of them, gathered
    # across rounds (reef.evaluation_pool), not just this batch's.
    share = 0.0 if selection.whole else evaluation_pool.fraction(settings)
    train_rows, _ = evaluation_pool.split(selection.rows, share)
    if len(train_rows) < loop.batch_size and not (force and train_rows):
        logger.info("%s: %d training samples of %d", scenario, len(train_rows), loop.batch_size)
        return {"status": "not_ready", "eligible": len(train_rows), "batch_size": loop.batch_size}
    held_out = (
        evaluation_samples(
            settings.database_url,
            scenario,
            recipe.kind,
            recipe=loop.recipe,
            share=share,
            max_n=settings.gate.pool_max,
            max_age_s=settings.gate.pool_max_age_s,
            rule=recipe.report_rule,
        )
        if share
        else []
    )
    trained_ids = {r["sample_id"] for r in train_rows}

    experiment = registry.ensure_experiment(
        settings.tracking_uri, f"reef/{scenario}", settings.mlflow_artifact_location
    )
    mlflow.set_tracking_uri(settings.tracking_uri)
    with (
        registry.s3_endpoint(settings.artifacts.s3_endpoint_url),
        mlflow.start_run(experiment_id=experiment, run_name=f"evolve-{recipe.name}") as run,
    ):
        mlflow.log_params(
            public_params(
                {
                    "scenario": scenario,
                    "recipe": loop.recipe,
                    "batch_size": loop.batch_size,
                    "max_staleness": loop.max_staleness,
                    "head_release_id": head.id,
                    "train_rows": len(train_rows),
                    "held_out_rows": len(held_out),
                    **{f"gate.{k}": v for k, v in settings.gate.model_dump().items()},
                    **{f"params.{k}": v for k, v in recipe.describe()["params"].items()},
                }
            )
        )
        log_snapshot_input(snapshot, context="training")
        run_id = run.info.run_id
        made: tuple[Candidate, Decision] | dict[str, Any]
        if isinstance(recipe, HarnessRecipe):
            made = harness.candidate(
                settings, recipe, head, train_rows, held_out, snapshot.content_hash, run_id
            )
        else:
            assert isinstance(recipe, WeightsRecipe) and model is not None
            made = weights.candidate(
                settings, recipe, model, head, snapshot, train_rows, held_out, run_id
            )
        if isinstance(made, dict):
            # Nothing in this batch can teach the recipe (e.g. no answer passed the threshold):
            # consume it, or every new report would retrain on it again.
            mlflow.set_tag("reef.nothing_to_train", str(made["reason"])[:5000])
            consume(settings.database_url, experience, trained_ids, new_id("batch"))
            return made
        candidate, decision = made

        # The batch is consumed once the run has decided its candidate (rejected, declined, or
        # published); a run that fails before that leaves it eligible, so it is tried again.
        def consumed() -> None:
            consume(settings.database_url, experience, trained_ids, candidate.id)

        result: dict[str, Any] = {
            "status": candidate.status,
            "candidate_id": candidate.id,
            "model_uri": candidate.model_uri,
            "gate": decision.as_dict(),
            "dataset": snapshot.manifest(),
            "run_id": run_id,
        }
        return {**result, **release(settings, candidate, decision, consumed)}
