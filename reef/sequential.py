"""The sequential decision of a rollout: compare live reports on the canary and the control arm
with a test that stays valid however often it is looked at.

Each arm's mean score gets an anytime-valid confidence sequence: Robbins' normal mixture
boundary for sub-Gaussian sums (Howard, Ramdas, McAuliffe, Sekhon 2021, "Time-uniform,
nonparametric, nonasymptotic confidence sequences", eq. 3.7). With scores bounded in
[low, high], every centred score is sub-Gaussian with σ = (high − low) / 2 (Hoeffding), so for
S_n = Σ (x_i − μ) and V_n = n σ²

    M_n = sqrt(ρ / (V_n + ρ)) · exp(S_n² / (2 (V_n + ρ)))

is a non-negative supermartingale (a mixture over λ ~ N(0, 1/ρ) of exp(λ S_n − λ² V_n / 2)),
and Ville's inequality bounds P(∃n: M_n ≥ 1/α) ≤ α. So, for every n at once,

    |mean_n − μ| < sqrt(2 (V_n + ρ) · log(sqrt((V_n + ρ) / ρ) / α)) / n.

Each arm gets α/2 (a union bound), so the difference of the two intervals holds the true
difference of means at every moment with probability ≥ 1 − α = `confidence`: checking it after
every report is allowed, unlike a fixed-n test that is peeked at.

- promote: the difference's lower bound clears `margin` (the canary is better by more than it);
- rollback: its upper bound is below −`margin` (the canary is worse by more than it);
- inconclusive: `max_duration_s` passed with neither; the policy's `on_inconclusive` says what
  follows (default rollback: a release that could not show it is better does not stay).
No decision is taken before each arm has `min_samples` reports.

The guardrail is separate and does not wait for the test: an error rate or a p95 latency on the
canary far worse than the control's aborts the canary at once.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

Outcome = Literal["continue", "promote", "rollback", "inconclusive"]
Action = Literal["promote", "rollback"]


@dataclass(frozen=True)
class SequentialPolicy:
    """When a rollout decides (the scenario's `rollout:` keys)."""

    confidence: float = 0.95
    margin: float = 0.0
    min_samples: int = 30  # reports per arm before any decision
    max_duration_s: float = 24 * 3600.0
    on_inconclusive: Action = "rollback"
    score_low: float = 0.0  # the range report scores lie in (scores outside are clipped)
    score_high: float = 1.0

    def __post_init__(self) -> None:
        if not 0.5 < self.confidence < 1.0:
            raise ValueError("confidence must lie in (0.5, 1)")
        if self.score_high <= self.score_low:
            raise ValueError("score_high must exceed score_low")

    @property
    def sigma(self) -> float:
        """The sub-Gaussian scale of one bounded score (Hoeffding)."""
        return (self.score_high - self.score_low) / 2

    @property
    def rho(self) -> float:
        """The mixture's precision: tightest near `min_samples` reports, where decisions start
        (Howard et al.'s choice of ρ for a target sample size, rounded)."""
        return self.sigma**2 * max(self.min_samples, 10)


@dataclass(frozen=True)
class ArmScores:
    """The reports one arm has collected: how many and their sum (clipped to the range)."""

    n: int = 0
    total: float = 0.0

    @classmethod
    def of(cls, scores: list[float], policy: SequentialPolicy) -> ArmScores:
        clipped = [min(max(s, policy.score_low), policy.score_high) for s in scores]
        return cls(len(clipped), float(sum(clipped)))

    def add(self, score: float, policy: SequentialPolicy) -> ArmScores:
        clipped = min(max(score, policy.score_low), policy.score_high)
        return ArmScores(self.n + 1, self.total + clipped)

    @property
    def mean(self) -> float | None:
        return self.total / self.n if self.n else None


def interval(arm: ArmScores, alpha: float, policy: SequentialPolicy) -> tuple[float, float]:
    """An anytime-valid (1 − alpha) confidence interval for the arm's mean score, clipped to the
    score range; the whole range before any report."""
    if arm.n == 0:
        return policy.score_low, policy.score_high
    v = arm.n * policy.sigma**2
    rho = policy.rho
    radius = math.sqrt(2 * (v + rho) * math.log(math.sqrt((v + rho) / rho) / alpha)) / arm.n
    mean = arm.total / arm.n
    return max(mean - radius, policy.score_low), min(mean + radius, policy.score_high)


@dataclass(frozen=True)
class Verdict:
    """Where a rollout stands and the numbers behind it (logged to MLflow, shown on the
    release)."""

    outcome: Outcome
    action: Action | None  # what follows: promote, rollback, or None (keep collecting)
    n_canary: int
    n_control: int
    mean_canary: float | None
    mean_control: float | None
    diff_low: float
    diff_high: float
    elapsed_s: float
    confidence: float
    margin: float
    min_samples: int

    @property
    def reason(self) -> str:
        """The verdict in a sentence (made on demand: a rollout is checked on every report)."""
        shown = (
            f"canary {_mean(self.mean_canary)} (n={self.n_canary}) vs control "
            f"{_mean(self.mean_control)} (n={self.n_control}): difference in "
            f"[{self.diff_low:+.3f}, {self.diff_high:+.3f}] at {self.confidence:.0%}"
        )
        if self.outcome == "promote":
            return f"canary better by more than {self.margin:g}: {shown}"
        if self.outcome == "rollback":
            return f"canary worse by more than {self.margin:g}: {shown}"
        if self.outcome == "inconclusive":
            return f"inconclusive after {self.elapsed_s:.0f}s ({self.action} by policy): {shown}"
        if min(self.n_canary, self.n_control) < self.min_samples:
            return f"collecting: {shown}; waiting for {self.min_samples} reports per arm"
        return f"collecting: {shown}"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "reason": self.reason}

    def metrics(self) -> dict[str, float]:
        """The numeric fields, `rollout_` prefixed (None left out), for MLflow."""
        return {
            f"rollout_{k}": float(v)
            for k, v in asdict(self).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }


def decide(
    canary: ArmScores, control: ArmScores, elapsed_s: float, policy: SequentialPolicy
) -> Verdict:
    """The rollout's verdict now: promote, rollback, inconclusive (at max duration) or
    continue. Valid at every call, however many calls came before."""
    alpha = 1 - policy.confidence
    c_low, c_high = interval(canary, alpha / 2, policy)
    h_low, h_high = interval(control, alpha / 2, policy)
    diff_low, diff_high = c_low - h_high, c_high - h_low
    enough = min(canary.n, control.n) >= policy.min_samples
    outcome: Outcome = "continue"
    action: Action | None = None
    if enough and diff_low > policy.margin:
        outcome = action = "promote"
    elif enough and diff_high < -policy.margin:
        outcome = action = "rollback"
    elif elapsed_s >= policy.max_duration_s:
        outcome, action = "inconclusive", policy.on_inconclusive
    return Verdict(
        outcome,
        action,
        canary.n,
        control.n,
        canary.mean,
        control.mean,
        diff_low,
        diff_high,
        elapsed_s,
        policy.confidence,
        policy.margin,
        policy.min_samples,
    )


def _mean(mean: float | None) -> str:
    return "–" if mean is None else f"{mean:.3f}"


@dataclass(frozen=True)
class Health:
    """An arm's serving health during a rollout: calls, failed calls (5xx, engine errors) and
    the 95th percentile latency of the rest."""

    requests: int = 0
    errors: int = 0
    p95_ms: float | None = None

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


@dataclass(frozen=True)
class Guardrail:
    """When a canary is aborted at once, without waiting for the test."""

    max_error_rate_increase: float = 0.05  # canary error rate − control's
    max_p95_ratio: float = 2.0  # canary p95 latency / control's
    min_requests: int = 20  # canary calls before the guardrail judges


def guardrail(canary: Health, control: Health, rail: Guardrail) -> str | None:
    """Why the canary must be aborted now, or None while it is healthy enough."""
    if canary.requests < rail.min_requests:
        return None
    increase = canary.error_rate - control.error_rate
    if increase > rail.max_error_rate_increase:
        return (
            f"error rate {canary.error_rate:.1%} on the canary vs {control.error_rate:.1%} on "
            f"the control (allowed +{rail.max_error_rate_increase:.1%}, "
            f"{canary.errors}/{canary.requests} calls failed)"
        )
    if canary.p95_ms is not None and control.p95_ms:
        ratio = canary.p95_ms / control.p95_ms
        if ratio > rail.max_p95_ratio:
            return (
                f"p95 latency {canary.p95_ms:.0f} ms on the canary vs {control.p95_ms:.0f} ms "
                f"on the control ({ratio:.1f}x, allowed {rail.max_p95_ratio:g}x)"
            )
    return None
