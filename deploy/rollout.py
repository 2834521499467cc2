"""Rollout decisions: start a canary, check it against the control, promote or roll it back.

The numbers come from the store (reports on each arm's records since the canary started,
reef.rollouts.arm_scores) and, for the guardrail, from the serving process (each arm's errors
and p95 latency). The verdict is reef.sequential's anytime-valid test, so checking after every
report is fine. Acting on it goes through the one release path (deploy.chain.ReleaseChain):
promote publishes the canary by compare-and-swap on the head it was made on; rollback retires
it and records a rollback release with the reason and numbers. Both are tagged on the
candidate's MLflow model version.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from deploy.chain import ReleaseChain
from reef import registry
from reef.records import Candidate, Release
from reef.rollouts import arm_scores, guardrail_of, sequential_policy
from reef.sequential import Health, decide, guardrail

log = logging.getLogger(__name__)


def start(chain: ReleaseChain, candidate: Candidate) -> Candidate:
    """Make an accepted candidate the scenario's canary, with the rollout keys it runs under."""
    rollout = chain.settings.rollout.for_scenario(candidate.scenario)
    keys = rollout.model_dump(exclude={"scenarios"})
    started = chain.start_canary(candidate, keys)
    _tag(chain, started, "started", f"serving {rollout.share:.0%} of sessions ({rollout.sticky})")
    log.info("candidate %s is the canary of %s", candidate.id, candidate.scenario)
    return started


def status(
    chain: ReleaseChain, scenario: str, health: tuple[Health, Health] | None = None
) -> dict[str, Any]:
    """Where the scenario's live canary stands: the verdict now, and the guardrail's word."""
    cand = chain.canary(scenario)
    rollout = chain.settings.rollout.for_scenario(scenario)
    policy = sequential_policy(rollout)
    state = cand.gate.get("rollout", {})
    started = datetime.fromisoformat(state["started_at"])
    control_id = chain.store.head_release(scenario).id
    canary = arm_scores(chain.store, scenario, cand.id, started, policy)
    control = arm_scores(chain.store, scenario, control_id, started, policy)
    elapsed = (datetime.now(started.tzinfo) - started).total_seconds()
    verdict = decide(canary, control, elapsed, policy).as_dict()
    out: dict[str, Any] = {
        "scenario": scenario,
        "canary_release_id": cand.id,
        "control_release_id": control_id,
        "share": rollout.share,
        "sticky": rollout.sticky,
        "started_at": state["started_at"],
        "verdict": verdict,
        "abort": None,
    }
    if control_id != cand.parent_id:
        out["abort"] = f"the head moved to {control_id} under the canary (made on {cand.parent_id})"
    elif health is not None:
        out["abort"] = guardrail(health[0], health[1], guardrail_of(rollout))
        out["health"] = {"canary": health[0].__dict__, "control": health[1].__dict__}
    return out


def check(
    chain: ReleaseChain, scenario: str, health: tuple[Health, Health] | None = None
) -> Release | None:
    """Act on the live canary's verdict: the guardrail aborts at once; a promote or rollback
    verdict (or an inconclusive one at max duration, as the policy says) ends the rollout.
    Returns the release that ended it, or None while it goes on."""
    now = status(chain, scenario, health)
    verdict = now["verdict"]
    if now["abort"]:
        return abort(chain, scenario, by="guardrail", reason=now["abort"], verdict=verdict)
    if verdict["action"] == "promote":
        return promote(chain, scenario, by="rollout", verdict=verdict)
    if verdict["action"] == "rollback":
        return abort(chain, scenario, by="rollout", reason=verdict["reason"], verdict=verdict)
    return None


def promote(
    chain: ReleaseChain, scenario: str, *, by: str, verdict: dict[str, Any] | None = None
) -> Release:
    """End the rollout: the canary becomes the head (a human's call when `verdict` is None)."""
    cand = chain.canary(scenario)
    verdict = verdict if verdict is not None else status(chain, scenario)["verdict"]
    release = chain.promote_canary(scenario, by=by, verdict=verdict)
    _tag(chain, cand, "promoted", f"by {by}: {verdict['reason']}")
    log.info("rollout of %s promoted %s (%s)", scenario, cand.id, verdict["reason"])
    return release


def abort(
    chain: ReleaseChain,
    scenario: str,
    *,
    by: str,
    reason: str,
    verdict: dict[str, Any] | None = None,
) -> Release:
    """End the rollout: the canary is retired and the chain records a rollback release."""
    cand = chain.canary(scenario)
    verdict = verdict if verdict is not None else status(chain, scenario)["verdict"]
    release = chain.roll_back_canary(scenario, by=by, reason=reason, verdict=verdict)
    _tag(chain, cand, "rolled_back", f"by {by}: {reason}")
    log.info("rollout of %s rolled back %s: %s", scenario, cand.id, reason)
    return release


def _tag(chain: ReleaseChain, cand: Candidate, outcome: str, reason: str) -> None:
    """The rollout's step on the candidate's MLflow model version (best effort: the chain is
    the truth, MLflow mirrors it)."""
    if not cand.model_uri:
        return
    try:
        uri = chain.settings.tracking_uri
        registry.set_tag(uri, cand.model_uri, "reef.rollout", outcome)
        registry.set_tag(uri, cand.model_uri, "reef.rollout_reason", reason[:5000])
    except Exception as e:
        log.warning("tagging %s in MLflow failed: %s", cand.model_uri, e)
