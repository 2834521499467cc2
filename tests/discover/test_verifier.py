"""The exact circle-packing verifier (the TTT-Discover paper) and the judge that trusts only it."""

from __future__ import annotations

import math

import pytest

from demo.discover.packing import baseline, extract, judge
from demo.discover.sandbox import Limits
from demo.discover.verifier import TOLERANCE, verify


def test_touching_circles_at_exactly_the_sum_of_radii_are_valid() -> None:
    # Radius 0.125, centres 0.25 apart (exact in binary): ‖c_i − c_j‖ = r_i + r_j exactly.
    v = verify([[0.375, 0.5], [0.625, 0.5]], [0.125, 0.125], 2)
    assert v.valid and v.reward == 0.25
    over = verify([[0.375, 0.5], [0.625, 0.5]], [0.125, 0.125 + 1e-9], 2)
    assert not over.valid and "overlap" in over.reason


def test_boundary_slack_is_1e_12() -> None:
    inside = verify([[0.5, 0.5]], [0.5 + 0.9 * TOLERANCE], 1)
    assert inside.valid
    outside = verify([[0.5, 0.5]], [0.5 + 1e-10], 1)
    assert not outside.valid and "unit square" in outside.reason
    # overlap slack too: overlapping by less than 1e-12 passes, by more fails
    assert verify([[0.25, 0.5], [0.75, 0.5]], [0.25 + 4e-13, 0.25], 2).valid
    assert not verify([[0.25, 0.5], [0.75, 0.5]], [0.25 + 1e-11, 0.25], 2).valid


@pytest.mark.parametrize(
    ("centers", "radii", "n", "why"),
    [
        ([[0.5, math.nan]], [0.1], 1, "NaN"),
        ([[0.5, 0.5]], [math.nan], 1, "NaN"),
        ([[0.5, 0.5], [0.2, 0.2]], [0.1], 2, "radii have shape"),
        ([[0.5, 0.5, 0.5]], [0.1], 1, "centers have shape"),
        ([0.5, 0.5], [0.1], 1, "centers have shape"),
        ([[0.5, 0.5]], [[0.1]], 1, "radii have shape"),
        ([[0.5, 0.5]], [-0.1], 1, "negative radius"),
        ([[0.5, 0.5]], [math.inf], 1, "infinite"),
        ([["a", 0.5]], [0.1], 1, "not numeric"),
    ],
)
def test_invalid_packings_score_zero(centers: object, radii: object, n: int, why: str) -> None:
    v = verify(centers, radii, n)
    assert not v.valid and v.reward == 0.0 and why in v.reason


def test_a_falsified_reported_sum_is_ignored() -> None:
    program = (
        "import numpy as np\n\ndef run_packing():\n"
        "    return np.array([[0.25, 0.25], [0.75, 0.75]]), np.array([0.25, 0.25]), 99.0\n"
    )
    judged = judge(f"Here:\n```python\n{program}```", 2, Limits(wall_s=30))
    assert judged.verdict.valid and judged.verdict.reward == 0.5  # not 99


def test_baseline_and_extraction() -> None:
    assert extract("no code") is None
    assert extract("```python\na = 1\n```\ntext\n```python\nb = 2\n```") == "b = 2\n"
    assert extract("text\n```python\nc = 3\n") == "c = 3\n"  # cut off at max_tokens
    # numpy is prepended (as upstream does): a copy that lost its import line still runs
    no_import = baseline(4).replace("import numpy as np\n", "")
    assert judge(f"```python\n{no_import}```", 4, Limits(wall_s=30)).verdict.valid
    judged = judge(f"```python\n{baseline(4)}```", 4, Limits(wall_s=30))
    assert judged.verdict.valid and judged.verdict.reward == pytest.approx(1.0)
