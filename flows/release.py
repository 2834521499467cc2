"""From a judged candidate to a release: the gate, registering, approval and the deploy task.

Every step is a call into the one release path (deploy.chain.ReleaseChain), opened per task:
a task may run on another host, so it opens its own store and reaches the serving engine over
its admin routes.

- `register_weights` / `register_harness`: the candidate's files in the artifact store, a
  model version of `reef-<scenario>` in MLflow with the gate's result, a candidates row.
- `release`: what the gate's verdict means for the candidate. Rejected: tagged so in MLflow.
  Pending (`manual` gate) weights: the flow pauses for input (approve it in the Prefect UI,
  naming yourself), and a watcher resumes it when someone sets the tag `reef.approval` =
  approved|rejected (and `reef.approved_by`) on the candidate's MLflow model version, or
  promotes it through Reef. Who approved, and how, is recorded on the release. A pending
  harness candidate is never approved that way: it waits for an admin's promote through Reef
  (its files may run on clients). Accepted or approved: `deploy` stages, verifies and moves
  the head by compare-and-swap.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from reef import faults, guard_answers
from reef.deploy.chain import ReleaseChain
from reef.flows.experience import add_receipts
from reef.flows.stages import timed
from reef.gate import Decision, GatePolicy, check_guard, decide, with_guards
from reef.guard_answers import GuardAnswer
from reef.harness import Harness
from reef.provenance import Provenance
from reef.records import Candidate, Consumption, Release, utcnow
from reef.settings import Settings

log = logging.getLogger(__name__)

DEPLOY_ATTEMPTS = 3  # a deploy whose engine failed transiently is tried this often in all


@task(retries=0, cache_policy=NO_CACHE)
@timed("gate")
def gate(
    candidate: list[float],
    head: list[float],
    settings: Settings,
    guards: dict[str, tuple[list[float], list[float]]] | None = None,
) -> Decision:
    """The configured gate on paired scores (reef.gate.decide), then its guards: `guards`
    maps each configured guard's name to the candidate's and the head's scores on its tasks."""
    policy = GatePolicy.for_settings(settings)
    decision = decide(candidate, head, policy)
    if guards is None:  # a caller with no guard tasks (an operator's instruction)
        return decision
    checks = []
    for g in settings.gate.guards:
        cand, base = guards.get(g.name, ([], []))
        checks.append(check_guard(g.name, cand, base, g.max_drop, policy))
    return with_guards(decision, checks)


def held_for_review(decision: Decision, reason: str) -> Decision:
    """The gate's numbers, but pending: a human must look first."""
    return replace(decision, status="pending", reason=f"{reason}; the gate says: {decision.reason}")


def log_gate(
    decision: Decision, evaluation: dict[str, Any], metrics: dict[str, float], step: str = ""
) -> None:
    """The gate's verdict in the flow's MLflow run (metrics, tags, gate.json) and its log.
    `step`: the composite recipe's step it judged, which prefixes its metrics (`weights.`),
    tags (`reef.weights.gate`) and file (`weights/gate.json`)."""
    import mlflow

    dot, slash = (f"{step}.", f"{step}/") if step else ("", "")
    mlflow.log_metrics({f"{dot}{k}": v for k, v in metrics.items()})
    mlflow.set_tags(
        {f"reef.{dot}gate": decision.status, f"reef.{dot}gate_reason": decision.reason[:5000]}
    )
    if decision.broken_guard:
        mlflow.set_tag(f"reef.{dot}broken_guard", decision.broken_guard)
    mlflow.log_dict({"decision": decision.as_dict(), "evaluation": evaluation}, f"{slash}gate.json")
    get_run_logger().info(
        "%sgate: %s — %s", f"{step} " if step else "", decision.status, decision.reason
    )


@dataclass(frozen=True)
class Registered:
    """A candidate the gate has judged and the chain has registered: what the release step
    carries out."""

    candidate: Candidate
    decision: Decision
    # the composite recipe's steps: their order, which passed, each one's verdict and reason
    steps: dict[str, Any] | None = None
    # the candidate's answers a gate guard failed (kept for review: keep_guard_answers)
    guard_answers: tuple[GuardAnswer, ...] = ()


@task(retries=2, retry_delay_seconds=5, cache_policy=NO_CACHE)
@timed("register")
def register_weights(
    settings: Settings,
    head: Release,
    files: Path,
    kind: str,
    decision: Decision,
    provenance: Provenance,
) -> Registered:
    """Register trained weights as a candidate (pending, or rejected with the gate's reason);
    `provenance.metadata` (the recipe's, Trained.metadata) joins its release's metadata."""
    with ReleaseChain.for_settings(settings) as chain:
        made = provenance.with_metadata(prefect_run())
        candidate = chain.add_weights_candidate(head, files, kind, decision, made)
    faults.reached("registered", head.scenario)
    return Registered(candidate, decision)


@task(retries=2, retry_delay_seconds=5, cache_policy=NO_CACHE)
@timed("register")
def register_harness(
    settings: Settings,
    head: Release,
    harness: Harness,
    decision: Decision,
    provenance: Provenance,
) -> Registered:
    """Register a harness as a candidate that keeps the head's weights."""
    with ReleaseChain.for_settings(settings) as chain:
        made = provenance.with_metadata(prefect_run())
        candidate = chain.add_harness_candidate(head, harness, decision, made)
    return Registered(candidate, decision)


def keep_guard_answers(settings: Settings, registered: Registered) -> int:
    """The candidate's failed guard answers as records of its scenario, queued for review,
    where the scenario's `review.guard_failed` is on (reef.guard_answers). Returns how many
    there were. Never fails the run: the candidate's verdict does not depend on them."""
    from reef.store.sql import open_store

    answers = registered.guard_answers
    if not (answers and settings.review.guard_failed):
        return 0
    try:
        store = open_store(settings.database_url)
        try:
            kept = guard_answers.keep(store, registered.candidate, answers)
        finally:
            store.close()
    except Exception as e:
        log.warning("keeping the guard answers of %s failed: %s", registered.candidate.id, e)
        return 0
    get_run_logger().info(
        "%d answers of candidate %s a guard failed are in the review queue",
        len(kept),
        registered.candidate.id,
    )
    return len(kept)


def recover(settings: Settings, scenario: str) -> list[str]:
    """What dead runs left of the scenario's candidates, finished or retired
    (deploy.chain.ReleaseChain.recover); never fails the run that asks."""
    try:
        with ReleaseChain.for_settings(settings) as chain:
            return chain.recover(scenario)
    except Exception as e:
        log.warning("recovering the candidates of %s failed: %s", scenario, e)
        return []


def prefect_run() -> dict[str, Any]:
    """The Prefect flow run registering a candidate, for its release's metadata (the dashboard
    links it); empty outside a flow run."""
    from prefect.runtime import flow_run

    run_id = flow_run.get_id()
    return {"flow_run_id": str(run_id)} if run_id else {}


# Retried inside the chain, not by Prefect: only the chain knows whether an attempt moved the
# head, so only it can make a retry finish the job instead of publishing twice.
@task(retries=0, cache_policy=NO_CACHE)
@timed("deploy")
def deploy(
    settings: Settings,
    candidate: Candidate,
    approval: dict[str, Any] | None = None,
    receipts: Sequence[Consumption] = (),
) -> Release:
    """Stage + verify in the serving engine, then move the head (CAS, with `receipts`, the
    consumption of the candidate's batch) and the MLflow alias; exactly once per candidate
    (deploy.chain.ReleaseChain.publish)."""
    with ReleaseChain.for_settings(settings) as chain:
        release = chain.publish(
            candidate, approval=approval, attempts=DEPLOY_ATTEMPTS, consumptions=receipts
        )
    get_run_logger().info(
        "release %s (seq %d) is the head of %s", release.id, release.seq, release.scenario
    )
    return release


def release(
    settings: Settings, registered: Registered, receipts: Sequence[Consumption]
) -> dict[str, Any]:
    """Carry out the gate's verdict on a registered candidate; `receipts` mark its batch
    trained on once the candidate is decided: rejected, declined, held or a canary (stored
    then), or published (stored in the head's compare-and-swap, so that a run killed right
    after the swap cannot leave the release published and its batch unconsumed). Returns the
    status and, when published, the release."""
    import mlflow

    candidate, decision = registered.candidate, registered.decision
    logger = get_run_logger()

    def consumed() -> None:
        add_receipts(settings.database_url, list(receipts))

    if decision.status == "rejected":
        consumed()
        with ReleaseChain.for_settings(settings) as chain:
            chain.mark(candidate, "rejected")
        return {"status": candidate.status}
    approval = None
    if decision.status == "pending" and brings_harness(candidate):
        # Only an admin's promote through Reef releases a harness: not a tag, not a resume.
        consumed()
        logger.info("candidate %s waits for review: promote it through Reef", candidate.id)
        return {"status": "pending"}
    if decision.status == "pending":
        approved, note, approval = wait_for_approval(settings, candidate)
        logger.info("candidate %s: %s", candidate.id, note)
        mlflow.set_tag("reef.approval", note)
        if not approved:
            consumed()
            with ReleaseChain.for_settings(settings) as chain:
                return {"status": chain.reject(candidate, note).status}
    if settings.rollout.for_scenario(candidate.scenario).mode in ("canary", "shadow"):
        started = start_canary(settings, candidate)
        consumed()
        mlflow.set_tag("reef.rollout", settings.rollout.for_scenario(candidate.scenario).mode)
        return {"status": started.status, "release_id": started.id}
    published = deploy(settings, candidate, approval, receipts)
    faults.reached("published", candidate.scenario)
    recover(settings, candidate.scenario)
    mlflow.set_tag("reef.release_id", published.id)
    return {"status": "published", "release_id": published.id, "seq": published.seq}


def brings_harness(candidate: Candidate) -> bool:
    """Whether publishing `candidate` changes the harness: a harness candidate, or a composite
    one whose weights carry a new harness."""
    return candidate.operation == "harness" or isinstance(candidate.metadata.get("harness"), dict)


@task(retries=0, cache_policy=NO_CACHE)
def start_canary(settings: Settings, candidate: Candidate) -> Candidate:
    """Stage and verify the candidate in the serving engine and make it the scenario's canary
    (rollout.mode canary): it serves a share of sessions, or (mode shadow) answers copies of
    calls; the head stays until the rollout's test (or an admin) promotes or rolls it back
    (deploy.rollout)."""
    from reef.deploy import rollout

    with ReleaseChain.for_settings(settings) as chain:
        started = rollout.start(chain, candidate)
    get_run_logger().info("candidate %s is the canary of %s", started.id, started.scenario)
    return started


def wait_for_approval(
    settings: Settings, candidate: Candidate
) -> tuple[bool, str, dict[str, Any] | None]:
    """Pause the flow run for input; a watcher resumes it on an MLflow tag or a promote.
    Returns the decision, a note, and for an approval, who approved it and how."""
    from prefect.context import FlowRunContext
    from prefect.flow_runs import pause_flow_run, resume_flow_run
    from prefect.input import RunInput

    from reef import registry
    from reef.store.sql import open_store

    class Approval(RunInput):
        approve: bool
        approver: str = ""  # who decides (recorded on the release)
        note: str = ""
        via: str = "prefect"

    ctx = FlowRunContext.get()
    assert ctx is not None and ctx.flow_run is not None
    flow_run_id = ctx.flow_run.id
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(2.0):
            try:
                tag, by = registry.approval_by(settings.tracking_uri, candidate.model_uri or "")
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
                answer = {
                    "approve": tag == "approved",
                    "approver": by or "",
                    "note": f"MLflow tag reef.approval={tag}",
                    "via": "mlflow",
                }
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
    note = got.note or ("approved in Prefect" if got.approve else "rejected")
    if not got.approve:
        return False, note, None
    approval = {"by": got.approver or "unnamed", "via": got.via, "at": utcnow().isoformat()}
    return True, note, approval
