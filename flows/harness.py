"""The evolve flow's path for harness recipes, and the harness steps the instruct flow shares.

A harness candidate is made the way a weights candidate is: it is evaluated against the head
on the same tasks (paired episodes on the head's weights, N repeats, the head's scores cached),
the gate decides on the numbers, and it is registered (artifact tree, MLflow model version
with the harness files, candidates row) for the same deploy step (flows.release).

- `candidate` (evolve flow, recipe "harness"): GEPA searches from the low-scored answers of
  the batch; the gate decides.
- A candidate that changes executable content (extensions, scripts, commands: compared with
  the head's, path -> sha256) is held for review whatever the gate said.

Episodes and the proposer reach the serving engine through its admin routes, so they run on
exactly the weights that serve the scenario, and nothing they generate is recorded as traffic.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, replace
from typing import Any

import httpx
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from reef import guard_answers
from reef.artifacts import artifacts_for
from reef.deploy.engine import DeployError, EngineAdmin
from reef.errors import EngineUnavailable, NothingToTrain, ReefError
from reef.flows.release import Registered, gate, held_for_review, log_gate, register_harness
from reef.flows.stages import timed
from reef.gate import Decision
from reef.guard_answers import GuardAnswer
from reef.harness import Harness, HarnessCache, changed_executable, diff
from reef.provenance import Provenance
from reef.recipes.harness.episodes import (
    EpisodeError,
    Generate,
    Outcome,
    PairedEvaluation,
    Scorer,
    Task,
    paired_evaluation,
    task_set,
    tasks_from_rows,
)
from reef.recipes.harness.propose import (
    Ask,
    served,
)
from reef.recipes.harness.recipe import HarnessJob, HarnessParams, HarnessRecipe, HarnessSearch
from reef.records import Release
from reef.settings import Settings

log = logging.getLogger(__name__)


# the model calls ---------------------------------------------------------------------------
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
    cache = HarnessCache(artifacts_for(settings), settings.server.state_dir.resolve() / "cache")
    return cache.get(head) or Harness.empty()


# tasks -------------------------------------------------------------------------------------
@task(retries=0, cache_policy=NO_CACHE)
@timed("search")
def search(recipe: HarnessRecipe, job: HarnessJob) -> HarnessSearch:
    """GEPA's search from the batch's low-scored answers, with a line per step."""
    logger = get_run_logger()
    return recipe.search(job, lambda message: logger.info("search: %s", message))


@task(retries=0, cache_policy=NO_CACHE)
@timed("evaluate")
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
    artifacts = artifacts_for(settings)
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


def guard_scores(
    settings: Settings,
    generate: Generate,
    candidate: Harness,
    head: Harness,
    head_release: Release,
    p: HarnessParams,
    failed: list[GuardAnswer] | None = None,
) -> dict[str, tuple[list[float], list[float]]]:
    """Paired episodes on each guard's tasks (gate.guards), scored by the guard's scorer; the
    head's episodes are not cached across runs here (the cache's key does not name a scorer).
    `failed`, when given, receives the candidate's answers a guard's scorer failed: the first
    failed episode of each task (an infrastructure failure is none: it has no answer)."""
    from reef.recipes.scorers import scorer_named

    out: dict[str, tuple[list[float], list[float]]] = {}
    for g in settings.gate.guards:
        tasks = task_set(g.dataset)
        episodes: list[Outcome] = []
        result = paired_evaluation(
            generate,
            tasks,
            candidate,
            head,
            repeats=p.repeats,
            scorer=scorer_named(g.scorer),
            weights_id=head_release.weights_id,
            sampling={"temperature": p.temperature, "max_tokens": p.max_tokens},
            cache={},
            answers=episodes,
        )
        out[g.name] = (result.candidate, result.head)
        if failed is not None:
            failed += _failed_episodes(g.name, tasks, episodes)
    return out


def _failed_episodes(guard: str, tasks: list[Task], episodes: list[Outcome]) -> list[GuardAnswer]:
    """Per task, its first candidate episode the guard's scorer failed, in task order."""
    by_id = {t.task_id: t for t in tasks}
    out: list[GuardAnswer] = []
    seen: set[str] = set()
    for e in episodes:
        if e.score is None or e.task_id in seen:
            continue
        t = by_id[e.task_id]
        got = guard_answers.failed(
            guard, [(t.task_id, t.messages, t.columns)], [e.answer], [e.score]
        )
        if got:
            seen.add(e.task_id)
            out += got
    return out


@dataclass(frozen=True)
class Judged:
    """A searched harness the gate has judged, not yet registered, and the head's harness it
    was searched from."""

    harness: Harness
    head: Harness
    decision: Decision
    provenance: Provenance
    failed: tuple[GuardAnswer, ...] = ()  # the candidate's answers a guard failed


def candidate(
    settings: Settings,
    recipe: HarnessRecipe,
    head: Release,
    train_rows: list[dict[str, Any]],
    held_out: list[dict[str, Any]],
    dataset_id: str,
    run_id: str,
) -> Registered:
    """Search, evaluate, gate and register one harness candidate (the evolve flow's harness
    path, inside its MLflow run). Raises NothingToTrain when there is nothing to learn from
    or the proposer changed nothing."""
    got = judge(settings, recipe, head, train_rows, held_out, dataset_id, run_id)
    registered = register_harness(settings, head, got.harness, got.decision, got.provenance)
    return replace(registered, guard_answers=got.failed)


def judge(
    settings: Settings,
    recipe: HarnessRecipe,
    head: Release,
    train_rows: list[dict[str, Any]],
    held_out: list[dict[str, Any]],
    dataset_id: str,
    run_id: str,
    step: str = "",
) -> Judged:
    """Search a harness from the batch's low-scored answers, evaluate it against the head's
    on the head's weights and let the gate decide (logged to the flow's MLflow run; `step`:
    the composite step it is). Raises NothingToTrain."""
    import mlflow

    p: HarnessParams = recipe.params
    current = head_harness(settings, head)
    low = [r for r in train_rows if float(r["score"]) < p.threshold]
    tasks = recipe.scorable(tasks_from_rows(low))
    if not tasks:
        raise NothingToTrain("no low-scored answer the scorer can score")
    slash = f"{step}/" if step else ""
    admin = EngineAdmin.for_settings(settings)
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
            raise NothingToTrain("the proposer changed nothing")
        new = served(found.harness, current)
        mlflow.set_tag("reef.harness_source", found.source)
        mlflow.log_dict(diff(current, new), f"{slash}harness_diff.json")
        mlflow.log_dict(dict(new.files), f"{slash}harness_files.json")
        gate_tasks, scorer = eval_tasks(settings, recipe, held_out)
        result = evaluate(settings, generate, gate_tasks, scorer, new, current, head, p)
        failed: list[GuardAnswer] = []
        on_guards = guard_scores(settings, generate, new, current, head, p, failed)
    finally:
        admin.close()
    decision = gate(result.candidate, result.head, settings, on_guards)
    changed = changed_executable(current, new)
    if changed:
        decision = held_for_review(decision, f"changes executable content ({', '.join(changed)})")
    metrics = {**found.metrics, **result.metrics(), **decision.metrics()}
    log_gate(decision, result.__dict__, metrics, step)
    made = Provenance(recipe=recipe.name, dataset_id=dataset_id, metrics=metrics, run_id=run_id)
    return Judged(new, current, decision, made, tuple(failed))
