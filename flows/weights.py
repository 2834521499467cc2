"""The evolve flow's path for weight recipes: train a candidate, score it against the head on
the same samples, let the gate decide, register it.

Training runs in this worker process (never in the API process), or in `reef.train.processes`
ranks under accelerate launch on this host, continuing from the head's files, with a progress
line per logged step. Evaluation loads both models here too.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from reef import cores, faults, guard_answers
from reef.deploy.chain import ReleaseChain
from reef.errors import NothingToTrain, ReefError
from reef.flows.release import Registered, gate, log_gate, register_weights
from reef.flows.stages import timed
from reef.gate import Decision
from reef.guard_answers import GuardAnswer
from reef.harness import Harness
from reef.provenance import Provenance
from reef.recipe import Trained, TrainJob, WeightsRecipe, import_object
from reef.recipes.scorers import scorer_named
from reef.records import Release
from reef.settings import LoopSettings, Settings


@dataclass(frozen=True)
class Evaluation:
    """Paired per-sample scores of the candidate and the head on the same evaluation set."""

    method: str  # "replay" | "tasks" | "none"
    sample_ids: list[str]
    candidate: list[float]
    head: list[float]
    seconds: float
    # per guard (gate.guards): the candidate's and the head's scores on its task set
    guards: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)
    # the candidate's answers the guards' scorers failed (reef.guard_answers), for review
    failed: list[GuardAnswer] = field(default_factory=list)

    def logged(self) -> dict[str, Any]:
        """What the run's gate.json holds of it: the scores, not the failed answers' texts."""
        return {k: v for k, v in self.__dict__.items() if k != "failed"}


def base_model(settings: Settings) -> Path:
    """The served model's files, which weight recipes train from."""
    from reef.models import resolve_model

    if settings.engine.kind == "upstream":  # vLLM serves engine.model's files, as embedded does
        raise ReefError(
            f"evolving weights needs the model's weights; engine '{settings.engine.kind}' "
            "serves a remote model",
            code="not_trainable",
        )
    return resolve_model(settings.engine.model, settings.engine.model_cache)


def head_files(settings: Settings, head: Release) -> Path | None:
    """A local copy of the head's weights files (None for the base)."""
    with ReleaseChain.for_settings(settings) as chain:
        return chain.files(head)


# One training in this process at a time: accelerate keeps its state per process, and two
# trainers in two threads (two scenarios' evolve runs in one worker) reset it under each other
# ("`AcceleratorState` object has no attribute `num_processes`", seen in tests/faults).
_IN_PROCESS = threading.Lock()


@task(retries=0, cache_policy=NO_CACHE)
@timed("train")
def train(recipe: WeightsRecipe, job: TrainJob, loop: LoopSettings) -> Trained:
    """recipe.train in this worker process, or in `reef.train.processes` processes under
    accelerate launch on this host (recipes.distributed), with a progress line per logged
    step."""
    logger = get_run_logger()
    last = [0.0, -1]

    def progress(step: int, total: int, metrics: Any) -> None:
        threads = cores.adapt()  # the next step's (reef.train_threads: auto measures)
        now = time.monotonic()
        if step != last[1] and (now - last[0] > 2 or step == total):
            last[0], last[1] = now, step
            shown = ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())[:6])
            logger.info("train step %d/%d %s (next on %d threads)", step, total, shown, threads)

    if loop.train.processes > 1:
        from reef.recipes.distributed import launch

        logger.info("training in %d processes (accelerate launch)", loop.train.processes)
        return launch(
            recipe,
            job,
            processes=loop.train.processes,
            accelerate_config=loop.train.accelerate_config,
            # each rank's threads are fixed at launch: auto gives each one core's share
            threads=loop.train_threads if isinstance(loop.train_threads, int) else None,
            progress=progress,
        )
    with _IN_PROCESS:
        cores.adapt()
        return recipe.train(job, progress)


# The head's replay log-probs per sample, across rounds: a release's weights never change, and
# the gate scores the same head on a pool that mostly stays from one round to the next (every
# round while candidates are rejected). A few releases at a time, the latest kept.
_HEAD_LOGPROBS: dict[str, dict[str, float]] = {}
_HEAD_LOCK = threading.Lock()
HEAD_RELEASES_KEPT = 8


def head_logprobs(
    release_id: str, samples: list[Any], compute: Callable[[list[Any]], list[float]]
) -> list[float]:
    """The replay log-probs of `samples` under release `release_id`: those this process has
    computed for that release before, the others by `compute(missing_samples)`."""
    from reef.recipes import evaluate as ev

    keys = [ev.replay_key(s) for s in samples]
    with _HEAD_LOCK:
        known = dict(_HEAD_LOGPROBS.get(release_id, {}))
    missing = [i for i, k in enumerate(keys) if k not in known]
    if missing:
        for i, lp in zip(missing, compute([samples[i] for i in missing]), strict=True):
            known[keys[i]] = lp
    with _HEAD_LOCK:
        _HEAD_LOGPROBS.pop(release_id, None)
        _HEAD_LOGPROBS[release_id] = known  # the newest last
        while len(_HEAD_LOGPROBS) > HEAD_RELEASES_KEPT:
            _HEAD_LOGPROBS.pop(next(iter(_HEAD_LOGPROBS)))
    return [known[k] for k in keys]


def under_harness(samples: list[Any], under: Harness | None) -> list[Any]:
    """Task-set samples (recipes.evaluate.EvalSample) as a candidate serving `under` answers
    them: with its system text in each prompt, as the engine injects it."""
    if under is None or not under.system_text():
        return samples
    return [replace(s, messages=under.inject(s.messages)) for s in samples]


@task(retries=0, cache_policy=NO_CACHE)
@timed("evaluate")
def evaluate(
    recipe: WeightsRecipe,
    settings: Settings,
    model: Path,
    head: Release,
    head_path: Path | None,
    candidate: Trained,
    held_out: list[dict[str, Any]],
    under: Harness | None = None,
) -> Evaluation:
    """Score the head and the candidate on the same samples (recipes.evaluate). `under`: the
    harness the candidate will serve with (the composite recipe's), whose system text goes
    into the task sets' prompts (gate.eval_dataset, the guards') as the engine injects it;
    `held_out` rows come rendered under it already."""
    from reef.recipes import evaluate as ev

    started = time.monotonic()
    gate_cfg = settings.gate
    scorer = import_object(gate_cfg.scorer, "gate.scorer") if gate_cfg.scorer else recipe.scorer()
    if gate_cfg.eval_dataset is not None:
        if scorer is None:
            raise ReefError("gate.eval_dataset needs a scorer (gate.scorer or the recipe's)")
        samples, method = under_harness(ev.task_samples(gate_cfg.eval_dataset), under), "tasks"
    elif scorer is not None and held_out:
        samples = [ev.EvalSample(r["sample_id"], json.loads(r["messages"])) for r in held_out]
        method = "tasks"
    else:
        threshold = float(getattr(recipe.params, "threshold", 0.5))
        samples, method = ev.replay_samples(held_out, threshold), "replay"
    guards = [
        (g.name, under_harness(ev.task_samples(g.dataset), under), scorer_named(g.scorer))
        for g in gate_cfg.guards
    ]
    if not samples and not guards:
        return Evaluation("none", [], [], [], 0.0)

    def scores(
        kind: str, path: Path | None, release_id: str | None = None
    ) -> tuple[list[float], dict[str, list[float]], dict[str, list[str]]]:
        """The model's scores on the evaluation set, and its scores and answers on each guard's
        tasks (loaded once, and only when needed: a head whose replay log-probs are all known
        and that no guard checks is not loaded at all)."""
        got: list[Any] = []

        def loaded() -> tuple[Any, Any]:
            if not got:
                got.extend(ev.load_model(model, kind, path))
            return got[0], got[1]

        on_guards: dict[str, list[float]] = {}
        answers: dict[str, list[str]] = {}
        for name, tasks, guard in guards:
            on_guards[name], answers[name] = ev.task_scores(
                *loaded(), tasks, guard, gate_cfg.max_tokens
            )
        if not samples:
            return [], on_guards, answers
        if method == "replay":
            if release_id is None:
                lps = ev.replay_logprobs(*loaded(), samples)
            else:
                lps = head_logprobs(
                    release_id, samples, lambda todo: ev.replay_logprobs(*loaded(), todo)
                )
            return ev.centered(lps, samples), on_guards, answers
        assert scorer is not None
        main = ev.task_scores(*loaded(), samples, scorer, gate_cfg.max_tokens)[0]
        return main, on_guards, answers

    head_scores, head_guards, _ = scores(head.kind, head_path, head.id)
    cand_scores, cand_guards, cand_answers = scores(candidate.kind, candidate.path)
    return Evaluation(
        method if samples else "none",
        [s.sample_id for s in samples],
        cand_scores,
        head_scores,
        round(time.monotonic() - started, 3),
        {name: (cand_guards[name], head_guards[name]) for name, _, _ in guards},
        _failed([(name, tasks) for name, tasks, _ in guards], cand_answers, cand_guards),
    )


def _failed(
    guards: list[tuple[str, list[Any]]],
    answers: dict[str, list[str]],
    scores: dict[str, list[float]],
) -> list[GuardAnswer]:
    """The candidate's answers each guard's scorer failed: (guard name, its task samples),
    with the candidate's answers and scores per guard."""
    return [
        a
        for name, tasks in guards
        for a in guard_answers.failed(
            name,
            [(t.sample_id, t.messages, t.columns or {}) for t in tasks],
            answers[name],
            scores[name],
        )
    ]


@dataclass(frozen=True)
class Judged:
    """A trained candidate the gate has judged, not yet registered: its files (in the caller's
    temporary directory), the verdict, and what made it."""

    trained: Trained
    decision: Decision
    provenance: Provenance
    failed: tuple[GuardAnswer, ...] = ()  # the candidate's answers a guard failed


def candidate(
    settings: Settings,
    recipe: WeightsRecipe,
    model: Path,
    head: Release,
    snapshot: Any,
    train_rows: list[dict[str, Any]],
    held_out: list[dict[str, Any]],
    run_id: str,
) -> Registered:
    """Train, evaluate, gate and register one weights candidate (inside the flow's MLflow
    run). Raises NothingToTrain when the batch has nothing to teach the recipe."""
    with tempfile.TemporaryDirectory(prefix="reef-candidate-") as tmp:
        got = judge(
            settings, recipe, model, head, snapshot, train_rows, held_out, run_id, Path(tmp)
        )
        trained = got.trained
        registered = register_weights(
            settings, head, trained.path, trained.kind, got.decision, got.provenance
        )
        return replace(registered, guard_answers=got.failed)


def judge(
    settings: Settings,
    recipe: WeightsRecipe,
    model: Path,
    head: Release,
    snapshot: Any,
    train_rows: list[dict[str, Any]],
    held_out: list[dict[str, Any]],
    run_id: str,
    tmp: Path,
    step: str = "",
    under: Harness | None = None,
) -> Judged:
    """Train a candidate into `tmp`, evaluate it against the head and let the gate decide
    (logged to the flow's MLflow run; `step`: the composite step it is, `under`: the harness
    it will serve with, see `evaluate`). Raises NothingToTrain."""
    import mlflow
    import pyarrow as pa

    parent = head_files(settings, head)
    job = TrainJob(
        scenario=head.scenario,
        base_model=model,
        dataset=pa.Table.from_pylist(train_rows, schema=snapshot.schema),
        out_dir=tmp / "candidate",
        parent_kind=head.kind if head.kind in ("adapter", "checkpoint") else "base",  # type: ignore[arg-type]
        parent_path=parent,
        seed=settings.reef.seed,
    )
    try:
        trained = train(recipe, job, settings.reef)
    except ReefError as e:
        if e.code != "nothing_to_train" or isinstance(e, NothingToTrain):
            raise
        # a rank's verdict that crossed a process as a plain ReefError
        raise NothingToTrain(e.message) from None
    faults.reached("trained", head.scenario)
    mlflow.log_metrics(trained.metrics)
    evaluation = evaluate(recipe, settings, model, head, parent, trained, held_out, under)
    decision = gate(evaluation.candidate, evaluation.head, settings, evaluation.guards)
    metrics = {
        **trained.metrics,
        "eval_samples": float(len(evaluation.sample_ids)),
        "eval_seconds": evaluation.seconds,
        **decision.metrics(),
    }
    log_gate(decision, evaluation.logged(), metrics, step)
    faults.reached("evaluated", head.scenario)
    made = Provenance(
        recipe=recipe.name,
        dataset_id=snapshot.content_hash,
        metrics=metrics,
        run_id=run_id,
        base_model=str(model),
        metadata=trained.metadata or {},
    )
    return Judged(trained, decision, made, tuple(evaluation.failed))
