"""The rollout's sequential decision, simulated: reports arrive one at a time on a canary that
gets 10 % of sessions, and the test is checked after every one of them (the peeking a fixed-n
test does not survive)."""

from __future__ import annotations

import random

import pytest

from reef.sequential import (
    ArmScores,
    Guardrail,
    Health,
    SequentialPolicy,
    Verdict,
    decide,
    guardrail,
    interval,
)

POLICY = SequentialPolicy(confidence=0.95, margin=0.0, min_samples=30, max_duration_s=4000)


def simulate(
    p_canary: float, p_control: float, seed: int, policy: SequentialPolicy = POLICY
) -> Verdict:
    """One rollout: one report per simulated second, a 0/1 score (a thumbs up with
    probability p), 10 % of them on the canary; decide after each report."""
    rng = random.Random(seed)
    canary, control = ArmScores(), ArmScores()
    t = 0
    while True:
        t += 1
        if rng.random() < 0.1:
            canary = canary.add(float(rng.random() < p_canary), policy)
        else:
            control = control.add(float(rng.random() < p_control), policy)
        verdict = decide(canary, control, float(t), policy)
        if verdict.outcome != "continue":
            return verdict


def test_a_better_canary_is_promoted() -> None:
    v = simulate(0.8, 0.4, seed=1)
    assert v.outcome == "promote" and v.action == "promote", v.reason
    assert v.diff_low > 0 and v.n_canary >= POLICY.min_samples
    assert v.elapsed_s < POLICY.max_duration_s


def test_a_worse_canary_is_rolled_back() -> None:
    v = simulate(0.3, 0.7, seed=2)
    assert v.outcome == "rollback" and v.action == "rollback", v.reason
    assert v.diff_high < 0 and v.reason.startswith("canary worse")


def test_an_equal_canary_ends_inconclusive_and_the_policy_says_what_follows() -> None:
    v = simulate(0.5, 0.5, seed=3)
    assert v.outcome == "inconclusive" and v.action == "rollback"
    assert v.elapsed_s == POLICY.max_duration_s and v.diff_low <= 0 <= v.diff_high
    keep = SequentialPolicy(
        min_samples=30, max_duration_s=4000, on_inconclusive="promote", confidence=0.95
    )
    assert simulate(0.5, 0.5, seed=3, policy=keep).action == "promote"


def test_false_promotions_over_200_aa_rollouts_stay_under_one_minus_confidence() -> None:
    """A/A: both arms are the same release. However often the test is checked, it may
    promote at most 1 − confidence of them; being conservative it promotes far fewer."""
    policy = SequentialPolicy(confidence=0.9, min_samples=10, max_duration_s=1000)
    outcomes = [simulate(0.5, 0.5, seed=1000 + i, policy=policy).outcome for i in range(200)]
    promoted = outcomes.count("promote")
    assert promoted / 200 <= 1 - policy.confidence
    assert outcomes.count("rollback") / 200 <= 1 - policy.confidence


def test_no_decision_before_min_samples() -> None:
    policy = SequentialPolicy(min_samples=50)
    v = decide(ArmScores(20, 20.0), ArmScores(200, 0.0), 10.0, policy)
    assert v.outcome == "continue" and "waiting for 50" in v.reason


def test_intervals_are_clipped_and_shrink() -> None:
    low, high = interval(ArmScores(), 0.05, POLICY)
    assert (low, high) == (0.0, 1.0)
    widths = [
        (lambda lh: lh[1] - lh[0])(interval(ArmScores(n, n / 2), 0.05, POLICY))
        for n in (10, 100, 1000, 10000)
    ]
    assert widths == sorted(widths, reverse=True) and widths[-1] < 0.05
    assert ArmScores.of([2.0, -1.0], POLICY).total == 1.0  # clipped to [0, 1]
    with pytest.raises(ValueError):
        SequentialPolicy(confidence=1.0)


def test_guardrail_aborts_on_errors_or_latency_at_once() -> None:
    rail = Guardrail(max_error_rate_increase=0.05, max_p95_ratio=2.0, min_requests=20)
    healthy = Health(requests=400, errors=2, p95_ms=120.0)
    assert guardrail(Health(40, 1, 130.0), healthy, rail) is None
    assert "error rate" in (guardrail(Health(40, 8, 130.0), healthy, rail) or "")
    assert "p95 latency" in (guardrail(Health(40, 0, 300.0), healthy, rail) or "")
    assert guardrail(Health(5, 5, 900.0), healthy, rail) is None  # too few calls to judge
