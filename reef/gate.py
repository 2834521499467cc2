"""The gate: may a candidate replace the head? A pure function of paired evaluation scores.

Both models are scored on the same evaluation samples (the scenario's evaluation pool of
reported samples no recipe ever trains on, reef.evaluation_pool; or a configured task set), so
the comparison is paired: per sample d_i = candidate_i − head_i. Every reason states n, the
number of pairs the verdict rests on.

- "always": accept (the numbers are still computed and stored).
- "manual": pending; a human decides (Prefect UI input, an MLflow tag, or `reef promote`).
- "improve": accept when the mean improvement clears `margin` with a paired test at
  `confidence`:
    bootstrap: the one-sided lower confidence bound of mean(d), from resampling the pairs,
               must exceed `margin`;
    sign:      among pairs that differ from `margin` (d_i ≠ margin), the number of wins must be
               significant under a one-sided binomial test (p ≤ 1 − confidence), and the mean
               improvement must be at least `margin`.

Guards (`gate.guards`) keep a candidate from improving one thing by breaking another: each is a
fixed task set with its own scorer (exact answer, contains the answer, a verifier, a judge),
answered by both models. The burden of proof is on the candidate (a non-inferiority test): a
guard holds only when the candidate is shown to be no worse than the head by more than the
guard's `max_drop`, under the same paired test at the same confidence:
    bootstrap: the one-sided lower confidence bound of mean(d) is at least −max_drop;
    sign:      the pairs within the allowed drop (d_i ≥ −max_drop) outnumber the others
               significantly (p ≤ 1 − confidence), and the mean change is at least −max_drop.
Too little evidence is not evidence of safety: a drop that few tasks cannot tell from chance,
a single task, or none at all leaves the guard "not shown safe". A guard not shown safe
rejects the candidate whatever the policy says, and the rejection names the guard.

Why "at least" and not "above" −max_drop: with max_drop 0, a candidate that answers every task
exactly as the head does has a bound of exactly 0, and so does one that only gained; a strict
inequality would refuse both, turning every guard into a demand to improve.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    from reef.settings import Settings

Policy = Literal["always", "improve", "manual"]
Status = Literal["accepted", "rejected", "pending"]


@dataclass(frozen=True)
class GatePolicy:
    policy: Policy = "improve"
    margin: float = 0.0
    confidence: float = 0.9
    test: Literal["bootstrap", "sign"] = "bootstrap"
    bootstrap_samples: int = 2000
    seed: int = 0

    @classmethod
    def for_settings(cls, settings: Settings) -> GatePolicy:
        """The configured gate (`gate:`), seeded by `reef.seed`."""
        g = settings.gate
        return cls(
            policy=g.policy,
            margin=g.margin,
            confidence=g.confidence,
            test=g.test,
            bootstrap_samples=g.bootstrap_samples,
            seed=settings.reef.seed,
        )


@dataclass(frozen=True)
class Decision:
    """The verdict and the numbers behind it (stored with the candidate, logged to MLflow)."""

    status: Status
    policy: Policy
    test: str
    reason: str
    n: int
    mean_candidate: float | None = None
    mean_head: float | None = None
    mean_diff: float | None = None
    ci_low: float | None = None  # one-sided lower bound of mean(d) at `confidence` (bootstrap)
    p_value: float | None = None  # one-sided sign test
    wins: int = 0
    losses: int = 0
    ties: int = 0
    margin: float = 0.0
    confidence: float = 0.0
    guards: tuple[GuardCheck, ...] = ()
    broken_guard: str | None = None  # the first guard not shown safe, when one was not

    @property
    def accepted(self) -> bool:
        return self.status == "accepted"

    def as_dict(self) -> dict[str, Any]:
        # JSON's shape (a list of guards), so a decision reads the same before and after it
        # is stored.
        return {**asdict(self), "guards": [asdict(g) for g in self.guards]}

    def metrics(self) -> dict[str, float]:
        """The numeric fields, for MLflow (`gate_` prefixed, None left out); each guard's as
        `guard_<name>_<field>`."""
        out: dict[str, float] = {}
        for key, value in asdict(self).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[f"gate_{key}"] = float(value)
        for guard in self.guards:
            out |= guard.metrics()
        return out


@dataclass(frozen=True)
class GuardCheck:
    """One guard's paired comparison: was the candidate shown to be no worse on it?

    `broken` is True when it was not shown safe (a significant drop, or too little evidence
    of none); the field keeps its stored name."""

    name: str
    broken: bool
    reason: str
    n: int
    max_drop: float
    mean_candidate: float | None = None
    mean_head: float | None = None
    mean_diff: float | None = None
    ci_low: float | None = None  # one-sided lower bound of mean(d) at `confidence` (bootstrap)
    p_value: float | None = None  # one-sided sign test: held tasks vs lost ones
    wins: int = 0  # tasks within the allowed drop (d ≥ −max_drop)
    losses: int = 0  # tasks that dropped by more (d < −max_drop)

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, value in asdict(self).items():
            if key != "name" and isinstance(value, (int, float)):
                out[f"guard_{self.name}_{key}"] = float(value)
        return out


def check_guard(
    name: str,
    candidate: Sequence[float],
    head: Sequence[float],
    max_drop: float,
    policy: GatePolicy,
) -> GuardCheck:
    """Whether the candidate is shown safe on guard `name`: no worse than the head on its task
    set by more than `max_drop`, under `policy`'s paired test and confidence. Anything short of
    that evidence (few tasks, one, none) is "not shown safe" and counts as broken."""
    c, h = _paired(candidate, head)
    d = c - h
    n = len(d)
    if n == 0:
        reason = f"guard '{name}' not shown safe: n=0, no tasks scored"
        return GuardCheck(name, True, reason, 0, max_drop)
    wins = int((d >= -max_drop).sum())
    losses = n - wins
    mean_diff = float(d.mean())
    low = _bootstrap_low(d, policy)
    p = _sign_p(wins, losses)
    if policy.test == "bootstrap":
        safe = low is not None and low >= -max_drop
        if low is None:
            evidence = f"n={n}, a bound needs at least 2 tasks"
        else:
            evidence = (
                f"n={n}, {policy.confidence:.0%} lower bound {low:+.4g} "
                f"{'≥' if safe else '<'} -max_drop = -{max_drop:g}"
            )
    else:
        safe = p <= 1 - policy.confidence and mean_diff >= -max_drop
        evidence = (
            f"n={n}, {wins} tasks within the allowed drop, {losses} beyond it: sign-test "
            f"p={p:.3g} (need ≤ {1 - policy.confidence:.3g}), mean change {mean_diff:+.4g} "
            f"(need ≥ -{max_drop:g})"
        )
    verdict = "shown safe" if safe else "not shown safe"
    reason = (
        f"guard '{name}' {verdict}: {evidence}; mean {float(c.mean()):.3g} vs head "
        f"{float(h.mean()):.3g}, change {mean_diff:+.4g}"
    )
    return GuardCheck(
        name=name,
        broken=not safe,
        reason=reason,
        n=n,
        max_drop=max_drop,
        mean_candidate=float(c.mean()),
        mean_head=float(h.mean()),
        mean_diff=mean_diff,
        ci_low=low,
        p_value=p,
        wins=wins,
        losses=losses,
    )


def with_guards(decision: Decision, checks: Sequence[GuardCheck]) -> Decision:
    """The decision with its guards' results; the first guard not shown safe rejects it, by
    name."""
    if not checks:
        return decision
    broken = next((g for g in checks if g.broken), None)
    if broken is None:
        return replace(decision, guards=tuple(checks))
    return replace(
        decision,
        status="rejected",
        reason=f"{broken.reason}; the preference: {decision.reason}",
        guards=tuple(checks),
        broken_guard=broken.name,
    )


def _paired(candidate: Sequence[float], head: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    if len(candidate) != len(head):
        raise ValueError(
            f"paired scores differ in length: {len(candidate)} candidate, {len(head)} head"
        )
    c = np.asarray(candidate, dtype=np.float64)
    h = np.asarray(head, dtype=np.float64)
    if not (np.isfinite(c).all() and np.isfinite(h).all()):
        raise ValueError("evaluation scores must be finite numbers")
    return c, h


def decide(candidate: Sequence[float], head: Sequence[float], policy: GatePolicy) -> Decision:
    """Compare paired per-sample scores of the candidate and the head under `policy`."""
    c, h = _paired(candidate, head)
    d = c - h
    n = len(d)
    wins = int((d > policy.margin).sum())
    losses = int((d < policy.margin).sum())
    numbers: dict[str, Any] = {
        "policy": policy.policy,
        "test": policy.test,
        "n": n,
        "wins": wins,
        "losses": losses,
        "ties": n - wins - losses,
        "margin": policy.margin,
        "confidence": policy.confidence,
    }
    if n:
        numbers |= {
            "mean_candidate": float(c.mean()),
            "mean_head": float(h.mean()),
            "mean_diff": float(d.mean()),
            "ci_low": _bootstrap_low(d, policy),
            "p_value": _sign_p(wins, losses),
        }
    if policy.policy == "always":
        return Decision(status="accepted", reason=f"policy 'always' (n={n})", **numbers)
    if policy.policy == "manual":
        reason = f"policy 'manual': waiting for approval (n={n})"
        return Decision(status="pending", reason=reason, **numbers)
    if n == 0:
        return Decision(status="rejected", reason="no evaluation samples (n=0)", **numbers)
    mean_diff = numbers["mean_diff"]
    if policy.test == "bootstrap":
        low = numbers["ci_low"]
        ok = low is not None and low > policy.margin
        if low is None:
            reason = f"the bootstrap needs at least 2 evaluation samples (n={n})"
        else:
            reason = (
                f"mean improvement {mean_diff:+.4g}, {policy.confidence:.0%} lower bound "
                f"{low:+.4g} {'>' if ok else '≤'} margin {policy.margin:g} (n={n})"
            )
    else:
        p = numbers["p_value"]
        ok = p <= 1 - policy.confidence and mean_diff >= policy.margin
        reason = (
            f"{wins} wins, {losses} losses over margin {policy.margin:g}: sign-test p={p:.3g} "
            f"(need ≤ {1 - policy.confidence:.3g}), mean improvement {mean_diff:+.4g} (n={n})"
        )
    return Decision(status="accepted" if ok else "rejected", reason=reason, **numbers)


def _bootstrap_low(d: np.ndarray, policy: GatePolicy) -> float | None:
    """One-sided lower bound of mean(d) at `confidence` by the percentile bootstrap; None for
    a single pair, which a resample cannot vary."""
    if len(d) < 2:
        return None
    rng = np.random.default_rng(policy.seed)
    idx = rng.integers(0, len(d), size=(policy.bootstrap_samples, len(d)))
    means = d[idx].mean(axis=1)
    return float(np.quantile(means, 1 - policy.confidence))


def _sign_p(wins: int, losses: int) -> float:
    """P(X ≥ wins) for X ~ Binomial(wins + losses, 1/2); 1.0 when every pair ties."""
    n = wins + losses
    if n == 0:
        return 1.0
    return float(sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n)
