"""What a rollout may answer (`discover.action`), how its prompt shows the parent, and how an
answer becomes a verified packing.

- `program` (the default; the TTT-Discover paper's action): a whole Python program whose
  `run_packing()` returns the packing; it runs in the sandbox (demo/discover/packing.py).
- `edits`: a JSON list of edits to the parent's circles, with the helper API's operations
  (`{"op": "nudge", "i": 2, "dx": 0.05, "dy": 0}`, `{"op": "grow", "i": 2}`,
  `{"op": "place", "i": 2, "x": 0.3, "y": 0.7, "r": 0.1}`). Pure data: parsed strictly, applied
  by the host, never executed.
- `api`: a short Python program calling `place`, `grow` and `nudge` (demo/discover/helpers.py)
  on the parent's circles; it runs in the sandbox like any model-written code.
- `coords`: the parent's circles rewritten, one `i: x y r` line each. Pure data.

In the three edit formats a state is its circles on a 1e-4 lattice (the precision the prompt
shows), kept as text in the archive (`0: 0.1667 0.1667 0.1666`, one line per circle). Whatever
the format, the packing is checked by the exact verifier (demo/discover/verifier.py) and the
reward is its recomputed Σr.
"""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path
from typing import Any, Literal, get_args

from demo.discover import packing
from demo.discover.packing import Judged
from demo.discover.sandbox import Limits, run
from demo.discover.verifier import Verdict, invalid, verify

Action = Literal["program", "edits", "api", "coords"]
ACTIONS: tuple[str, ...] = get_args(Action)
MAX_EDITS = 8  # a longer list is refused (a rambling answer, not an edit)
OPS: dict[str, tuple[str, ...]] = {
    "place": ("i", "x", "y", "r"),
    "grow": ("i",),
    "nudge": ("i", "dx", "dy"),
}
HELPERS = Path(__file__).with_name("helpers.py")
ENTRY = "_packing_result"
SYSTEM = "You improve packings of circles in a square."
_FENCE = re.compile(r"```[a-zA-Z]*[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
_NUM = r"(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"
_LINE = re.compile(rf"^(\d+):[ \t]*{_NUM}[ \t]+{_NUM}[ \t]+{_NUM}$")

Circles = tuple[list[list[float]], list[float]]


class ActionError(ValueError):
    """An answer that is not a well-formed action of its format (an invalid rollout)."""


# states ------------------------------------------------------------------------------------
def _q(v: float) -> float:
    return round(float(v) * 10000) / 10000


def state_text(centers: list[list[float]], radii: list[float]) -> str:
    """The archive's (and the prompt's) text of a state: `i: x y r` per circle, 4 decimals."""
    return "".join(
        f"{i}: {x:.4f} {y:.4f} {r:.4f}\n"
        for i, ((x, y), r) in enumerate(zip(centers, radii, strict=True))
    )


def read_state(text: str, n: int) -> Circles:
    """A state's circles from its text (strict: exactly n lines `i: x y r`, i = 0..n−1 in
    order), rounded to the lattice."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if len(lines) != n:
        raise ActionError(f"expected {n} lines `i: x y r`, got {len(lines)}")
    centers, radii = [], []
    for k, line in enumerate(lines):
        m = _LINE.match(line)
        if m is None:
            raise ActionError(f"line {k + 1} is not `i: x y r`: {line[:60]!r}")
        if int(m.group(1)) != k:
            raise ActionError(f"line {k + 1} is circle {m.group(1)}, expected {k}")
        values = [float(v) for v in m.group(2, 3, 4)]
        if not all(math.isfinite(v) for v in values):
            raise ActionError(f"line {k + 1} has a non-finite number")
        centers.append([_q(values[0]), _q(values[1])])
        radii.append(_q(values[2]))
    return centers, radii


Start = Literal["grid", "scattered"]
STARTS: tuple[str, ...] = get_args(Start)
SCATTER_SEED = 0  # one scattered start for every arm and run seed: one baseline to beat
MIN_START_R = 0.03  # a scattered centre is redrawn where it would get a smaller circle


def _grown(centers: list[list[float]], i: int, radii: list[float]) -> float:
    """Circle i's radius grown as far as the walls and circles 0..i−1 allow (on the lattice)."""
    x, y = centers[i]
    r = min(x, y, 1 - x, 1 - y)
    for j in range(i):
        r = min(r, math.dist(centers[i], centers[j]) - radii[j])
    return math.floor(max(r, 0.0) * 10000) / 10000


def seed_state(n: int, start: str = "grid") -> str:
    """The seeded baseline of the edit formats. `grid`: the baseline program's k×k grid on the
    lattice, each circle grown in order as far as the walls and the circles before it allow (a
    tight packing: local edits seldom improve it). `scattered`: centres drawn on the 0.01 grid
    (SCATTER_SEED) and grown the same way, each redrawn until its circle gets at least
    MIN_START_R: a valid packing with room to climb."""
    if start == "grid":
        k = math.ceil(math.sqrt(n))
        centers = [[_q((i % k + 0.5) / k), _q((i // k + 0.5) / k)] for i in range(n)]
        radii: list[float] = []
        for i in range(n):
            radii.append(_grown(centers, i, radii))
        return state_text(centers, radii)
    if start != "scattered":
        raise ValueError(f"start must be one of {', '.join(STARTS)}")
    rng = random.Random(SCATTER_SEED)
    centers, radii = [], []
    for i in range(n):
        while True:
            centers.append([rng.randint(5, 95) / 100, rng.randint(5, 95) / 100])
            r = _grown(centers, i, radii)
            if r >= MIN_START_R:
                radii.append(r)
                break
            centers.pop()
    return state_text(centers, radii)


def seed(action: str, n: int, start: str = "grid") -> str:
    """The seeded baseline state of `action`: a program, or circles (`start`: how they lie)."""
    return packing.baseline(n) if action == "program" else seed_state(n, start)


def _judge_circles(centers: Any, radii: Any, n: int, seconds: float = 0.0) -> Judged:
    """Verify circles on the lattice; the child's state is their text."""
    try:
        c = [[_q(x), _q(y)] for x, y in centers]
        r = [_q(v) for v in radii]
    except (TypeError, ValueError) as e:
        return Judged(None, invalid(f"not a list of circles: {e}"), seconds)
    verdict = verify(c, r, n)
    return Judged(state_text(c, r) if verdict.valid else None, verdict, seconds)


# parsing ------------------------------------------------------------------------------------
def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ActionError("an edit repeats a key")
    return dict(pairs)


def _refuse_constant(name: str) -> float:
    raise ActionError(f"{name} is not a number")


def _number(edit: dict[str, Any], key: str) -> float:
    v = edit[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ActionError(f"{key} must be a finite number, got {v!r}")
    return float(v)


def parse_edits(text: str, n: int) -> list[dict[str, Any]]:
    """The answer's first JSON list (from its first `[`; what follows the list is ignored): 1 to
    MAX_EDITS edits, each exactly one operation's keys, `op` and `i` (an integer circle index)
    plus its finite numbers; no repeated key, no NaN or Infinity. Anything else raises
    ActionError: nothing is repaired."""
    start = text.find("[")
    if start < 0:
        raise ActionError("no JSON list in the answer")
    decoder = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_refuse_constant)
    try:
        data, _ = decoder.raw_decode(text, start)
    except json.JSONDecodeError as e:
        raise ActionError(f"not JSON: {e}") from None
    if not isinstance(data, list) or not 1 <= len(data) <= MAX_EDITS:
        raise ActionError(f"expected a JSON list of 1 to {MAX_EDITS} edits")
    edits = []
    for k, edit in enumerate(data):
        if not isinstance(edit, dict) or edit.get("op") not in OPS:
            raise ActionError(f"edit {k} has no op among {', '.join(OPS)}")
        args = OPS[edit["op"]]
        if set(edit) != {"op", *args}:
            raise ActionError(f"edit {k} ({edit['op']}) must have exactly op, {', '.join(args)}")
        i = edit["i"]
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
            raise ActionError(f"edit {k}: i must be a circle index 0..{n - 1}, got {i!r}")
        edits.append({"op": edit["op"], "i": i} | {a: _number(edit, a) for a in args[1:]})
    return edits


def parse_coords(text: str, n: int) -> Circles:
    """The answer's circles: from its first line `0: x y r`, exactly n consecutive lines
    `i: x y r` with i = 0..n−1 in order (what follows them is ignored), read onto the lattice.
    Anything else raises ActionError."""
    lines = [line.strip() for line in text.splitlines()]
    first = next((k for k, line in enumerate(lines) if line.startswith("0:")), None)
    if first is None:
        raise ActionError("no line `0: x y r` in the answer")
    return read_state("\n".join(lines[first : first + n]), n)


def apply_edits(state: str, edits: list[dict[str, Any]], n: int) -> Circles:
    """The parent's circles after the edits, by the helper API's own code (helpers.py)."""
    centers, radii = read_state(state, n)
    api: dict[str, Any] = {"__name__": "discover_helpers"}
    exec(compile(HELPERS.read_text(), str(HELPERS), "exec"), api)  # trusted: our own file
    api["C"], api["R"] = centers, radii
    for edit in edits:
        api[edit["op"]](*(edit[a] for a in OPS[edit["op"]]))
    return api["C"], api["R"]


def api_program(state: str, code: str, n: int) -> str:
    """An `api` answer's code as the sandbox runs it: the helpers, the parent's circles, the
    code, then the entry that returns them."""
    centers, radii = read_state(state, n)
    return (
        f"{HELPERS.read_text()}\n\nC = {centers!r}\nR = {radii!r}\n\n"
        f"# --- the answer ---\n{code}\n# ---\n\n\ndef {ENTRY}():\n    return C, R\n"
    )


def judge(action: str, text: str, n: int, parent: str, limits: Limits) -> Judged:
    """An answer in `action`'s format, judged against its parent state: the child's state
    (program text or circles; None when invalid) and the exact verifier's verdict."""
    if action == "program":
        return packing.judge(text, n, limits)
    try:
        if action == "edits":
            return _judge_circles(*apply_edits(parent, parse_edits(text, n), n), n)
        if action == "coords":
            return _judge_circles(*parse_coords(text, n), n)
    except ActionError as e:
        return Judged(None, invalid(str(e)), 0.0)
    if action != "api":
        raise ValueError(f"unknown action {action!r}: choose from {', '.join(ACTIONS)}")
    blocks = _FENCE.findall(text)
    if not blocks:
        return Judged(None, invalid("no ```python block in the answer"), 0.0)
    outcome = run(api_program(parent, str(blocks[-1]), n), ENTRY, limits)
    if not outcome.ok or outcome.result is None or len(outcome.result) != 2:
        return Judged(None, invalid(outcome.reason), outcome.seconds)
    return _judge_circles(outcome.result[0], outcome.result[1], n, outcome.seconds)


# structured outputs --------------------------------------------------------------------------
# The action space the constrained answers and the random proposer share (random_edits).
STEPS = 100  # numbers are multiples of 1/STEPS
MOVE = 10  # a nudge moves at most MOVE/STEPS either way
MAX_R = 25  # a place sets a radius of at most MAX_R/STEPS
CONSTRAINED_EDITS = 3  # edits in one answer: 1 to this many


def _num(low: float, high: float) -> dict[str, Any]:
    return {"type": "number", "minimum": low, "maximum": high, "multipleOf": 1 / STEPS}


def edits_schema(n: int) -> dict[str, Any]:
    """The JSON schema of an `edits` answer for N = n: 1 to CONSTRAINED_EDITS edits, each one
    operation's exact keys, the circle index in 0..n−1 and each number on the 0.01 grid in the
    range the random proposer draws from, so a constrained model and the random arm share one
    action space (and a number cannot run on digit after digit)."""
    index = {"type": "integer", "minimum": 0, "maximum": n - 1}

    def op(name: str, **numbers: dict[str, Any]) -> dict[str, Any]:
        keys = {"op": {"const": name}, "i": index, **numbers}
        return {
            "type": "object",
            "properties": keys,
            "required": list(keys),
            "additionalProperties": False,
        }

    return {
        "type": "array",
        "minItems": 1,
        "maxItems": CONSTRAINED_EDITS,
        "items": {
            "anyOf": [
                op(
                    "nudge",
                    dx=_num(-MOVE / STEPS, MOVE / STEPS),
                    dy=_num(-MOVE / STEPS, MOVE / STEPS),
                ),
                op("grow"),
                op("place", x=_num(0, 1), y=_num(0, 1), r=_num(0, MAX_R / STEPS)),
            ]
        },
    }


def response_format(action: str, n: int) -> dict[str, Any] | None:
    """What a constrained rollout asks the engine to enforce: the `edits` schema (OpenAI's
    `response_format`); None for the formats that have none."""
    if action != "edits":
        return None
    return {"type": "json_schema", "json_schema": {"name": "edits", "schema": edits_schema(n)}}


# prompts -----------------------------------------------------------------------------------
OPS_TEXT = (
    "nudge(i, dx, dy) moves circle i by (dx, dy) and makes it as large as fits there; "
    "grow(i) makes circle i as large as fits where it is; place(i, x, y, r) sets circle i "
    "exactly."
)
# The example turn shows the format on a 2x2 grid of 4 circles. Its answer only makes that
# packing worse (circle 0 moves into its neighbour and shrinks): it teaches the format, not a
# move that helps.
EXAMPLE_STATE = "0: 0.2500 0.2500 0.2500\n1: 0.7500 0.2500 0.2500\n2: 0.2500 0.7500 0.2500\n3: 0.7500 0.7500 0.2500\n"
EXAMPLE_ANSWER = {
    "edits": '```json\n[{"op": "nudge", "i": 0, "dx": 0.05, "dy": 0.0}, {"op": "grow", "i": 0}]\n```',
    "api": "```python\nnudge(0, 0.05, 0.0)\ngrow(0)\n```",
    "coords": "```\n0: 0.3000 0.2500 0.2000\n1: 0.7500 0.2500 0.2500\n2: 0.2500 0.7500 0.2500\n3: 0.7500 0.7500 0.2500\n```",
}
ASK = {
    "edits": "Reply with a JSON list of edits in one ```json block, like the example: "
    '{"op": "nudge", "i": i, "dx": dx, "dy": dy} moves circle i by (dx, dy) and makes it as '
    'large as fits there; {"op": "grow", "i": i} makes circle i as large as fits.',
    "api": f"Reply with a few Python calls in one ```python block: {OPS_TEXT}",
    "coords": "Reply with all the circles rewritten with your changes, one line `i: x y r` each, "
    "in one ``` block.",
}


# A constrained answer is the bare JSON list (the schema admits nothing around it), so its
# example and request say so.
CONSTRAINED_EXAMPLE = '[{"op": "nudge", "i": 0, "dx": 0.05, "dy": 0.0}, {"op": "grow", "i": 0}]'
CONSTRAINED_ASK = (
    f"Reply with a JSON list of 1 to {CONSTRAINED_EDITS} edits, like the example: "
    '{"op": "nudge", "i": i, "dx": dx, "dy": dy} moves circle i by (dx, dy) and makes it as '
    'large as fits there; {"op": "grow", "i": i} makes circle i as large as fits; '
    '{"op": "place", "i": i, "x": x, "y": y, "r": r} sets circle i exactly.'
)


def _task(ask: str, n: int, state: str, reward: float) -> str:
    return (
        f"Place {n} circles inside the unit square [0,1]x[0,1] without overlap to maximise the "
        f"sum of their radii. Current circles (i: x y r), sum of radii = {reward:.4f}:\n{state}"
        f"Change them to make the sum larger. {ask}"
    )


def prompt(
    action: str,
    n: int,
    state: str | None,
    reward: float,
    output: str,
    *,
    constrained: bool = False,
) -> list[dict]:
    """The chat messages of one group's rollouts: the task and the parent shown the way
    `action` needs, after one example turn in the same format (the program format's prompt is
    packing.prompt's, unchanged). `constrained`: the answer is the bare JSON the engine
    enforces (`response_format`), not a fenced block."""
    if action == "program":
        return packing.prompt(n, state, reward, output)
    if state is None:
        raise ValueError(f"the {action} format edits a parent: seed the archive with circles")
    ask, example = ASK[action], EXAMPLE_ANSWER[action]
    if constrained:
        ask, example = CONSTRAINED_ASK, CONSTRAINED_EXAMPLE
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": _task(ask, 4, EXAMPLE_STATE, 1.0)},
        {"role": "assistant", "content": example},
        {"role": "user", "content": _task(ask, n, state, reward)},
    ]


# random proposals ---------------------------------------------------------------------------
def random_edits(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """1-3 uniformly drawn edits: op, circle, and numbers on a 0.01 grid (moves within ±0.1,
    places anywhere with r ≤ 0.25). Nothing here knows which edits help."""
    edits: list[dict[str, Any]] = []
    for _ in range(rng.randint(1, CONSTRAINED_EDITS)):
        op = rng.choice(sorted(OPS))
        edit: dict[str, Any] = {"op": op, "i": rng.randrange(n)}
        if op == "nudge":
            edit |= {"dx": rng.randint(-MOVE, MOVE) / STEPS, "dy": rng.randint(-MOVE, MOVE) / STEPS}
        elif op == "place":
            edit |= {"x": rng.randint(0, STEPS) / STEPS, "y": rng.randint(0, STEPS) / STEPS}
            edit["r"] = rng.randint(0, MAX_R) / STEPS
        edits.append(edit)
    return edits


def random_answer(action: str, rng: random.Random, n: int, parent: str) -> str:
    """A random proposal in `action`'s format, written as an answer would be."""
    if action == "program":
        raise ValueError("the program format has no random proposer (random samples the model)")
    if action == "coords":
        centers, radii = read_state(parent, n)
        flat = [*(v for c in centers for v in c), *radii]
        for k in rng.sample(range(len(flat)), rng.randint(1, 3)):
            flat[k] = round(flat[k] + rng.randint(-10, 10) / 100, 4)
        c = [[flat[2 * i], flat[2 * i + 1]] for i in range(n)]
        return f"```\n{state_text(c, flat[2 * n :])}```"
    edits = random_edits(rng, n)
    if action == "edits":
        return f"```json\n{json.dumps(edits)}\n```"
    calls = "\n".join(f"{e['op']}({', '.join(repr(e[a]) for a in OPS[e['op']])})" for e in edits)
    return f"```python\n{calls}\n```"


def verify_seed(action: str, state: str, n: int, limits: Limits) -> Verdict:
    """The seeded baseline's verdict: its program run, or its circles checked."""
    if action == "program":
        return packing.judge(f"```python\n{state}```", n, limits).verdict
    return _judge_circles(*read_state(state, n), n).verdict
