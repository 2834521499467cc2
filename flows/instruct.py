"""The instruct flow behind POST /reef/train: a user's plain-language ask becomes a harness
candidate, evaluated against the head and always held for review (`promote` releases it).

By default the ask is written verbatim as a rule; with `instruct_mode: model` the proposer
writes the change, and the rule is the fallback. Each step is written to the job the user
polls.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prefect import flow, get_run_logger

from reef.artifacts import artifacts_for
from reef.deploy.engine import EngineAdmin
from reef.errors import ReefError
from reef.flows import stages
from reef.flows.experience import materialize_snapshot
from reef.flows.harness import eval_tasks, evaluate, generator, head_harness, proposer
from reef.flows.release import gate, held_for_review, log_gate, register_harness
from reef.gate import Decision
from reef.harness import Harness, diff
from reef.provenance import Provenance
from reef.recipe import recipe_class
from reef.recipes.harness.episodes import PairedEvaluation
from reef.recipes.harness.propose import (
    apply_valid,
    instruction_messages,
    parse_edits,
    served,
    with_instruction,
)
from reef.recipes.harness.recipe import HarnessParams, HarnessRecipe
from reef.records import Candidate, Release
from reef.settings import Settings, load_settings
from reef.store.sql import open_store
from reef.tracking import public_params

log = logging.getLogger(__name__)

# A step of the job, written where the user polls it: its name and details.
Step = Callable[..., None]


@flow(name="instruct")
def instruct(
    scenario: str,
    job_id: str,
    config: str | None = None,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Turn the job's plain-language ask into a harness candidate, evaluate it against the head,
    and hold it for review. Each step is written to the job, which the user polls."""
    import mlflow

    from reef import registry
    from reef.recipe import load_recipe

    settings = load_settings(config, **(overrides or {}))
    store = open_store(settings.database_url)
    logger = get_run_logger()

    def step(name: str, **detail: Any) -> None:
        logger.info("%s: %s %s", job_id, name, json.dumps(detail, default=str)[:500])
        store.update_job(scenario, job_id, status="running", step={"step": name, **detail})

    try:
        job = store.get_job(scenario, job_id)
        ask = str(job.request["text"])
        recipe = load_recipe("harness", settings.reef.params if _harness_params(settings) else {})
        assert isinstance(recipe, HarnessRecipe)
        head = store.head_release(scenario)
        current = head_harness(settings, head)
        experiment = registry.ensure_experiment(
            settings.tracking_uri, f"reef/{scenario}", settings.mlflow_artifact_location
        )
        mlflow.set_tracking_uri(settings.tracking_uri)
        with (
            registry.s3_endpoint(settings.artifacts.s3_endpoint_url),
            mlflow.start_run(experiment_id=experiment, run_name="instruct") as run,
            stages.clock() as times,
        ):
            started = time.perf_counter()
            _log_params(job_id, ask, head, recipe)
            trial = _try_instruction(settings, recipe, head, current, ask, step)
            candidate, decision = _hold_for_review(settings, head, trial, run.info.run_id, step)
            stages.record(times, started, logger, job_id)
        out = {
            "candidate_id": candidate.id,
            "status": candidate.status,
            "source": trial.source,
            "diff": trial.changes,
            "gate": decision.as_dict(),
            "evaluation": trial.result.metrics(),
            "model_uri": candidate.model_uri,
            "run_id": run.info.run_id,
        }
        store.update_job(
            scenario,
            job_id,
            status="done",
            candidate_id=candidate.id,
            result=out,
            step={"step": "pending_review", "candidate_id": candidate.id},
        )
        return out
    except Exception as e:
        message = e.message if isinstance(e, ReefError) else f"{type(e).__name__}: {e}"
        store.update_job(
            scenario, job_id, status="failed", message=message, step={"step": "failed"}
        )
        raise
    finally:
        store.close()


def _log_params(job_id: str, ask: str, head: Release, recipe: HarnessRecipe) -> None:
    """What the run was asked, on which head, with which recipe parameters."""
    import mlflow

    mlflow.log_params(
        public_params(
            {
                "scenario": head.scenario,
                "job_id": job_id,
                "ask": ask[:500],
                "head_release_id": head.id,
                **{f"params.{k}": v for k, v in recipe.describe()["params"].items()},
            }
        )
    )


@dataclass(frozen=True)
class _Trial:
    """The harness an ask made and how it did against the head's."""

    new: Harness
    source: str  # "proposer" or "rule" (see _instructed)
    changes: dict[str, Any]  # diff(head's harness, new)
    dataset_id: str | None  # the scored snapshot evaluated on (None when it had no rows)
    result: PairedEvaluation


def _try_instruction(
    settings: Settings,
    recipe: HarnessRecipe,
    head: Release,
    current: Harness,
    ask: str,
    step: Step,
) -> _Trial:
    """Propose the change the ask makes to the head's harness, then evaluate it against the
    head on the scored snapshot (or the configured tasks), in the run open now."""
    import mlflow

    from reef.datasets import load

    p: HarnessParams = recipe.params
    step("proposing", head_release_id=head.id, mode=p.instruct_mode)
    admin = EngineAdmin.for_settings(settings)
    try:
        new, source = _instructed(admin, head, current, ask, p)
        changes = diff(current, new)
        mlflow.set_tag("reef.harness_source", source)
        mlflow.log_dict(changes, "harness_diff.json")
        mlflow.log_dict(dict(new.files), "harness_files.json")
        step("proposed", source=source, diff=changes)
        snapshot, _ = materialize_snapshot(
            settings.database_url,
            settings.artifacts_url,
            head.scenario,
            "scored",
            recipe="instruct",
            artifacts_endpoint_url=settings.artifacts.s3_endpoint_url,
        )
        rows = load(artifacts_for(settings), snapshot.key).to_pylist() if snapshot.rows else []
        tasks, scorer = eval_tasks(settings, recipe, rows)
        tasks = tasks[: p.max_examples]
        step("evaluating", tasks=len(tasks), repeats=p.repeats)
        generate = generator(admin, head.scenario, head.id, p)
        result = evaluate(settings, generate, tasks, scorer, new, current, head, p)
    finally:
        admin.close()
    dataset_id = snapshot.content_hash if snapshot.rows else None
    return _Trial(new, source, changes, dataset_id, result)


def _hold_for_review(
    settings: Settings, head: Release, trial: _Trial, run_id: str, step: Step
) -> tuple[Candidate, Decision]:
    """The gate's decision on the trial, logged, and the candidate registered with it: held
    for review whatever the gate said (an instruction is released by a person)."""
    decision = held_for_review(
        gate(trial.result.candidate, trial.result.head, settings),
        "an instruction's candidate waits for review (promote it to release it)",
    )
    step(
        "evaluated",
        **trial.result.metrics(),
        mean_candidate=decision.mean_candidate,
        mean_head=decision.mean_head,
    )
    metrics = {**trial.result.metrics(), **decision.metrics()}
    log_gate(decision, trial.result.__dict__, metrics)
    made = Provenance(
        recipe="instruct", dataset_id=trial.dataset_id, metrics=metrics, run_id=run_id
    )
    return register_harness(settings, head, trial.new, decision, made).candidate, decision


def _harness_params(settings: Settings) -> bool:
    """Whether reef.params are a harness recipe's (they configure the instruct flow too)."""
    return issubclass(recipe_class(settings.reef.recipe), HarnessRecipe)


def _instructed(
    admin: EngineAdmin, head: Release, current: Harness, ask: str, p: HarnessParams
) -> tuple[Harness, str]:
    """The harness with the ask applied: the proposer's edits in "model" mode when they change
    something valid; the ask as a rule otherwise."""
    if p.instruct_mode == "model":
        try:
            reply = proposer(admin, head.scenario, head.id, p)(instruction_messages(current, ask))
            new = apply_valid(current, parse_edits(reply, current))
            if new.content_hash() != current.content_hash():
                return served(new, current), "proposer"
        except ReefError as e:
            log.warning("proposer failed (%s); writing the ask as a rule", e.message)
    return served(with_instruction(current, ask), current), "rule"
