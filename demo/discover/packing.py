"""The circle-packing task (the TTT-Discover paper, scaled to N = 4-9 for the CPU demo): the
prompt, the seeded baseline program, the program extraction and the judge (sandbox + exact
verifier; the program's reported sum is ignored)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from demo.discover.sandbox import Limits, run
from demo.discover.verifier import Verdict, invalid, verify

ENTRY = "run_packing"
SYSTEM = "You are an expert Python programmer. You improve programs that pack circles."
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
# Prepended to every program before it runs, as upstream prepends numpy (and its validator):
# a child that copies its parent but drops the import line still runs.
PRELUDE = "import math\n\nimport numpy as np\n\n"
# Published anchors (sum of radii), the TTT-Discover paper: what the paper's runs reached.
TARGETS = {26: 2.635983, 32: 2.939573}


def baseline(n: int) -> str:
    """A short valid program: centers on a k×k grid, each radius as large as the walls and the
    circles placed before it allow. Any edit of the centers stays valid, so a child that only
    moves numbers still scores (Σr = 1.0 for N = 4, 1.5 for N = 9)."""
    k = math.ceil(math.sqrt(n))
    cells = [((i % k + 0.5) / k, (i // k + 0.5) / k) for i in range(n)]
    rows = ",\n".join(f"        [{x:.4f}, {y:.4f}]" for x, y in cells)
    return f"""import numpy as np


def run_packing():
    centers = np.array([
{rows},
    ])
    n = len(centers)
    radii = np.zeros(n)
    for i in range(n):
        x, y = centers[i]
        r = min(x, y, 1 - x, 1 - y)
        for j in range(i):
            d = np.sqrt(((centers[i] - centers[j]) ** 2).sum())
            r = min(r, d - radii[j])
        radii[i] = max(r, 0.0)
    return centers, radii, radii.sum()
"""


def prompt(n: int, program: str | None, reward: float, output: str) -> list[dict[str, str]]:
    """The chat messages of one group's rollouts (§3.4 "Rollouts"), kept short for a 135M
    model: the task, then the selected parent with its score and output, or a seed ask."""
    task = (
        f"Place {n} circles inside the unit square [0,1]x[0,1] without overlap to maximise the "
        f"sum of their radii. Write a Python program with a top-level function {ENTRY}() that "
        f"returns (centers, radii, sum_of_radii): centers a numpy array of shape ({n}, 2), radii "
        f"of shape ({n},). Use only numpy and math."
    )
    if program is None:
        ask = "Write code to solve this problem. Reply with one ```python block."
    else:
        ask = (
            f"Selected parent program (sum of radii = {reward:.6f}):\n```python\n{program}```\n"
            f"Its output: {output[-500:]}\n"
            "Improve on it with different ideas or tuned numbers: move the centers so the "
            "circles can grow larger. Reply with the full improved program in one ```python "
            "block."
        )
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{task}\n\n{ask}"}]


def extract(text: str) -> str | None:
    """The last fenced python block, or None (no block: an invalid rollout). A block that an
    answer cut off at max_tokens runs as far as it goes (it fails if it is incomplete)."""
    blocks = _FENCE.findall(text)
    return str(blocks[-1]) if blocks else None


@dataclass(frozen=True)
class Judged:
    program: str | None
    verdict: Verdict
    seconds: float


def judge(text: str, n: int, limits: Limits) -> Judged:
    """Run the completion's program in the sandbox and verify what it returns."""
    program = extract(text)
    if program is None:
        return Judged(None, invalid("no ```python block in the answer"), 0.0)
    if f"def {ENTRY}" not in program:
        return Judged(program, invalid(f"the program defines no {ENTRY}()"), 0.0)
    outcome = run(PRELUDE + program, ENTRY, limits)
    if not outcome.ok or outcome.result is None:
        return Judged(program, invalid(outcome.reason), outcome.seconds)
    if len(outcome.result) < 2:
        return Judged(program, invalid(f"{ENTRY}() must return (centers, radii, sum)"), 0.0)
    centers, radii = outcome.result[0], outcome.result[1]
    return Judged(program, verify(centers, radii, n), outcome.seconds)
