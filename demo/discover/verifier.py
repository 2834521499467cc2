"""The exact circle-packing verifier (the TTT-Discover paper): a packing is valid when its arrays
have the exact shapes, hold no NaN, every radius is ≥ 0, every circle lies in the unit square
and no two overlap, each up to a 1e-12 slack. The reward is the verifier's own Σ r_i; whatever
sum the program reports is ignored."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

TOLERANCE = 1e-12


@dataclass(frozen=True)
class Verdict:
    valid: bool
    reward: float  # Σ r_i when valid, else 0 (the invalid reward)
    reason: str  # "sum of radii = …" or what failed: shown to the next rollouts

    def as_dict(self) -> dict[str, Any]:
        return {"valid": self.valid, "reward": self.reward, "reason": self.reason}


def invalid(reason: str) -> Verdict:
    return Verdict(False, 0.0, reason)


def verify(centers: Any, radii: Any, n: int, tolerance: float = TOLERANCE) -> Verdict:
    """Check a packing of `n` circles in [0, 1]²; the reported sum is never an input."""
    try:
        c = np.asarray(centers, dtype=np.float64)
        r = np.asarray(radii, dtype=np.float64)
    except (TypeError, ValueError) as e:
        return invalid(f"centers/radii are not numeric arrays: {e}")
    if c.shape != (n, 2):
        return invalid(f"centers have shape {c.shape}, expected ({n}, 2)")
    if r.shape != (n,):
        return invalid(f"radii have shape {r.shape}, expected ({n},)")
    if np.isnan(c).any() or np.isnan(r).any():
        return invalid("NaN in centers or radii")
    if not (np.isfinite(c).all() and np.isfinite(r).all()):
        return invalid("infinite value in centers or radii")
    if (r < 0).any():
        return invalid(f"negative radius at circle {int(np.argmax(r < 0))}")
    for axis in (0, 1):
        low = c[:, axis] - r
        high = c[:, axis] + r
        if (low < -tolerance).any() or (high > 1.0 + tolerance).any():
            bad = int(np.argmax((low < -tolerance) | (high > 1.0 + tolerance)))
            return invalid(f"circle {bad} leaves the unit square")
    for i in range(n):
        d = np.sqrt(((c[i + 1 :] - c[i]) ** 2).sum(axis=1))
        overlap = d < r[i] + r[i + 1 :] - tolerance
        if overlap.any():
            j = i + 1 + int(np.argmax(overlap))
            return invalid(f"circles {i} and {j} overlap")
    total = float(r.sum())
    if not np.isfinite(total):
        return invalid("the sum of radii is not finite")
    return Verdict(True, total, f"sum of radii = {total:.6f}")
