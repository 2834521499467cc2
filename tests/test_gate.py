"""The gate as a pure function: policies, the paired bootstrap and sign tests."""

from __future__ import annotations

import numpy as np
import pytest

from reef.gate import GatePolicy, decide


def test_always_accepts_and_keeps_numbers() -> None:
    d = decide([0.1, 0.2], [0.3, 0.4], GatePolicy(policy="always"))
    assert d.accepted and d.status == "accepted"
    assert d.mean_diff == pytest.approx(-0.2)
    assert d.n == 2 and d.losses == 2


def test_manual_is_pending() -> None:
    d = decide([1.0], [0.0], GatePolicy(policy="manual"))
    assert d.status == "pending" and not d.accepted


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
    assert decide([], [], GatePolicy(policy="improve")).reason == "no evaluation samples"
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
