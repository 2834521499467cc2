"""The evolve flow: materialize → validate → train → evaluate → gate → publish → deploy.

Each task is a thin call into reef/, recipes/ or deploy/. The flow runs in a worker process
(the local evolve worker `reef serve` starts, or a Prefect worker of the `evolve` deployment),
never in the API process; training runs inside it. Everything is logged to one MLflow run of
experiment "reef/<scenario>": parameters, training and evaluation metrics, the gate's numbers,
the dataset snapshot as the run's input, and the candidate as a model version.

A failed or rejected run leaves serving untouched: the head moves only in `deploy`, by
compare-and-swap, after the engine has loaded and smoke-tested the candidate.

- `publish` registers the candidate: its files in the artifact store, a model version of
  `reef-<scenario>` in MLflow with the gate's result, a row in the candidates table.
- `manual` gate: the candidate waits as pending. The flow pauses for input (approve it in the
  Prefect UI), and a watcher resumes it when someone sets the tag `reef.approval` =
  approved|rejected on the candidate's MLflow model version, or promotes it through Reef.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.experience import materialize_snapshot, validate_snapshot
from reef.artifacts import ArtifactStore, open_artifacts, tree_hash
from reef.errors import ReefError
from reef.gate import Decision, GatePolicy, decide
from reef.recipe import Recipe, Trained, TrainJob, load_recipe
from reef.records import Candidate, Release, new_id, utcnow
from reef.settings import Settings, load_settings
from reef.store.sql import open_store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Evaluation:
    """Paired per-sample scores of the candidate and the head on the same evaluation set."""

    method: str  # "replay" | "tasks" | "none"
    sample_ids: list[str]
    candidate: list[float]
    head: list[float]
    seconds: float


def _settings(config: str | None, overrides: dict[str, Any] | None) -> Settings:
    return load_settings(Path(config) if config else None, **(overrides or {}))


def _artifacts(settings: Settings) -> ArtifactStore:
    return open_artifacts(
        settings.artifacts_url,
        endpoint_url=settings.artifacts.s3_endpoint_url,
        region=settings.artifacts.s3_region,
    )


def _base_model(settings: Settings) -> Path:
    from reef.models import resolve_model

    if settings.engine.kind == "upstream":  # vLLM serves engine.model's files, as embedded does
        raise ReefError(
            f"evolving weights needs the model's weights; engine '{settings.engine.kind}' "
            "serves a remote model",
            code="not_trainable",
        )
    return resolve_model(settings.engine.model, settings.engine.model_cache)


def _cache(settings: Settings) -> Path:
    return (settings.server.state_dir / "cache").resolve()


def _release_files(settings: Settings, release: Release) -> Path | None:
    key = release.metadata.get("artifact_key")
    if release.kind == "base" or not key:
        return None
    return _artifacts(settings).fetch_tree(str(key), _cache(settings) / str(key))


def _split_key(row: dict[str, Any]) -> str:
    # By content (the prompt), not by the random ids: the same traffic always holds out the
    # same prompts, so a rerun or a replay of the same experience is reproducible.
    content = str(row.get("messages") or row["sample_id"]) + str(row.get("completion", ""))
    return hashlib.sha256(content.encode()).hexdigest()


def split(rows: list[dict[str, Any]], holdout: float) -> tuple[list[dict], list[dict]]:
    """Deterministic train/held-out split: `holdout` of the rows (at least one, never all)."""
    if holdout <= 0 or len(rows) < 2:
        return rows, []
    ranked = sorted(rows, key=_split_key)
    n = min(len(rows) - 1, max(1, round(holdout * len(rows))))
    held = {r["sample_id"] for r in ranked[:n]}
    return [r for r in rows if r["sample_id"] not in held], [
        r for r in rows if r["sample_id"] in held
    ]


# tasks --------------------------------------------------------------------------------------
@task(retries=0, cache_policy=NO_CACHE)
def train(recipe: Recipe, job: TrainJob) -> Trained:
    """recipe.train in this worker process, with a progress line per logged step."""
    logger = get_run_logger()
    last = [0.0, -1]

    def progress(step: int, total: int, metrics: Any) -> None:
        now = time.monotonic()
        if step != last[1] and (now - last[0] > 2 or step == total):
            last[0], last[1] = now, step
            shown = ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())[:6])
            logger.info("train step %d/%d %s", step, total, shown)

    return recipe.train(job, progress)


@task(retries=0, cache_policy=NO_CACHE)
def evaluate(
    recipe: Recipe,
    settings: Settings,
    base_model: Path,
    head: Release,
    candidate: Trained,
    held_out: list[dict[str, Any]],
) -> Evaluation:
    """Score the head and the candidate on the same samples (recipes.evaluate)."""
    from recipes import evaluate as ev
    from reef.recipe import import_object

    started = time.monotonic()
    gate = settings.gate
    scorer = import_object(gate.scorer, "gate.scorer") if gate.scorer else recipe.scorer()
    if gate.eval_dataset is not None:
        if scorer is None:
            raise ReefError("gate.eval_dataset needs a scorer (gate.scorer or the recipe's)")
        samples, method = ev.task_samples(gate.eval_dataset), "tasks"
    elif scorer is not None and held_out:
        samples = [ev.EvalSample(r["sample_id"], json.loads(r["messages"])) for r in held_out]
        method = "tasks"
    else:
        threshold = float(getattr(recipe.params, "threshold", 0.5))
        samples, method = ev.replay_samples(held_out, threshold), "replay"
    if not samples:
        return Evaluation("none", [], [], [], 0.0)

    def scores(kind: str, path: Path | None) -> list[float]:
        model, tokenizer = ev.load_model(base_model, kind, path)
        if method == "replay":
            return ev.replay_scores(model, tokenizer, samples)
        assert scorer is not None
        return ev.task_scores(model, tokenizer, samples, scorer, gate.max_tokens)[0]

    head_scores = scores(head.kind, _release_files(settings, head))
    cand_scores = scores(candidate.kind, candidate.path)
    return Evaluation(
        method,
        [s.sample_id for s in samples],
        cand_scores,
        head_scores,
        round(time.monotonic() - started, 3),
    )


def gate_policy(settings: Settings) -> GatePolicy:
    g = settings.gate
    return GatePolicy(
        policy=g.policy,
        margin=g.margin,
        confidence=g.confidence,
        test=g.test,
        bootstrap_samples=g.bootstrap_samples,
        seed=settings.reef.seed,
    )


@task(retries=0, cache_policy=NO_CACHE)
def gate(evaluation: Evaluation, settings: Settings) -> Decision:
    return decide(evaluation.candidate, evaluation.head, gate_policy(settings))


def log_gate(decision: Decision, evaluation: dict[str, Any], metrics: dict[str, float]) -> None:
    """The gate's verdict in the flow's MLflow run (metrics, tags, gate.json) and its log."""
    import mlflow

    mlflow.log_metrics(metrics)
    mlflow.set_tags({"reef.gate": decision.status, "reef.gate_reason": decision.reason[:5000]})
    mlflow.log_dict({"decision": decision.as_dict(), "evaluation": evaluation}, "gate.json")
    get_run_logger().info("gate: %s — %s", decision.status, decision.reason)


@task(retries=2, retry_delay_seconds=5, cache_policy=NO_CACHE)
def publish(
    settings: Settings,
    scenario: str,
    recipe: Recipe,
    head: Release,
    trained: Trained,
    decision: Decision,
    dataset_id: str,
    metrics: dict[str, float],
    run_id: str,
    base_model: Path,
) -> Candidate:
    """The candidate's files to the artifact store, a model version in MLflow, a row in the
    candidates table (pending, or rejected with the gate's reason)."""
    from reef import registry

    digest = tree_hash(trained.path)
    key = f"releases/{scenario}/{digest}"
    uri = _artifacts(settings).put_tree(key, trained.path)
    release_id = new_id("rel")
    status = {"accepted": "pending", "pending": "pending", "rejected": "rejected"}[decision.status]
    model_uri = registry.register_candidate(
        settings.tracking_uri,
        scenario,
        release_id,
        trained.path,
        kind=trained.kind,
        parent_id=head.id,
        content_hash=digest,
        recipe=recipe.name,
        dataset_id=dataset_id,
        metrics=metrics,
        gate=decision.status,
        run_id=run_id,
        base_model=str(base_model),
        artifact_location=settings.mlflow_artifact_location,
        s3_endpoint_url=settings.artifacts.s3_endpoint_url,
    )
    now = utcnow()
    candidate = Candidate(
        id=release_id,
        scenario=scenario,
        parent_id=head.id,
        kind=trained.kind,
        created_at=now,
        status=status,
        uri=uri,
        content_hash=digest,
        recipe=recipe.name,
        dataset_id=dataset_id,
        metrics=metrics,
        gate=decision.as_dict(),
        model_uri=model_uri,
        updated_at=now,
        message=None if decision.status != "rejected" else decision.reason,
    )
    store = open_store(settings.database_url)
    try:
        return store.add_candidate(candidate)
    finally:
        store.close()


@task(retries=2, retry_delay_seconds=5, cache_policy=NO_CACHE)
def deploy(settings: Settings, candidate: Candidate, operation: str | None = None) -> Release:
    """Stage + verify in the serving engine, then move the head (CAS) and the MLflow alias."""
    from deploy.engine import EngineAdmin
    from deploy.release import deploy as deploy_release
    from reef import registry

    logger = get_run_logger()
    token = settings.reef.engine_token.get_secret_value() if settings.reef.engine_token else None
    admin = EngineAdmin(settings.engine_url, token)
    store = open_store(settings.database_url)
    try:

        def mirror(release: Release) -> None:
            if release.model_uri:
                registry.set_champion(settings.tracking_uri, release.scenario, release.model_uri)

        release, timings = deploy_release(
            store,
            admin,
            candidate.release(operation),
            keep=max(2, settings.reef.max_staleness + 1),
            mirror=mirror,
        )
        store.set_candidate_status(
            candidate.scenario, candidate.id, "published", expected=candidate.status
        )
        logger.info(
            "release %s (seq %d) is the head of %s: %s",
            release.id,
            release.seq,
            release.scenario,
            timings,
        )
        return release
    except ReefError as e:
        with contextlib.suppress(ReefError):  # a promote may have claimed it meanwhile
            store.set_candidate_status(
                candidate.scenario, candidate.id, "failed", expected="pending", message=e.message
            )
        raise
    finally:
        store.close()
        admin.close()


def wait_for_approval(settings: Settings, candidate: Candidate) -> tuple[bool, str]:
    """Pause the flow run for input; a watcher resumes it on an MLflow tag or a promote."""
    from prefect.context import FlowRunContext
    from prefect.flow_runs import pause_flow_run, resume_flow_run
    from prefect.input import RunInput

    from reef import registry

    class Approval(RunInput):
        approve: bool
        note: str = ""

    ctx = FlowRunContext.get()
    assert ctx is not None and ctx.flow_run is not None
    flow_run_id = ctx.flow_run.id
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(2.0):
            try:
                tag = registry.approval(settings.tracking_uri, candidate.model_uri or "")
                store = open_store(settings.database_url)
                try:
                    status = store.get_candidate(candidate.scenario, candidate.id).status
                finally:
                    store.close()
            except Exception as e:  # keep watching: the pause still waits for the UI
                log.warning("approval watcher: %s", e)
                continue
            answer = None
            if status != "pending":
                answer = {"approve": False, "note": f"candidate is {status} (decided in Reef)"}
            elif tag in ("approved", "rejected"):
                answer = {"approve": tag == "approved", "note": f"MLflow tag reef.approval={tag}"}
            if answer is not None:
                resume_flow_run(flow_run_id, run_input=answer)
                return

    watcher = threading.Thread(target=watch, name="reef-approval-watcher", daemon=True)
    watcher.start()
    try:
        got = pause_flow_run(
            wait_for_input=Approval,
            timeout=int(settings.gate.approval_timeout_s),
            poll_interval=2,
            key=f"approve-{candidate.id.lower().replace('_', '-')}",
        )
    finally:
        stop.set()
    return bool(got.approve), got.note or ("approved in Prefect" if got.approve else "rejected")


def _consume(
    settings: Settings,
    scenario: str,
    recipe: str,
    experience: Any,
    sample_ids: set[str],
    batch_id: str,
) -> None:
    """Consumption receipts for the samples a run trained on (accepted or not): late or repeated
    feedback never trains them again for this recipe. Held-out samples stay eligible."""
    from reef.experience import consume

    store = open_store(settings.database_url)
    try:
        samples = [s for s in experience.samples if s.sample_id in sample_ids]
        consume(store, scenario, recipe, samples, batch_id)
    finally:
        store.close()


def _weights_candidate(
    settings: Settings,
    recipe: Recipe,
    base_model: Path,
    head: Release,
    snapshot: Any,
    train_rows: list[dict[str, Any]],
    held_out: list[dict[str, Any]],
    run_id: str,
) -> tuple[Candidate, Decision] | dict[str, Any]:
    """Train, evaluate, gate and publish one weights candidate (inside the flow's MLflow run);
    or what happened instead when the batch has nothing to teach the recipe."""
    import mlflow
    import pyarrow as pa

    with tempfile.TemporaryDirectory(prefix="reef-candidate-") as tmp:
        job = TrainJob(
            scenario=head.scenario,
            base_model=base_model,
            dataset=pa.Table.from_pylist(train_rows, schema=snapshot.schema),
            out_dir=Path(tmp) / "candidate",
            parent_kind=head.kind if head.kind in ("adapter", "checkpoint") else "base",  # type: ignore[arg-type]
            parent_path=_release_files(settings, head),
            seed=settings.reef.seed,
        )
        try:
            trained = train(recipe, job)
        except ReefError as e:
            if e.code != "nothing_to_train":
                raise
            return {"status": "nothing_to_train", "reason": e.message}
        mlflow.log_metrics(trained.metrics)
        evaluation = evaluate(recipe, settings, base_model, head, trained, held_out)
        decision = gate(evaluation, settings)
        metrics = {
            **trained.metrics,
            "eval_samples": float(len(evaluation.sample_ids)),
            "eval_seconds": evaluation.seconds,
            **decision.metrics(),
        }
        log_gate(decision, evaluation.__dict__, metrics)
        candidate = publish(
            settings,
            head.scenario,
            recipe,
            head,
            trained,
            decision,
            snapshot.content_hash,
            metrics,
            run_id,
            base_model,
        )
    return candidate, decision


# the flow -----------------------------------------------------------------------------------
@flow(name="evolve")
def evolve(
    scenario: str,
    config: str | None = None,
    overrides: dict[str, Any] | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Evolve `scenario` once from its eligible experience. Returns what happened: status
    "not_ready" | "rejected" | "pending" | "published", with the candidate and release ids."""
    import mlflow

    from reef import registry
    from reef.tracking import log_snapshot_input

    logger = get_run_logger()
    settings = _settings(config, overrides)
    loop = settings.reef
    if loop.train_threads:
        import torch

        # Training shares the machine with the serving engine: measured on 2 cores, SmolLM2
        # SFT steps ran 3-4x slower on torch's default 2 threads than on 1.
        torch.set_num_threads(loop.train_threads)
    recipe = load_recipe(loop.recipe, loop.params)
    evolves_harness = recipe.target == "harness"
    # A harness recipe keeps the weights: it needs no weights of its own (any engine serves).
    base_model = None if evolves_harness else _base_model(settings)
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

    from reef.datasets import load

    rows = load(_artifacts(settings), snapshot.key).to_pylist()
    holdout = 0.0 if settings.gate.policy == "always" else settings.gate.holdout
    train_rows, held_out = split(rows, holdout)
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
        log_snapshot_input(snapshot, context="training")
        made: tuple[Candidate, Decision] | dict[str, Any]
        if evolves_harness:
            from flows.harness import make_candidate

            made = make_candidate(
                settings,
                recipe,  # type: ignore[arg-type]
                head,
                train_rows,
                held_out,
                snapshot.content_hash,
                run.info.run_id,
            )
        else:
            assert base_model is not None
            made = _weights_candidate(
                settings, recipe, base_model, head, snapshot, train_rows, held_out, run.info.run_id
            )
        if isinstance(made, dict):
            # Nothing in this batch can teach the recipe (e.g. no answer passed the threshold):
            # consume it, or every new report would retrain on it again.
            mlflow.set_tag("reef.nothing_to_train", str(made["reason"])[:5000])
            _consume(settings, scenario, loop.recipe, experience, trained_ids, new_id("batch"))
            return made
        candidate, decision = made

        # The batch is consumed once the run has decided its candidate (rejected, declined, or
        # published); a run that fails before that leaves it eligible, so it is tried again.
        def consumed() -> None:
            _consume(settings, scenario, loop.recipe, experience, trained_ids, candidate.id)

        result: dict[str, Any] = {
            "status": candidate.status,
            "candidate_id": candidate.id,
            "model_uri": candidate.model_uri,
            "gate": decision.as_dict(),
            "dataset": snapshot.manifest(),
            "run_id": run.info.run_id,
        }
        if decision.status == "rejected":
            consumed()
            registry.mark(settings.tracking_uri, candidate.model_uri or "", "rejected")
            return result
        if decision.status == "pending":
            approved, note = wait_for_approval(settings, candidate)
            logger.info("candidate %s: %s", candidate.id, note)
            mlflow.set_tag("reef.approval", note)
            if not approved:
                consumed()
                store = open_store(settings.database_url)
                try:
                    current = store.get_candidate(scenario, candidate.id)
                    if current.status == "pending":
                        store.set_candidate_status(
                            scenario, candidate.id, "rejected", expected="pending", message=note
                        )
                        registry.mark(settings.tracking_uri, candidate.model_uri or "", "rejected")
                    return {**result, "status": store.get_candidate(scenario, candidate.id).status}
                finally:
                    store.close()
        release = deploy(settings, replace(candidate, status="pending"))
        consumed()
        mlflow.set_tag("reef.release_id", release.id)
        return {**result, "status": "published", "release_id": release.id, "seq": release.seq}
