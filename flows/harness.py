"""Harness evolution in the loop: the evolve flow's path for the harness recipe, and the
instruct flow behind POST /reef/train.

Both make a harness candidate the same way weights candidates are made: the candidate is
evaluated against the head on the same tasks (paired episodes on the head's weights, N
repeats, the head's scores cached), the gate of #4 decides on the numbers, and publishing
registers it (artifact tree, MLflow model version with the harness files, candidates row) for
the same deploy step. What differs:

- `make_candidate` (evolve flow, recipe "harness"): GEPA searches from the low-scored
  answers of the batch; the gate decides.
- `instruct` (a flow of its own): a user's plain-language ask becomes the change; the
  candidate is always held for review (`promote`), with the evaluation's numbers beside it.
- A candidate that adds executable content (extensions, scripts) is held for review whatever
  the gate said.

Episodes and the proposer reach the serving engine through its admin routes, so they run on
exactly the weights that serve the scenario, and nothing they generate is recorded as traffic.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import httpx
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from deploy.engine import DeployError, EngineAdmin
from flows.evolve import _artifacts, _settings, gate_policy, log_gate
from recipes.harness.episodes import (
    EpisodeError,
    Generate,
    PairedEvaluation,
    Scorer,
    Task,
    paired_evaluation,
    task_set,
    tasks_from_rows,
)
from recipes.harness.propose import (
    Ask,
    apply_valid,
    instruction_messages,
    parse_edits,
    served,
    with_instruction,
)
from recipes.harness.recipe import HarnessJob, HarnessParams, HarnessRecipe, HarnessSearch
from reef.errors import EngineUnavailable, ReefError
from reef.gate import Decision, decide
from reef.harness import (
    Harness,
    HarnessCache,
    adds_executable,
    diff,
    harness_candidate,
    harness_release,
    register_harness,
    store_harness,
)
from reef.records import Candidate, Release, new_id
from reef.settings import Settings
from reef.store.sql import open_store

log = logging.getLogger(__name__)


# the model calls ---------------------------------------------------------------------------
def engine_admin(settings: Settings) -> EngineAdmin:
    token = settings.reef.engine_token.get_secret_value() if settings.reef.engine_token else None
    return EngineAdmin(settings.engine_url, token)


def generator(admin: EngineAdmin, scenario: str, release_id: str, p: HarnessParams) -> Generate:
    """Episode generations on `release_id`'s weights, sampled at the recipe's temperature."""

    def generate(messages: list[dict[str, Any]], seed: int) -> str:
        try:
            return admin.generate(
                scenario,
                messages,
                release_id=release_id,
                max_tokens=p.max_tokens,
                temperature=p.temperature,
                seed=seed,
            )
        except EngineUnavailable as e:
            raise EpisodeError(e.message, infra=True) from None
        except DeployError as e:  # the engine refused this request: the harness's doing
            raise EpisodeError(e.message, infra=False) from None

    return generate


def proposer(admin: EngineAdmin, scenario: str, release_id: str, p: HarnessParams) -> Ask:
    """The proposer model: a configured OpenAI-compatible upstream, or the served model."""
    if p.proposer_url:
        key = os.environ.get(p.proposer_api_key_env)
        headers = {"authorization": f"Bearer {key}"} if key else {}
        url = p.proposer_url.rstrip("/") + "/chat/completions"

        def ask_upstream(messages: list[dict[str, Any]]) -> str:
            body = {
                "model": p.proposer_model or "default",
                "messages": messages,
                "max_tokens": p.proposer_max_tokens,
                "temperature": 0.0,
            }
            try:
                r = httpx.post(url, json=body, headers=headers, timeout=600.0)
            except httpx.HTTPError as e:
                raise ReefError(f"proposer at {url} unreachable: {e}") from None
            if r.status_code >= 400:
                raise ReefError(f"proposer at {url}: {r.status_code} {r.text[:300]}")
            return str(r.json()["choices"][0]["message"].get("content") or "")

        return ask_upstream

    def ask_served(messages: list[dict[str, Any]]) -> str:
        return admin.generate(
            scenario,
            messages,
            release_id=release_id,
            max_tokens=p.proposer_max_tokens,
            temperature=0.0,
        )

    return ask_served


def head_harness(settings: Settings, head: Release) -> Harness:
    cache = HarnessCache(_artifacts(settings), settings.server.state_dir.resolve() / "cache")
    return cache.get(head) or Harness.empty()


# tasks -------------------------------------------------------------------------------------
@task(retries=0, cache_policy=NO_CACHE)
def search(recipe: HarnessRecipe, job: HarnessJob) -> HarnessSearch:
    """GEPA's search from the batch's low-scored answers, with a line per step."""
    logger = get_run_logger()
    return recipe.search(job, lambda message: logger.info("search: %s", message))


@task(retries=0, cache_policy=NO_CACHE)
def evaluate(
    settings: Settings,
    generate: Generate,
    tasks: list[Task],
    scorer: Scorer,
    candidate: Harness,
    head: Harness,
    head_release: Release,
    p: HarnessParams,
) -> PairedEvaluation:
    """Paired episodes, candidate vs head, N repeats; the head's scores cached per head."""
    logger = get_run_logger()
    artifacts = _artifacts(settings)
    key = f"harness-eval/{head_release.scenario}/{head_release.id}.json"
    cache: dict[str, float] = json.loads(artifacts.get_bytes(key)) if artifacts.exists(key) else {}
    before = len(cache)
    shown = [0]

    def progress(done: int, total: int) -> None:
        if done == total or done - shown[0] >= max(2, total // 5):
            shown[0] = done
            logger.info("evaluation: %d/%d episodes", done, total)

    result = paired_evaluation(
        generate,
        tasks,
        candidate,
        head,
        repeats=p.repeats,
        scorer=scorer,
        weights_id=head_release.weights_id,
        sampling={"temperature": p.temperature, "max_tokens": p.max_tokens},
        cache=cache,
        progress=progress,
    )
    if len(cache) > before:
        artifacts.put_bytes(key, json.dumps(cache, sort_keys=True).encode())
    logger.info(
        "evaluation: %d tasks paired, %d head episodes cached, %d infrastructure failures",
        len(result.task_ids),
        result.head_cached,
        result.infra_failures,
    )
    if tasks and not result.task_ids and result.infra_failures:
        raise ReefError(
            f"evaluation failed: the engine could not answer {result.infra_failures} episodes "
            "and no task completed on both sides",
            code="engine_unavailable",
        )
    return result


def held_for_review(decision: Decision, reason: str) -> Decision:
    """The gate's numbers, but pending: a human must look first."""
    from dataclasses import replace

    return replace(decision, status="pending", reason=f"{reason}; the gate says: {decision.reason}")


@task(retries=2, retry_delay_seconds=5, cache_policy=NO_CACHE)
def publish(
    settings: Settings,
    head: Release,
    harness: Harness,
    decision: Decision,
    *,
    recipe: str,
    dataset_id: str | None,
    metrics: dict[str, float],
    run_id: str | None,
) -> Candidate:
    """The harness's files to the artifact store, a model version in MLflow (its files as
    artifacts, the same tags as weights), a candidates row that keeps the head's weights."""
    ref = store_harness(_artifacts(settings), head.scenario, harness)
    release_id = new_id("rel")
    model_uri = register_harness(
        settings,
        harness_release(head, ref, id=release_id),
        harness,
        recipe=recipe,
        gate=decision.status,
        dataset_id=dataset_id,
        metrics=metrics,
        run_id=run_id,
    )
    status = {"accepted": "pending", "pending": "pending", "rejected": "rejected"}[decision.status]
    candidate = harness_candidate(
        head,
        ref,
        release_id,
        status=status,
        recipe=recipe,
        gate=decision.as_dict(),
        model_uri=model_uri,
        dataset_id=dataset_id,
        metrics=metrics,
        message=None if decision.status == "accepted" else decision.reason,
    )
    store = open_store(settings.database_url)
    try:
        return store.add_candidate(candidate)
    finally:
        store.close()


def eval_tasks(
    settings: Settings, recipe: HarnessRecipe, held_out: list[dict[str, Any]]
) -> tuple[list[Task], Scorer]:
    """The gate's tasks: the configured task set with its scorer, or the held-out reported
    prompts the recipe's scorer can score."""
    from reef.recipe import import_object

    gate = settings.gate
    if gate.eval_dataset is not None:
        scorer = import_object(gate.scorer, "gate.scorer") if gate.scorer else recipe.task_scorer()
        return task_set(gate.eval_dataset), scorer
    return recipe.scorable(tasks_from_rows(held_out)), recipe.task_scorer()


def make_candidate(
    settings: Settings,
    recipe: HarnessRecipe,
    head: Release,
    train_rows: list[dict[str, Any]],
    held_out: list[dict[str, Any]],
    dataset_id: str,
    run_id: str,
) -> tuple[Candidate, Decision] | dict[str, Any]:
    """Search, evaluate, gate and publish one harness candidate (the evolve flow's harness
    path, inside its MLflow run). Returns the candidate and the decision, or what happened
    instead (nothing to learn from, no proposal)."""
    import mlflow

    p: HarnessParams = recipe.params
    current = head_harness(settings, head)
    low = [r for r in train_rows if float(r["score"]) < p.threshold]
    tasks = recipe.scorable(tasks_from_rows(low))
    if not tasks:
        return {"status": "nothing_to_train", "reason": "no low-scored answer the scorer can score"}
    admin = engine_admin(settings)
    try:
        generate = generator(admin, head.scenario, head.id, p)
        job = HarnessJob(
            scenario=head.scenario,
            head=current,
            tasks=tasks,
            generate=generate,
            ask=proposer(admin, head.scenario, head.id, p),
            scorer=recipe.task_scorer(),
            seed=settings.reef.seed,
        )
        found = search(recipe, job)
        mlflow.log_metrics(found.metrics)
        if found.harness is None:
            return {"status": "nothing_to_train", "reason": "the proposer changed nothing"}
        new = served(found.harness, current)
        mlflow.set_tag("reef.harness_source", found.source)
        mlflow.log_dict(diff(current, new), "harness_diff.json")
        mlflow.log_dict(dict(new.files), "harness_files.json")
        gate_tasks, scorer = eval_tasks(settings, recipe, held_out)
        result = evaluate(settings, generate, gate_tasks, scorer, new, current, head, p)
    finally:
        admin.close()
    decision = decide(result.candidate, result.head, gate_policy(settings))
    added = adds_executable(current, new)
    if added:
        decision = held_for_review(decision, f"adds executable content ({', '.join(added)})")
    metrics = {**found.metrics, **result.metrics(), **decision.metrics()}
    log_gate(decision, result.__dict__, metrics)
    candidate = publish(
        settings,
        head,
        new,
        decision,
        recipe=recipe.name,
        dataset_id=dataset_id,
        metrics=metrics,
        run_id=run_id,
    )
    return candidate, decision


# the instruct flow (POST /reef/train) ------------------------------------------------------
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

    from flows.experience import materialize_snapshot
    from reef import registry
    from reef.datasets import load
    from reef.recipe import load_recipe

    settings = _settings(config, overrides)
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
        p: HarnessParams = recipe.params
        head = store.head_release(scenario)
        current = head_harness(settings, head)
        experiment = registry.ensure_experiment(
            settings.tracking_uri, f"reef/{scenario}", settings.mlflow_artifact_location
        )
        mlflow.set_tracking_uri(settings.tracking_uri)
        with (
            registry.s3_endpoint(settings.artifacts.s3_endpoint_url),
            mlflow.start_run(experiment_id=experiment, run_name="instruct") as run,
        ):
            mlflow.log_params(
                {
                    "scenario": scenario,
                    "job_id": job_id,
                    "ask": ask[:500],
                    "head_release_id": head.id,
                    **{f"params.{k}": v for k, v in recipe.describe()["params"].items()},
                }
            )
            step("proposing", head_release_id=head.id, mode=p.instruct_mode)
            admin = engine_admin(settings)
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
                    scenario,
                    "scored",
                    recipe="instruct",
                    artifacts_endpoint_url=settings.artifacts.s3_endpoint_url,
                )
                rows = load(_artifacts(settings), snapshot.key).to_pylist() if snapshot.rows else []
                tasks, scorer = eval_tasks(settings, recipe, rows)
                tasks = tasks[: p.max_examples]
                step("evaluating", tasks=len(tasks), repeats=p.repeats)
                generate = generator(admin, scenario, head.id, p)
                result = evaluate(settings, generate, tasks, scorer, new, current, head, p)
            finally:
                admin.close()
            decision = held_for_review(
                decide(result.candidate, result.head, gate_policy(settings)),
                "an instruction's candidate waits for review (promote it to release it)",
            )
            step(
                "evaluated",
                **result.metrics(),
                mean_candidate=decision.mean_candidate,
                mean_head=decision.mean_head,
            )
            metrics = {**result.metrics(), **decision.metrics()}
            log_gate(decision, result.__dict__, metrics)
            candidate = publish(
                settings,
                head,
                new,
                decision,
                recipe="instruct",
                dataset_id=snapshot.content_hash if snapshot.rows else None,
                metrics=metrics,
                run_id=run.info.run_id,
            )
        out = {
            "candidate_id": candidate.id,
            "status": candidate.status,
            "source": source,
            "diff": changes,
            "gate": decision.as_dict(),
            "evaluation": result.metrics(),
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


def _harness_params(settings: Settings) -> bool:
    """Whether reef.params are the harness recipe's (they configure the instruct flow too)."""
    return settings.reef.recipe in ("harness", "recipes.harness.recipe:HarnessRecipe")


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
