"""The step grid (the TTT-Discover paper): where each scored rollout sits (step, group, rollout),
the report contract that puts it there, and the barrier that turns a full grid into a batch.

A client (the search harness, demo/discover) reports every rollout of step s against its
receipt with metadata

    {"step": s, "group": g, "rollout": r, "groups_per_step": G, "rollouts_per_group": R,
     "algorithm": "tttd", "comparison_set": "tttd-step-<s>-group-<g>"}

The rules, in the order they apply:
- a report whose metadata breaks the contract, or announces another G × R than the recipe is
  configured for, never trains (dropped, counted);
- the first report at a slot wins: a later report at the same (step, group, rollout) is
  ignored, whichever receipt it quotes (the report stream is append-only and a retry is
  terminal; with the harness's slot-derived report ids a changed retry is already a 409);
- a step becomes a batch only when all G × R slots are filled (the barrier); until then it
  waits and nothing is consumed;
- a full grid whose rollouts came from more than one release is discarded whole (its groups
  would compare rollouts of different policies); it is consumed so later steps can train;
- the lowest full step trains first; each evolve run trains one grid.

Nothing here imports torch: the evolve flow asks for the batch before it trains.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

ALGORITHMS = ("tttd", "ttt-discover")
Row = dict[str, Any]


@dataclass(frozen=True)
class Slot:
    step: int
    group: int
    rollout: int


def comparison_set(step: int, group: int) -> str:
    return f"tttd-step-{step}-group-{group}"


def grid_metadata(step: int, group: int, rollout: int, groups: int, rollouts: int) -> dict:
    """The metadata a report of this slot carries (what a client sends)."""
    return {
        "step": step,
        "group": group,
        "rollout": rollout,
        "groups_per_step": groups,
        "rollouts_per_group": rollouts,
        "algorithm": "tttd",
        "comparison_set": comparison_set(step, group),
    }


def _int(meta: dict[str, Any], key: str) -> int | None:
    value = meta.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def slot_of(metadata: dict[str, Any] | None, groups: int, rollouts: int) -> Slot | str:
    """The slot a report's metadata names, or why it names none (a drop reason)."""
    if not metadata:
        return "no_grid_metadata"
    step, group, rollout = (_int(metadata, k) for k in ("step", "group", "rollout"))
    g, r = _int(metadata, "groups_per_step"), _int(metadata, "rollouts_per_group")
    if step is None or group is None or rollout is None or g is None or r is None:
        return "bad_grid_metadata"
    if metadata.get("algorithm") not in ALGORITHMS or r < 2 or step < 0:
        return "bad_grid_metadata"
    if not (0 <= group < g and 0 <= rollout < r):
        return "bad_grid_metadata"
    if metadata.get("comparison_set") != comparison_set(step, group):
        return "bad_grid_metadata"
    if (g, r) != (groups, rollouts):
        return "grid_size_mismatch"  # announced for another configuration: never trains
    return Slot(step, group, rollout)


@dataclass(frozen=True)
class Batch:
    """What the barrier lets through now: the grid to train (in group, rollout order), the
    rows to consume without training (discarded grids), or why it waits."""

    step: int | None = None
    rows: tuple[Row, ...] = ()
    discard: tuple[Row, ...] = ()
    waiting: str | None = None
    dropped: Counter[str] = field(default_factory=Counter)


def _metadata(row: Row) -> dict[str, Any] | None:
    text = row.get("report_metadata")
    if not text:
        return None
    value = json.loads(text)
    return value if isinstance(value, dict) else None


def _first_come(row: Row) -> tuple[str, str]:
    # Reports sort by when they were stored; the report id (time-ordered) breaks ties.
    return (str(row.get("reported_at") or ""), str(row.get("report_id") or ""))


def select(rows: Sequence[Row], groups: int, rollouts: int) -> Batch:
    """The next grid to train under the barrier (see the module docstring)."""
    dropped: Counter[str] = Counter()
    slots: dict[Slot, Row] = {}
    for row in sorted(rows, key=_first_come):
        slot = slot_of(_metadata(row), groups, rollouts)
        if isinstance(slot, str):
            dropped[slot] += 1
        elif slot in slots:
            dropped["duplicate_slot"] += 1
        else:
            slots[slot] = row
    by_step: dict[int, dict[Slot, Row]] = {}
    for slot, row in slots.items():
        by_step.setdefault(slot.step, {})[slot] = row
    size = groups * rollouts
    discard: list[Row] = []
    for step in sorted(by_step):
        grid = by_step[step]
        if len(grid) < size:
            continue
        ordered = tuple(grid[s] for s in sorted(grid, key=lambda s: (s.group, s.rollout)))
        if len({r["release_id"] for r in ordered}) > 1:
            dropped["mixed_releases"] += len(ordered)
            discard.extend(ordered)
            continue
        return Batch(step, ordered, tuple(discard), None, dropped)
    filled = ", ".join(f"step {s}: {len(g)}/{size}" for s, g in sorted(by_step.items()))
    waiting = f"no full {groups}x{rollouts} grid yet ({filled or 'no grid reports'})"
    return Batch(None, (), tuple(discard), waiting, dropped)
