"""ShadowStore's contract on every backend: a shadow rollout's answers are stored in one
transaction, listed per candidate oldest first, and summed with each score clipped."""

from __future__ import annotations

from typing import Any

import pytest

from reef.errors import NotFound
from reef.records import ShadowRecord, new_id, utcnow
from reef.store.shadows import ShadowStore
from reef.store.sql import SQLStore


def _shadow(scenario: str, release_id: str, **fields: Any) -> ShadowRecord:
    values: dict[str, Any] = {
        "id": new_id("shd"),
        "scenario": scenario,
        "created_at": utcnow(),
        "record_id": new_id("rec"),
        "release_id": release_id,
        "control_release_id": "rel_head",
        "response": {"choices": [{"message": {"role": "assistant", "content": "hi"}}]},
        "timings": {"total_s": 0.25},
        "score": 0.5,
        "control_score": 0.25,
        "scored_by": "exact",
    }
    values.update(fields)
    return ShadowRecord(**values)


def test_shadow_records_round_trip_and_page_per_release(
    shadow_store: ShadowStore, store: SQLStore
) -> None:
    store.create_scenario("a")
    store.create_scenario("b")
    mine = [_shadow("a", "rel_cand") for _ in range(5)]
    failed = _shadow("a", "rel_cand", response=None, score=None, error="engine down")
    other = _shadow("a", "rel_other")
    theirs = _shadow("b", "rel_cand")
    shadow_store.add_shadow_records([*mine, failed, other, theirs])
    shadow_store.add_shadow_records([])  # nothing to store: no transaction, no error

    ours = sorted([*mine, failed], key=lambda s: s.id)
    assert shadow_store.list_shadow_records("a", "rel_cand") == ours
    assert shadow_store.list_shadow_records("a") == sorted([*ours, other], key=lambda s: s.id)
    assert shadow_store.list_shadow_records("a", "rel_cand", after=ours[1].id, limit=2) == ours[2:4]
    assert shadow_store.list_shadow_records("a", "rel_cand", limit=0) == []
    assert shadow_store.list_shadow_records("b") == [theirs]
    assert shadow_store.list_shadow_records("a", "rel_nobody") == []
    with pytest.raises(NotFound, match="scenario 'ghost' not found"):
        shadow_store.list_shadow_records("ghost")


def test_shadow_sums_count_both_scored_and_clip(shadow_store: ShadowStore, store: SQLStore) -> None:
    store.create_scenario("a")
    shadow_store.add_shadow_records(
        [
            _shadow("a", "rel_cand", score=0.5, control_score=0.25),
            _shadow("a", "rel_cand", score=3.0, control_score=-2.0),  # clipped to 1.0 and 0.0
            _shadow("a", "rel_cand", score=None, control_score=1.0),  # unscored: left out
            _shadow("a", "rel_cand", score=1.0, control_score=None),  # unscored: left out
            _shadow("a", "rel_other", score=1.0, control_score=1.0),  # another candidate's
        ]
    )
    assert shadow_store.shadow_sums("a", "rel_cand", 0.0, 1.0) == (2, 1.5, 0.25)
    assert shadow_store.shadow_sums("a", "rel_cand", -5.0, 5.0) == (2, 3.5, -1.75)
    assert shadow_store.shadow_sums("a", "rel_nobody", 0.0, 1.0) == (0, 0.0, 0.0)
