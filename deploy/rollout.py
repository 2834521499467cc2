"""Rollout decisions: start a canary, check it against the control, promote or roll it back.

The numbers come from the store (reports on each arm's records since the canary started,
reef.rollouts.arm_scores) and, for the guardrail, from the serving process (each arm's errors
and p95 latency). The verdict is reef.sequential's anytime-valid test, so checking after every
report is fine. Acting on it goes through the one release path (deploy.chain.ReleaseChain):
promote publishes the canary by compare-and-swap on the head it was made on; rollback retires
it and records a rollback release with the reason and numbers. Both are tagged on the
candidate's MLflow model version.

A shadow rollout (reef.shadow) is decided the same way, on the shadow records' scores: the
candidate's answers against the head's answers to the same requests. An A/B split is never
decided: `ab_status` shows each arm's numbers, and an operator's promote or abort ends it.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from reef import registry
from reef.deploy.chain import ReleaseChain
from reef.errors import BadRequest, NotFound
from reef.records import Candidate, Release
from reef.rollouts import ab_id, ab_stopped, arm_scores, guardrail_of, sequential_policy
from reef.sequential import ArmScores, Health, decide, guardrail, interval

log = logging.getLogger(__name__)


def start(chain: ReleaseChain, candidate: Candidate) -> Candidate:
    """Make an accepted candidate the scenario's canary, with the rollout keys it runs under."""
    rollout = chain.settings.rollout.for_scenario(candidate.scenario)
    keys = rollout.model_dump(exclude={"scenarios", "ab"})
    if rollout.mode != "shadow":
        keys.pop("shadow")
    started = chain.start_canary(candidate, keys)
    serving = (
        f"answering copies of {rollout.shadow.sample:.0%} of calls (shadow)"
        if rollout.mode == "shadow"
        else f"serving {rollout.share:.0%} of sessions ({rollout.sticky})"
    )
    _tag(chain, started, "started", serving)
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
    shadow = state.get("mode") == "shadow"
    if shadow:  # the same requests answered by both: the shadow records' scores
        n, canary_sum, control_sum = chain.store.shadow_sums(
            scenario, cand.id, policy.score_low, policy.score_high
        )
        canary, control = ArmScores(n, canary_sum), ArmScores(n, control_sum)
        health = None  # no user is served by the shadow: nothing for the guardrail
    else:
        canary = arm_scores(chain.store, scenario, cand.id, started, policy)
        control = arm_scores(chain.store, scenario, control_id, started, policy)
    elapsed = (datetime.now(started.tzinfo) - started).total_seconds()
    verdict = decide(canary, control, elapsed, policy).as_dict()
    out: dict[str, Any] = {
        "scenario": scenario,
        "mode": "shadow" if shadow else "canary",
        "canary_release_id": cand.id,
        "control_release_id": control_id,
        "share": rollout.shadow.sample if shadow else rollout.share,
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


# A/B splits ---------------------------------------------------------------------------------
def _split(chain: ReleaseChain, scenario: str) -> tuple[str, str]:
    """The scenario's live A/B pair (NotFound: none is configured, or it was ended)."""
    rollout = chain.settings.rollout.for_scenario(scenario)
    if rollout.mode != "ab" or not rollout.ab.releases:
        raise NotFound(f"scenario '{scenario}' has no A/B split", code="no_rollout")
    pair = (rollout.ab.releases[0], rollout.ab.releases[1])
    stopped = ab_stopped(chain.store, scenario, pair)
    if stopped is not None:
        raise NotFound(f"scenario '{scenario}' has no A/B split: {stopped}", code="no_rollout")
    return pair


def ab_status(chain: ReleaseChain, scenario: str) -> dict[str, Any]:
    """Each arm's reports since both releases existed: count, mean and its anytime-valid
    interval (α/2 per arm), and the interval of b − a at `confidence`; no verdict is acted on."""
    pair = _split(chain, scenario)
    rollout = chain.settings.rollout.for_scenario(scenario)
    policy = sequential_policy(rollout)
    a, b = (chain.store.get_release(scenario, r) for r in pair)
    started = max(a.created_at, b.created_at)
    alpha = 1 - policy.confidence
    arms: dict[str, Any] = {}
    scores = {}
    for name, release in (("a", a), ("b", b)):
        scores[name] = arm_scores(chain.store, scenario, release.id, started, policy)
        low, high = interval(scores[name], alpha / 2, policy)
        arms[name] = {
            "release_id": release.id,
            "n": scores[name].n,
            "mean": scores[name].mean,
            "interval": [low, high],
        }
    diff_low = arms["b"]["interval"][0] - arms["a"]["interval"][1]
    diff_high = arms["b"]["interval"][1] - arms["a"]["interval"][0]
    elapsed = (datetime.now(started.tzinfo) - started).total_seconds()
    reason = (
        f"b {_mean(scores['b'].mean)} (n={scores['b'].n}) vs a "
        f"{_mean(scores['a'].mean)} (n={scores['a'].n}): b − a in "
        f"[{diff_low:+.3f}, {diff_high:+.3f}] at {policy.confidence:.0%}; kept until an operator "
        "ends it"
    )
    return {
        "scenario": scenario,
        "mode": "ab",
        "canary_release_id": b.id,
        "control_release_id": a.id,
        "share": rollout.ab.share,
        "sticky": rollout.sticky,
        "started_at": started.isoformat(),
        "verdict": {
            "outcome": "running",
            "action": None,
            "reason": reason,
            "diff_low": diff_low,
            "diff_high": diff_high,
            "confidence": policy.confidence,
            "elapsed_s": elapsed,
        },
        "arms": arms,
        "abort": None,
    }


def end_ab(
    chain: ReleaseChain, scenario: str, *, by: str, keep: str | None, reason: str
) -> Release:
    """End the A/B split: `keep` (a or b's release id) becomes the head's content, None keeps
    the head. Recorded on the chain with each arm's numbers; the pair is not split again."""
    pair = _split(chain, scenario)
    if keep is not None and keep not in pair:
        raise BadRequest(f"release {keep} is not in the A/B split {list(pair)}", param="release_id")
    numbers = ab_status(chain, scenario)
    note = {
        "ab": list(pair),
        "rollout_id": ab_id(pair),
        "kept": keep,
        "by": by,
        "reason": reason,
        "arms": numbers["arms"],
        **{k: numbers["verdict"][k] for k in ("diff_low", "diff_high", "confidence")},
    }
    release = chain.end_split(scenario, keep, note)
    log.info("A/B split of %s ended by %s: %s", scenario, by, reason)
    return release


def _mean(mean: float | None) -> str:
    return "–" if mean is None else f"{mean:.3f}"
