"""The discovery's action formats (demo/discover/actions.py): strict parsing, what an edit does to
a state, the exact verifier on the result, and the `discover.action` option. No model."""

from __future__ import annotations

import json
import math
import random
from decimal import Decimal
from pathlib import Path

import pytest

from demo.discover import actions
from demo.discover.__main__ import config, parser
from demo.discover.actions import ActionError, apply_edits, judge, parse_coords, parse_edits
from demo.discover.harness import Config
from demo.discover.sandbox import Limits
from demo.discover.settings import load
from reef.errors import ConfigError

N = 6
SEED = actions.seed_state(N)
LIMITS = Limits(wall_s=30)


def circles(text: str) -> list[list[float]]:
    return [[float(v) for v in line.split(":")[1].split()] for line in text.splitlines()]


def test_the_seed_is_a_valid_packing_on_the_lattice_and_reads_back_exactly() -> None:
    verdict = actions.verify_seed("edits", SEED, N, LIMITS)
    assert verdict.valid and verdict.reward == pytest.approx(0.9997)
    centers, radii = actions.read_state(SEED, N)
    assert actions.state_text(centers, radii) == SEED
    assert all(v == round(v, 4) for c in centers for v in c)


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ("no list here", "no JSON list"),
        ("[]", "1 to 8 edits"),
        ('{"op": "grow", "i": 0}', "no JSON list"),
        ("[" + ", ".join(['{"op": "grow", "i": 0}'] * 9) + "]", "1 to 8 edits"),
        ('[{"op": "shrink", "i": 0}]', "no op among"),
        ('[{"op": "grow"}]', "exactly op, i"),
        ('[{"op": "grow", "i": 0, "dx": 0.1}]', "exactly op, i"),
        ('[{"op": "nudge", "i": 0, "dx": 0.1}]', "exactly op, i, dx, dy"),
        ('[{"op": "grow", "i": 6}]', "circle index 0..5"),
        ('[{"op": "grow", "i": -1}]', "circle index"),
        ('[{"op": "grow", "i": 1.0}]', "circle index"),
        ('[{"op": "grow", "i": true}]', "circle index"),
        ('[{"op": "grow", "i": "1"}]', "circle index"),
        ('[{"op": "nudge", "i": 0, "dx": NaN, "dy": 0}]', "not a number"),
        ('[{"op": "nudge", "i": 0, "dx": Infinity, "dy": 0}]', "not a number"),
        ('[{"op": "nudge", "i": 0, "dx": "0.1", "dy": 0}]', "finite number"),
        ('[{"op": "nudge", "i": 0, "dx": 1e999, "dy": 0}]', "finite number"),
        ('[{"op": "grow", "i": 0, "i": 1}]', "repeats a key"),
        ('[{"op": "grow", "i": 0},]', "not JSON"),
        ("[{'op': 'grow', 'i': 0}]", "not JSON"),
        ('[{"op": "grow", "i": 0}', "not JSON"),
    ],
)
def test_edit_lists_are_parsed_strictly(answer: str, why: str) -> None:
    with pytest.raises(ActionError, match=why):
        parse_edits(answer, N)
    judged = judge("edits", answer, N, SEED, LIMITS)
    assert not judged.verdict.valid and judged.verdict.reward == 0.0 and judged.program is None


def test_an_edit_list_is_read_from_its_block_and_what_follows_is_ignored() -> None:
    answer = (
        'Sure:\n```json\n[{"op": "nudge", "i": 4, "dx": 0, "dy": 0.1}, {"op": "grow", "i": 4},'
        ' {"op": "place", "i": 1, "x": 0.5, "y": 0.2, "r": 0.1}]\n```\nThen [ more text'
    )
    assert parse_edits(answer, N) == [
        {"op": "nudge", "i": 4, "dx": 0.0, "dy": 0.1},
        {"op": "grow", "i": 4},
        {"op": "place", "i": 1, "x": 0.5, "y": 0.2, "r": 0.1},
    ]


def test_grow_and_nudge_keep_the_packing_valid_and_the_verifier_scores_it() -> None:
    # Circle 4 (the middle) moves into the empty top row and grows: Σr rises.
    centers, radii = apply_edits(
        SEED,
        parse_edits('[{"op": "nudge", "i": 4, "dx": 0, "dy": 0.1}, {"op": "grow", "i": 4}]', N),
        N,
    )
    assert centers[4] == [0.5, 0.6] and radii[4] == 0.1813
    assert math.dist(centers[4], centers[3]) >= radii[4] + radii[3]  # grown to touch, floored
    judged = judge(
        "edits",
        '[{"op": "nudge", "i": 4, "dx": 0, "dy": 0.1}, {"op": "grow", "i": 4}]',
        N,
        SEED,
        LIMITS,
    )
    assert judged.verdict.valid and judged.verdict.reward == pytest.approx(sum(radii))
    assert judged.program is not None and circles(judged.program)[4] == [0.5, 0.6, 0.1813]
    # A nudge into a neighbour shrinks the moved circle: still valid, smaller.
    shrunk = judge("edits", '[{"op": "nudge", "i": 0, "dx": 0.05, "dy": 0}]', N, SEED, LIMITS)
    assert shrunk.verdict.valid and shrunk.verdict.reward < 0.9997
    # Moves stay in the square: the centre is clipped to the wall, the radius to 0.
    wall = judge("edits", '[{"op": "nudge", "i": 0, "dx": -5, "dy": 0}]', N, SEED, LIMITS)
    assert wall.verdict.valid and wall.program is not None
    assert circles(wall.program)[0] == [0.0, 0.1667, 0.0]


def test_place_is_exact_and_the_verifier_rejects_what_it_breaks() -> None:
    overlap = judge(
        "edits", '[{"op": "place", "i": 0, "x": 0.5, "y": 0.5, "r": 0.1}]', N, SEED, LIMITS
    )
    assert not overlap.verdict.valid and "overlap" in overlap.verdict.reason
    outside = judge(
        "edits", '[{"op": "place", "i": 0, "x": 0.05, "y": 0.2, "r": 0.1}]', N, SEED, LIMITS
    )
    assert not outside.verdict.valid and "unit square" in outside.verdict.reason
    negative = judge(
        "edits", '[{"op": "place", "i": 0, "x": 0.2, "y": 0.2, "r": -0.1}]', N, SEED, LIMITS
    )
    assert not negative.verdict.valid and "negative radius" in negative.verdict.reason
    # Numbers land on the 1e-4 lattice the prompt shows.
    fine = judge(
        "edits", '[{"op": "place", "i": 0, "x": 0.123456, "y": 0.166, "r": 0.05}]', N, SEED, LIMITS
    )
    assert fine.verdict.valid and fine.program is not None
    assert circles(fine.program)[0] == [0.1235, 0.166, 0.05]


def test_coords_answers_are_exactly_n_lines_in_order() -> None:
    assert parse_coords(f"Here:\n```\n{SEED}```\nmore: 1 2 3", N) == actions.read_state(SEED, N)
    lines = SEED.splitlines()
    for bad, why in [
        ("\n".join(lines[1:]), "no line `0: x y r`"),
        ("\n".join(lines[:5]), "expected 6 lines"),
        ("\n".join([lines[0], lines[2], lines[1], *lines[3:]]), "is circle 2, expected 1"),
        ("\n".join([*lines[:5], "5: 0.8 0.5"]), "is not `i: x y r`"),
        ("\n".join([*lines[:5], "5: 0.8 0.5 nan"]), "is not `i: x y r`"),
    ]:
        with pytest.raises(ActionError, match=why):
            parse_coords(bad, N)
    moved = SEED.replace("4: 0.5000 0.5000 0.1667", "4: 0.5000 0.5000 0.2000")
    judged = judge("coords", moved, N, SEED, LIMITS)
    assert not judged.verdict.valid and "overlap" in judged.verdict.reason  # never repaired


def test_api_answers_run_in_the_sandbox_and_mean_what_edits_mean() -> None:
    calls = "```python\nnudge(4, 0, 0.1)\ngrow(4)\n```"
    edits = '[{"op": "nudge", "i": 4, "dx": 0, "dy": 0.1}, {"op": "grow", "i": 4}]'
    api = judge("api", calls, N, SEED, LIMITS)
    assert api.verdict.valid and api.program == judge("edits", edits, N, SEED, LIMITS).program
    # The answer cannot replace the entry: ours comes after it.
    cheat = "```python\ndef _packing_result():\n    return [[0.5, 0.5]] * 6, [9] * 6\n```"
    assert judge("api", cheat, N, SEED, LIMITS).program == SEED
    assert not judge("api", "```python\ngrow(6)\n```", N, SEED, LIMITS).verdict.valid
    escape = "```python\nopen('/etc/passwd').read()\n```"
    assert "no file access" in judge("api", escape, N, SEED, LIMITS).verdict.reason
    assert not judge("api", "grow(0)", N, SEED, LIMITS).verdict.valid  # no block


@pytest.mark.parametrize("action", ["edits", "api", "coords"])
def test_random_proposals_are_answers_in_their_format(action: str) -> None:
    rng = random.Random(7)
    verdicts = [
        judge(action, actions.random_answer(action, rng, N, SEED), N, SEED, LIMITS)
        for _ in range(4 if action == "api" else 40)
    ]
    if action != "api":  # every one parses; the verifier alone decides validity
        assert all(
            "sum of radii" in v.verdict.reason
            or "overlap" in v.verdict.reason
            or "unit square" in v.verdict.reason
            for v in verdicts
        )
    assert any(v.verdict.valid for v in verdicts)


def test_prompts_show_the_parent_in_the_format_after_an_example_turn() -> None:
    for action in ("edits", "api", "coords"):
        messages = actions.prompt(action, N, SEED, 0.9997, "")
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
        assert SEED in messages[-1]["content"] and "0.9997" in messages[-1]["content"]
        example = messages[2]["content"]
        # the example answer parses in its own format (and only worsens its 2x2 example)
        ex = judge(action, example, 4, actions.EXAMPLE_STATE, LIMITS)
        assert ex.verdict.valid and ex.verdict.reward < 1.0
    assert "```python" in actions.prompt("program", N, None, 0.0, "")[1]["content"]


def test_the_action_option_is_validated(tmp_path: Path) -> None:
    assert Config().action == "program"  # programs stay the default
    with pytest.raises(ValueError, match="action must be one of"):
        Config(action="json")
    good = tmp_path / "good.yaml"
    good.write_text("discover:\n  action: edits\n")
    assert load(good).action == "edits"
    assert config(parser().parse_args(["-c", str(good)])).action == "edits"
    assert config(parser().parse_args(["-c", str(good), "--action", "coords"])).action == "coords"
    bad = tmp_path / "bad.yaml"
    bad.write_text("discover:\n  action: prose\n")
    with pytest.raises(ConfigError, match="invalid discover settings"):
        load(bad)
    with pytest.raises(SystemExit):
        parser().parse_args(["--action", "prose"])
    assert json.loads(json.dumps(actions.ACTIONS)) == ["program", "edits", "api", "coords"]


def test_a_release_records_the_best_edit_answer_too() -> None:
    from reef.recipes.tttd.learner import last_program

    answer = 'Here:\n```json\n[{"op": "grow", "i": 0}]\n```\nDone.'
    assert last_program(answer) == '[{"op": "grow", "i": 0}]\n'
    assert last_program("```python\nx = 1\n```") == "x = 1\n"


def _exact(value: object) -> object:
    """JSON numbers as Decimals: multipleOf 0.01 is exact there (0.07 / 0.01 is not 7 in
    floating point)."""
    return json.loads(json.dumps(value), parse_float=Decimal)


def test_the_edits_schema_is_the_random_proposers_action_space() -> None:
    import jsonschema

    schema = jsonschema.Draft202012Validator(_exact(actions.edits_schema(N)))
    rng = random.Random(3)
    for _ in range(300):  # every random proposal is an answer the schema admits
        schema.validate(_exact(actions.random_edits(rng, N)))
    for outside in (
        [{"op": "nudge", "i": 0, "dx": 0.015, "dy": 0.0}],
        [],
        [{"op": "grow", "i": N}],
        [{"op": "nudge", "i": 0, "dx": 0.2, "dy": 0.0}],
        [{"op": "place", "i": 0, "x": 0.5, "y": 0.5, "r": 0.3}],
        [{"op": "grow", "i": 0, "dx": 0.0}],
        [{"op": "grow", "i": 0}] * (actions.CONSTRAINED_EDITS + 1),
    ):
        with pytest.raises(jsonschema.ValidationError):
            schema.validate(_exact(outside))
    assert actions.response_format("edits", N) == {
        "type": "json_schema",
        "json_schema": {"name": "edits", "schema": actions.edits_schema(N)},
    }
    assert actions.response_format("program", N) is None


def test_a_constrained_prompt_asks_for_the_bare_list_it_enforces(tmp_path: Path) -> None:
    import jsonschema

    messages = actions.prompt("edits", N, SEED, 0.9997, "", constrained=True)
    example = messages[2]["content"]
    assert example.startswith("[") and "```" not in example + messages[-1]["content"]
    jsonschema.validate(_exact(json.loads(example)), _exact(actions.edits_schema(4)))
    assert judge("edits", example, 4, actions.EXAMPLE_STATE, LIMITS).verdict.valid
    with pytest.raises(ValueError, match="no schema to enforce"):
        Config(action="program", constrained=True)
    on = tmp_path / "on.yaml"
    on.write_text("discover:\n  action: edits\n  constrained: true\n")
    assert config(parser().parse_args(["-c", str(on)])).constrained
    assert not config(parser().parse_args(["-c", str(on), "--no-constrained"])).constrained


def test_the_scattered_start_is_a_valid_packing_with_room_to_climb(tmp_path: Path) -> None:
    start = actions.seed_state(N, "scattered")
    assert start == actions.seed_state(N, "scattered")  # one start for every arm and seed
    verdict = judge("coords", start, N, start, LIMITS).verdict
    grid = judge("coords", SEED, N, SEED, LIMITS).verdict
    assert verdict.valid and 0.5 < verdict.reward < grid.reward
    assert min(r for *_, r in circles(start)) >= actions.MIN_START_R
    rng = random.Random(5)  # uniformly random edits improve it now and then
    better = sum(
        judge(
            "edits", actions.random_answer("edits", rng, N, start), N, start, LIMITS
        ).verdict.reward
        > verdict.reward
        for _ in range(200)
    )
    assert better >= 3
    assert actions.seed("edits", N) == SEED  # the grid stays the default
    with pytest.raises(ValueError, match="baseline program only"):
        Config(action="program", start="scattered")
    f = tmp_path / "s.yaml"
    f.write_text("discover:\n  action: edits\n  start: scattered\n")
    assert config(parser().parse_args(["-c", str(f)])).start == "scattered"
    assert config(parser().parse_args(["-c", str(f), "--start", "grid"])).start == "grid"


def test_an_edit_answer_that_changes_nothing_scores_as_invalid() -> None:
    from demo.discover.archive import State
    from demo.discover.harness import UNCHANGED, _changed

    parent = State(0, SEED, 0.9997, 0.9997, None, False, "")
    cfg = Config(action="edits", n=N)
    tight = judge("edits", '[{"op": "grow", "i": 0}]', N, SEED, LIMITS)  # already as large
    assert tight.verdict.valid and tight.program == SEED
    unchanged = _changed(tight, parent, cfg)
    assert not unchanged.verdict.valid and unchanged.verdict.reward == 0
    assert unchanged.verdict.reason == UNCHANGED
    moved = judge("edits", '[{"op": "nudge", "i": 0, "dx": 0.05, "dy": 0}]', N, SEED, LIMITS)
    assert _changed(moved, parent, cfg) is moved
    assert _changed(tight, parent, Config()) is tight  # programs keep their own rule
