"""The PUCT archive on a toy archive (the TTT-Discover paper): scores by hand, max-child Q,
selection with lineage blocking, the top-2 children rule, the cap and save/load."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from demo.discover.archive import Archive, State


def toy() -> Archive:
    """Two seeds (values 0 and 0.5); seed 0 has children a (1.0) and b (0.8); a has child c (1.2)."""
    ar = Archive()
    s0 = ar.seed("seed0", 0.0)
    s1 = ar.seed("seed1", 0.5)
    ar.update(
        s0.id, [State(0, "a", 1.0, 1.0, None, False), State(0, "b", 0.8, 0.8, None, False)], 4, 0
    )
    a = next(s for s in ar.states.values() if s.program == "a")
    ar.update(a.id, [State(0, "c", 1.2, 1.2, None, False)], 4, 1)
    assert s1.id == 1
    return ar


def test_scores_by_hand() -> None:
    ar = toy()
    by = {s.program: s for s in ar.states.values()}
    # visits: seed0 8 (4 + 4 via a), a 4, others 0; T = 8; N = 5
    assert (by["seed0"].visits, by["a"].visits, by["b"].visits, ar.expansions) == (8, 4, 0, 8)
    n, total = 5, 15.0
    scale = 1.2 - 0.8  # non-seed values only
    ranks = {"c": 0, "a": 1, "b": 2, "seed1": 3, "seed0": 4}
    q = {"seed0": 1.0, "a": 1.2, "b": 0.8, "c": 1.2, "seed1": 0.5}  # max-child Q once visited
    want = {
        p: q[p] + 1.0 * scale * ((n - ranks[p]) / total) * math.sqrt(1 + 8) / (1 + by[p].visits)
        for p in by
    }
    got = {p: ar.scores()[s.id] for p, s in by.items()}
    assert got == pytest.approx(want)


def test_selection_blocks_whole_lineages() -> None:
    ar = toy()
    chosen = ar.select(2)
    programs = [s.program for s in chosen]
    # c scores highest; choosing it blocks its ancestors (a, seed0) and descendants (none);
    # b (seed0's other child) is neither, so it stays available beside seed1.
    assert programs[0] == "c"
    assert programs[1] in ("b", "seed1")
    lineage = {"c", "a", "seed0"}
    assert programs[1] not in lineage
    with pytest.raises(ValueError, match="independent lineages"):
        ar.select(4)


def test_top_two_children_and_duplicates() -> None:
    ar = Archive()
    s = ar.seed(None)
    kids = [State(0, f"p{i}", v, v, None, False) for i, v in enumerate([0.3, 0.9, 0.5, 0.7])]
    kids.append(State(0, "p1", 0.9, 0.9, None, False))  # the same program text again
    kids.append(State(0, "bad", 0.0, 0.0, None, False))  # invalid: never added
    ar.update(s.id, kids, 6, 0)
    assert sorted(x.program for x in ar.states.values() if not x.seed) == ["p1", "p3"]
    assert ar.states[s.id].best_child == 0.9 and ar.states[s.id].visits == 6


def test_cap_keeps_seeds_and_the_best(tmp_path: Path) -> None:
    ar = Archive(cap=3)
    seeds = [ar.seed(None), ar.seed(None)]
    ar.update(seeds[0].id, [State(0, "x", 0.4, 0.4, None, False)], 4, 0)
    ar.update(seeds[1].id, [State(0, "y", 0.6, 0.6, None, False)], 4, 0)
    assert {s.program for s in ar.states.values()} == {None, "y"}
    assert len(ar.states) == 3 and ar.best().program == "y"
    ar.steps_done = 1
    ar.save(tmp_path / "archive.json")
    again = Archive.load(tmp_path / "archive.json")
    assert again.to_dict() == ar.to_dict() and again.scores() == ar.scores()
