"""The gate as a pure function: policies, the paired bootstrap and sign tests."""

from __future__ import annotations

import numpy as np
import pytest

from reef.gate import GatePolicy, decide


def test_always_accepts_and_keeps_numbers() -> None:
    d = decide([0.1, 0.2], [0.3, 0.4], GatePolicy(policy="always"))
    assert d.accepted and d.status == "accepted" and d.reason == "policy 'always' (n=2)"
    assert d.mean_diff == pytest.approx(-0.2)
    assert d.n == 2 and d.losses == 2


def test_manual_is_pending() -> None:
    d = decide([1.0], [0.0], GatePolicy(policy="manual"))
    assert d.status == "pending" and not d.accepted and d.reason.endswith("(n=1)")


def test_improve_bootstrap_accepts_a_consistent_gain() -> None:
    rng = np.random.default_rng(1)
    head = rng.normal(0, 1, 40)
    cand = head + 0.5 + rng.normal(0, 0.1, 40)
    d = decide(cand, head, GatePolicy(policy="improve", confidence=0.95))
    assert d.accepted, d.reason
    assert d.ci_low is not None and d.ci_low > 0.4


def test_improve_rejects_noise_and_regressions() -> None:
    rng = np.random.default_rng(2)
    head = rng.normal(0, 1, 40)
    noise = head + rng.normal(0, 1, 40)  # no systematic gain
    assert not decide(noise, head, GatePolicy(policy="improve")).accepted
    assert not decide(head - 0.3, head, GatePolicy(policy="improve")).accepted


def test_improve_respects_the_margin() -> None:
    head = [0.0] * 20
    cand = [0.1 + 0.01 * (i % 3) for i in range(20)]
    assert decide(cand, head, GatePolicy(policy="improve", margin=0.05)).accepted
    assert not decide(cand, head, GatePolicy(policy="improve", margin=0.2)).accepted


def test_sign_test() -> None:
    head = [0.0] * 10
    assert decide([1.0] * 10, head, GatePolicy(policy="improve", test="sign")).accepted
    # 6 wins, 4 losses: p = 0.377 > 0.1
    mixed = [1.0] * 6 + [-1.0] * 4
    d = decide(mixed, head, GatePolicy(policy="improve", test="sign"))
    assert not d.accepted
    assert d.p_value == pytest.approx(386 / 1024)
    # all ties: nothing to test
    assert not decide(head, head, GatePolicy(policy="improve", test="sign")).accepted


def test_improve_needs_samples() -> None:
    assert decide([], [], GatePolicy(policy="improve")).reason == "no evaluation samples (n=0)"
    one = decide([1.0], [0.0], GatePolicy(policy="improve"))
    assert not one.accepted and "at least 2" in one.reason


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="length"):
        decide([1.0], [], GatePolicy())
    with pytest.raises(ValueError, match="finite"):
        decide([float("nan")], [0.0], GatePolicy())


def test_deterministic_and_serializable() -> None:
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=15), rng.normal(size=15)
    assert decide(a, b, GatePolicy()) == decide(a, b, GatePolicy())
    assert set(decide(a, b, GatePolicy()).metrics()) >= {"gate_mean_diff", "gate_ci_low", "gate_n"}


def test_pooled_evidence_accepts_what_two_samples_cannot() -> None:
    """A clearly better candidate, scored as the replay gate scores (signed mean log-probs):
    the 2 samples one batch of 8 held out cannot show it; the pool of 24 gathered over rounds
    does, and each reason says how many pairs it rests on."""
    rng = np.random.default_rng(4)
    head = rng.normal(-2.0, 0.5, 24)
    cand = head + rng.normal(0.3, 0.4, 24)
    cand[:2] = head[:2] + np.array([0.31, -0.02])  # the batch's own two: one gain, one wash
    policy = GatePolicy(policy="improve")
    two = decide(cand[:2], head[:2], policy)
    assert not two.accepted and two.n == 2
    assert two.ci_low is not None and two.ci_low <= 0
    assert "≤ margin 0 (n=2)" in two.reason
    pooled = decide(cand, head, policy)
    assert pooled.accepted and pooled.n == 24, pooled.reason
    assert "> margin 0 (n=24)" in pooled.reason
    signed = decide(cand, head, GatePolicy(policy="improve", test="sign"))
    assert signed.accepted and signed.reason.endswith("(n=24)")
