"""The annotation queue's policies (reef.review): which turn each picks, and why."""

from __future__ import annotations

from typing import Any

from reef.records import Report, utcnow
from reef.review import describe, reason, sampled
from reef.settings import ReviewSettings


def _report(score: float | None, **metadata: Any) -> Report:
    return Report(
        id=f"rpt_{len(metadata)}{score}",
        scenario="s",
        created_at=utcnow(),
        references=("rec_1",),
        score=score,
        metadata=metadata,
    )


def _judged(verdict: int, confidence: float) -> Report:
    return _report(float(verdict), source="judge", verdict=verdict, confidence=confidence)


def test_sample_is_a_stable_share_of_turns() -> None:
    ids = [f"rec_{i:05d}" for i in range(4000)]
    picked = [i for i in ids if sampled(i, 0.25)]
    assert 850 < len(picked) < 1150  # about a quarter
    assert picked == [i for i in ids if sampled(i, 0.25)]  # the same on every fill
    assert not any(sampled(i, 0.0) for i in ids) and all(sampled(i, 1.0) for i in ids)


def test_each_policy_picks_its_turns() -> None:
    none = ReviewSettings()
    assert not none.active and describe(none) == []
    unsure = ReviewSettings(unsure_below=0.7)
    assert reason(unsure, "rec_1", "rel_a", [_judged(1, 0.6)], frozenset()) == "unsure"
    assert reason(unsure, "rec_1", "rel_a", [_judged(1, 0.9)], frozenset()) is None
    dropped = _report(None, source="judge", dropped="no next turn")
    assert reason(unsure, "rec_1", "rel_a", [dropped], frozenset()) is None
    split = ReviewSettings(disagreement=True)
    # the judge said +1, a person scored 0: they disagree; a person's 0.75 agrees
    assert reason(split, "rec_1", "rel_a", [_judged(1, 1.0), _report(0.0)], frozenset()) == (
        "disagreement"
    )
    assert reason(split, "rec_1", "rel_a", [_judged(1, 1.0), _report(0.75)], frozenset()) is None
    assert reason(split, "rec_1", "rel_a", [_judged(-1, 1.0), _report(1.0)], frozenset()) == (
        "disagreement"
    )
    canary = ReviewSettings(canary=True)
    assert reason(canary, "rec_1", "rel_c", [], frozenset({"rel_c"})) == "canary"
    assert reason(canary, "rec_1", "rel_a", [], frozenset({"rel_c"})) is None
    every = ReviewSettings(sample=1.0, unsure_below=0.5, disagreement=True, canary=True)
    assert describe(every) == [
        "a random 100% of turns",
        "judgments less sure than 0.5",
        "turns where the judge and a person disagree",
        "turns served by a canary",
    ]


def test_the_guard_policy_queues_at_the_gate_not_from_the_traffic() -> None:
    guarded = ReviewSettings(guard_failed=True)
    # a fill has nothing to look for: the evolve flow queues the answers as it keeps them
    assert not guarded.active
    assert describe(guarded) == ["a candidate's answers a gate guard failed"]
    assert reason(guarded, "rec_1", "rel_a", [], frozenset()) is None
