"""judge.min_agreement: the judge's verdicts train only while its agreement with people, on
the turns both scored, is shown high enough (the lower end of a 90% Wilson interval over the
last judge.agreement_window such turns). Until then readiness and the evolve run's batch leave
the verdicts out (dropped as judge_not_trusted) and say why; people's own reports still train."""

from __future__ import annotations

from datetime import timedelta

import pytest

from reef.intervals import wilson
from reef.judge import judge_quality
from reef.readiness import readiness
from reef.records import Report, utcnow
from reef.settings import LoopSettings
from reef.store.sql import SQLStore
from tests.experience.conftest import record, report

S = "agree"


def test_the_wilson_interval_on_hand_computed_cases() -> None:
    # p = 0.9, n = 10, z = 1.6449: centre 0.8148, half-width 0.1626
    assert wilson(9, 10) == pytest.approx((0.6523, 0.9774), abs=1e-4)
    assert wilson(5, 10) == pytest.approx((0.2693, 0.7307), abs=1e-4)
    assert wilson(3, 3) == pytest.approx((0.5258, 1.0), abs=1e-4)  # 3 of 3 shows little
    assert wilson(0, 0) is None


def _judgment(scenario: str, rid: str, verdict: int, when: object) -> Report:
    return report(
        scenario,
        rid,
        score=1.0 if verdict > 0 else 0.0,
        created_at=when,
        metadata={"source": "judge", "verdict": verdict, "judge": "test"},
    )


def test_recent_agreement_counts_the_latest_window() -> None:
    t0 = utcnow()
    reps = []
    for i in range(6):  # the judge says +1 each time; people agree on the first 3 only
        reps.append(_judgment(S, f"r{i}", 1, t0))
        reps.append(report(S, f"r{i}", score=1.0 if i < 3 else 0.0, created_at=t0 + timedelta(i)))
    every = judge_quality(reps, window=50)
    assert (every.compared, every.agreed) == (6, 3)
    last = judge_quality(reps, window=3)
    assert (last.recent_compared, last.recent_agreed) == (3, 0)
    assert last.trust(0.5) is not None and "0 of the last 3" in str(last.trust(0.5))
    assert last.trust(None) is None


def test_verdicts_train_only_once_agreement_is_shown(store: SQLStore) -> None:
    base = store.ensure_scenario(S).head_release_id
    t0 = utcnow()
    labelled = [record(S, base) for _ in range(10)]  # judged and scored by a person
    judged_only = [record(S, base) for _ in range(4)]  # only the judge's verdict
    store.add_records(labelled + judged_only)
    for i, rec in enumerate(labelled):
        store.add_report(_judgment(S, rec.id, 1, t0))
        agrees = i < 9  # 9 of 10 agree: interval 0.65-0.98
        person = report(S, rec.id, score=1.0 if agrees else 0.0, created_at=t0 + timedelta(i))
        store.add_report(person)
    for rec in judged_only:
        store.add_report(_judgment(S, rec.id, 1, t0))
    loop = LoopSettings(batch_size=12)

    off = readiness(store, S, loop)
    assert off.eligible == 14 and off.judge_refused is None
    shown = readiness(store, S, loop, min_agreement=0.6)
    assert shown.eligible == 14 and shown.judge_refused is None and shown.ready
    refused = readiness(store, S, loop, min_agreement=0.7)
    # the people's 10 reports still count; the judge's 4 lone verdicts do not
    assert (refused.eligible, refused.ready) == (10, False)
    assert refused.dropped["judge_not_trusted"] == 4
    assert refused.judge_refused is not None
    assert "agreed with people on 9 of the last 10 turns" in refused.judge_refused
    assert "0.65-0.98" in refused.judge_refused
    # the window is the latest turns: the last 3 hold the one disagreement
    few = readiness(store, S, loop, min_agreement=0.6, agreement_window=3)
    assert few.judge_refused is not None and "2 of the last 3" in few.judge_refused
    assert "(90% interval 0.25-0.92)" in few.judge_refused
