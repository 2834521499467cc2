"""The helper API of the edit action formats: `place(i, x, y, r)`, `grow(i)`, `nudge(i, dx, dy)`
over module globals `C` (centres, [x, y] per circle) and `R` (radii).

One source, two uses, so both mean the same: this file's text is the prelude of an `api`
answer's program, which runs in the sandbox (demo/discover/sandbox.py) with `C` and `R` set to
the parent's circles; and `apply_edits` in demo/discover/actions.py executes this (trusted) file
in a fresh namespace to apply a parsed JSON edit list, which is pure data and never runs.

Every number lands on a 1e-4 lattice, the precision the prompt shows, so a state read back
from the prompt is the state itself. `grow` and `nudge` give the circle they touch the largest
radius the walls and the other circles allow where it is (floored to the lattice), so they keep
a valid packing valid; `place` sets a circle exactly and may break the packing, which the
exact verifier then rejects.
"""

import math

Q = 10000  # the lattice: four decimals
C: list[list[float]] = []
R: list[float] = []


def _q(v: float) -> float:
    return round(float(v) * Q) / Q


def _index(i: int) -> int:
    if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(C):
        raise IndexError(f"no circle {i!r} (circles are 0..{len(C) - 1})")
    return i


def _fit(i: int) -> float:
    """The largest radius circle i's centre allows (walls, the other circles), on the lattice."""
    x, y = C[i]
    r = min(x, y, 1.0 - x, 1.0 - y)
    for j in range(len(C)):
        if j != i:
            r = min(r, math.dist(C[i], C[j]) - R[j])
    return math.floor(max(r, 0.0) * Q) / Q


def place(i: int, x: float, y: float, r: float) -> None:
    """Circle i at (x, y) with radius r, exactly (on the lattice)."""
    i = _index(i)
    C[i] = [_q(x), _q(y)]
    R[i] = _q(r)


def grow(i: int) -> None:
    """Circle i as large as fits where it is."""
    i = _index(i)
    R[i] = _fit(i)


def nudge(i: int, dx: float, dy: float) -> None:
    """Move circle i by (dx, dy), kept in the square, and give it the largest radius that fits
    there (it grows or shrinks)."""
    i = _index(i)
    x, y = C[i]
    C[i] = [min(max(_q(x + dx), 0.0), 1.0), min(max(_q(y + dy), 0.0), 1.0)]
    R[i] = _fit(i)
