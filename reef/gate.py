"""The gate: may a candidate replace the head? A pure function of paired evaluation scores.

Both models are scored on the same evaluation samples (held-out reported samples, or a
configured task set), so the comparison is paired: per sample d_i = candidate_i − head_i.

- "always": accept (the numbers are still computed and stored).
- "manual": pending; a human decides (Prefect UI input, an MLflow tag, or `reef promote`).
- "improve": accept when the mean improvement clears `margin` with a paired test at
  `confidence`:
    bootstrap: the one-sided lower confidence bound of mean(d), from resampling the pairs,
               must exceed `margin`;
    sign:      among pairs that differ from `margin` (d_i ≠ margin), the number of wins must be
               significant under a one-sided binomial test (p ≤ 1 − confidence), and the mean
               improvement must be at least `margin`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
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

    @property
    def accepted(self) -> bool:
        return self.status == "accepted"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def metrics(self) -> dict[str, float]:
        """The numeric fields, for MLflow (`gate_` prefixed, None left out)."""
        out: dict[str, float] = {}
        for key, value in asdict(self).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[f"gate_{key}"] = float(value)
        return out


def decide(candidate: Sequence[float], head: Sequence[float], policy: GatePolicy) -> Decision:
    """Compare paired per-sample scores of the candidate and the head under `policy`."""
    if len(candidate) != len(head):
        raise ValueError(
            f"paired scores differ in length: {len(candidate)} candidate, {len(head)} head"
        )
    c = np.asarray(candidate, dtype=np.float64)
    h = np.asarray(head, dtype=np.float64)
    if not (np.isfinite(c).all() and np.isfinite(h).all()):
        raise ValueError("evaluation scores must be finite numbers")
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
        return Decision(status="accepted", reason="policy 'always'", **numbers)
    if policy.policy == "manual":
        return Decision(status="pending", reason="policy 'manual': waiting for approval", **numbers)
    if n == 0:
        return Decision(status="rejected", reason="no evaluation samples", **numbers)
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
