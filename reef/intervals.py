"""Confidence intervals for what the dashboard and the judge's agreement show: a proportion
(Wilson), and the mean of scores that live in a known range, whose interval must stay inside
that range (a mean of 0/1 scores of 0.25 over 8 reports is [0.07, 0.59], never [-0.07, 0.57])."""

from __future__ import annotations

import math

Z90 = 1.6449  # two-sided 90 %
Z95 = 1.96  # two-sided 95 %

# The ranges scores usually live in, narrowest first: a mean whose every score lies in one of
# them gets its interval inside it (thumbs and pass/fail: [0, 1]; a signed reward: [-1, 1]).
NATURAL_RANGES: tuple[tuple[float, float], ...] = ((0.0, 1.0), (-1.0, 1.0))


def wilson(successes: float, n: int, z: float = Z90) -> tuple[float, float] | None:
    """The Wilson score interval of a proportion `successes / n` (`successes` may be
    fractional: the rescaled sum of bounded scores); None for n = 0."""
    if n == 0:
        return None
    p = min(1.0, max(0.0, successes / n))
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def natural_range(low: float, high: float) -> tuple[float, float] | None:
    """The narrowest of NATURAL_RANGES holding every observed score in [low, high], or None."""
    for lo, hi in NATURAL_RANGES:
        if lo <= low and high <= hi:
            return lo, hi
    return None


def mean_interval(
    n: int,
    mean: float,
    variance: float,
    bounds: tuple[float, float] | None,
    z: float = Z95,
) -> tuple[float, float]:
    """An interval for the mean of `n` scores (sample `variance`).

    Inside `bounds` [lo, hi]: Wilson's interval of the mean rescaled to [0, 1]. A score in
    [lo, hi] whose mean is m has at most the variance of a two-valued score (lo or hi) with that
    mean, which is the variance Wilson's interval assumes: so the interval is conservative for
    any bounded score, exact in spirit for thumbs, and never leaves the range, even for n = 1 or
    a mean at an end (where the normal interval collapses to a point). Unbounded: the normal
    interval with the sample variance (a point for n = 1)."""
    if n <= 0:
        raise ValueError("an interval needs at least one score")
    if bounds is not None:
        lo, hi = bounds
        span = hi - lo
        found = wilson((mean - lo) / span * n, n, z)
        assert found is not None
        return lo + found[0] * span, lo + found[1] * span
    half = z * math.sqrt(max(variance, 0.0) / n) if n > 1 else 0.0
    return mean - half, mean + half
