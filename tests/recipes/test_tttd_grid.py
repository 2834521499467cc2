"""The step grid's barrier and report contract (recipes.tttd.grid, the TTT-Discover paper): only
a full G × R grid trains; the first report at a slot wins; other sizes, bad metadata and
grids of mixed releases never train."""

from __future__ import annotations

import json
from typing import Any

import pytest

from reef.errors import ConfigError
from reef.recipe import load_recipe
from reef.recipes.tttd.grid import grid_metadata, select, slot_of

G, R = 2, 3


def row(step: int, g: int, r: int, *, at: int = 0, release: str = "rel_0", **meta: Any) -> dict:
    m = grid_metadata(step, g, r, G, R) | meta
    return {
        "sample_id": f"rec_{step}_{g}_{r}_{at}",
        "release_id": release,
        "report_id": f"rpt_{at:04d}_{step}{g}{r}",
        "reported_at": f"2026-01-01T00:00:{at:02d}+00:00",
        "report_metadata": json.dumps(m),
        "score": float(r),
    }


def grid(step: int, **kw: Any) -> list[dict]:
    return [row(step, g, r, **kw) for g in range(G) for r in range(R)]


def test_an_incomplete_grid_waits() -> None:
    rows = grid(0)[:-1]
    batch = select(rows, G, R)
    assert batch.step is None and batch.rows == ()
    assert batch.waiting is not None and "step 0: 5/6" in batch.waiting


def test_a_full_grid_trains_in_slot_order() -> None:
    rows = grid(0)[::-1]
    batch = select(rows, G, R)
    assert batch.step == 0 and batch.waiting is None
    slots = [
        (json.loads(r["report_metadata"])["group"], json.loads(r["report_metadata"])["rollout"])
        for r in batch.rows
    ]
    assert slots == [(g, r) for g in range(G) for r in range(R)]


def test_first_report_at_a_slot_wins() -> None:
    late = row(0, 1, 2, at=9)
    late["score"] = 99.0
    batch = select([late, *grid(0, at=1)], G, R)
    assert batch.step == 0 and batch.dropped["duplicate_slot"] == 1
    assert late not in batch.rows and all(r["score"] != 99.0 for r in batch.rows)
    # duplicates never fill a grid: five slots plus a repeat is still incomplete
    partial = [*grid(0)[:-1], row(0, 0, 0, at=5)]
    assert select(partial, G, R).step is None


def test_lowest_full_step_first_and_mixed_releases_discarded() -> None:
    mixed = grid(0)
    mixed[0] = row(0, 0, 0, release="rel_other")
    batch = select(mixed + grid(1) + grid(2)[:2], G, R)
    assert batch.step == 1
    assert len(batch.discard) == G * R and batch.dropped["mixed_releases"] == G * R


@pytest.mark.parametrize(
    ("meta", "reason"),
    [
        (None, "no_grid_metadata"),
        ({"step": 0, "group": 0}, "bad_grid_metadata"),
        (grid_metadata(0, 0, 0, 4, R), "grid_size_mismatch"),
        (grid_metadata(0, 2, 0, G, R), "bad_grid_metadata"),  # group outside [0, G)
        (grid_metadata(0, 0, 0, G, R) | {"algorithm": "grpo"}, "bad_grid_metadata"),
        (grid_metadata(0, 0, 0, G, R) | {"comparison_set": "x"}, "bad_grid_metadata"),
        (grid_metadata(-1, 0, 0, G, R), "bad_grid_metadata"),
        (grid_metadata(0, 0, True, G, R), "bad_grid_metadata"),  # a bool is not an index
    ],
)
def test_the_report_contract(meta: dict | None, reason: str) -> None:
    assert slot_of(meta, G, R) == reason


def test_recipe_wires_the_barrier() -> None:
    recipe = load_recipe("tttd", {"groups_per_step": G, "rollouts_per_group": R})
    assert recipe.kind == "rollout" and recipe.report_rule == "first"
    assert recipe.default_gate == "always"
    assert recipe.select(grid(0)[:-1]).waiting is not None
    full = recipe.select(grid(0))
    assert full.waiting is None and len(full.rows) == G * R and full.whole


@pytest.mark.parametrize(
    "bad", [{"rollouts_per_group": 2}, {"kl_coef": 0.0}, {"full": True}, {"groups_per_step": 0}]
)
def test_params_refused(bad: dict) -> None:
    with pytest.raises(ConfigError):
        load_recipe("tttd", bad)
