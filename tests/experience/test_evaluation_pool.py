"""The evaluation pool on a real store: evaluation samples are chosen by their content for good,
never count toward a batch, never train, and pile up across rounds (capped by count and age)
for the gate to decide on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from reef import evaluation_pool
from reef.datasets import row
from reef.evaluation_pool import held_out, pool, split
from reef.experience import collect, consume
from reef.readiness import readiness
from reef.records import _CROCKFORD, id_time, new_id, utcnow
from reef.settings import load_settings
from reef.store.sql import SQLStore
from tests.experience.conftest import append_release, record, report, session

S = "pooled"
SHARE = 0.25


def id_at(when: datetime, tail: int) -> str:
    """A record id as `new_id` makes it, at a chosen time (the pool's age comes from it)."""
    n = int(when.timestamp() * 1000) << 80 | tail
    chars = []
    for _ in range(26):
        n, r = divmod(n, 32)
        chars.append(_CROCKFORD[r])
    return "rec_" + "".join(reversed(chars))


def _round(store: SQLStore, start: int, n: int, **fields: object) -> None:
    """`n` distinct questions answered by the head and reported (score 1)."""
    head = store.head_release(S).id
    recs = [
        record(S, head, prompt=f"Question {i}?", answer=f"Answer {i}.", **fields)
        for i in range(start, start + n)
    ]
    store.add_records(recs)
    for r in recs:
        store.add_report(report(S, r.id, score=1.0))


def test_membership_is_the_content_and_rows_agree_with_samples(store: SQLStore) -> None:
    base = store.ensure_scenario(S).head_release_id
    _round(store, 0, 40)
    turns = session(S, base, 3)
    store.add_records(turns)
    store.add_report(report(S, *(r.id for r in turns), score=0.5))
    for kind in ("scored", "rollout", "trajectory"):
        exp = collect(store, S, kind, recipe="sft")
        rows = [row(s, S) for s in exp.samples]
        train, evaluation = split(rows, SHARE)
        expected = {s.sample_id for s in exp.samples if held_out(s, SHARE)}
        assert {r["sample_id"] for r in evaluation} == expected, kind
        assert len(train) + len(evaluation) == len(rows)
    scored = collect(store, S, "scored", recipe="sft").samples
    members = [s for s in scored if held_out(s, SHARE)]
    assert 0 < len(members) < len(scored)  # some of 41, not all
    # the same question answered the same way is on the same side, whatever its id
    again = record(S, base, prompt="Question 0?", answer="Answer 0.")
    first = next(s for s in scored if s.completion == "Answer 0.")
    store.add_records([again])
    store.add_report(report(S, again.id, score=0.0))
    twin = next(
        s for s in collect(store, S, "scored", recipe="sft").samples if s.sample_id == again.id
    )
    assert held_out(twin, SHARE) == held_out(first, SHARE)
    assert not any(held_out(s, 0.0) for s in scored)
    # a preference pair goes with its chosen answer (here the first, scored 1 against 0)
    (pair,) = collect(store, S, "preference", recipe="sft").samples
    assert pair.record_ids[0] == first.sample_id
    assert held_out(pair, SHARE) == held_out(first, SHARE)


def test_the_pool_grows_across_rounds_and_nothing_in_it_trains(store: SQLStore) -> None:
    store.ensure_scenario(S)
    loop = load_settings(reef={"recipe": "sft", "batch_size": 8}).reef
    _round(store, 0, 16)
    ready = readiness(store, S, loop, holdout=SHARE)
    exp = collect(store, S, "scored", recipe="sft", max_staleness=0)
    members = {s.sample_id for s in exp.samples if held_out(s, SHARE)}
    assert ready.eligible == 16 - len(members) and ready.dropped["held_out"] == len(members)
    assert readiness(store, S, loop).eligible == 16  # nothing held out: everything counts
    # round 1 trains on (and consumes) its training samples only; a release follows
    train, _ = split([row(s, S) for s in exp.samples], SHARE)
    consume(store, S, "sft", [s for s in exp.samples if s.sample_id not in members], "batch_1")
    append_release(store, S)
    round_1 = pool(collect(store, S, "scored", recipe="sft"), SHARE, max_n=64, max_age_s=3600)
    assert {r["sample_id"] for r in round_1} == members and len(train) == 16 - len(members)
    # round 2: the first round's evaluation samples are stale for training, still in the pool
    _round(store, 16, 16)
    after = readiness(store, S, loop, holdout=SHARE)
    assert after.dropped["stale"] == len(members)  # never consumed: only too old to train
    exp2 = collect(store, S, "scored", recipe="sft")
    members2 = {s.sample_id for s in exp2.samples if held_out(s, SHARE)}
    round_2 = pool(exp2, SHARE, max_n=64, max_age_s=3600)
    assert {r["sample_id"] for r in round_2} == members2 > members
    assert not members2 & store.consumed_record_ids(S, "sft")
    # the newest first, capped
    capped = pool(exp2, SHARE, max_n=2, max_age_s=3600)
    newest = sorted(round_2, key=lambda r: r["record_ids"][0], reverse=True)[:2]
    assert [r["sample_id"] for r in capped] == [r["sample_id"] for r in newest]


def test_the_pool_forgets_old_samples(store: SQLStore) -> None:
    store.ensure_scenario(S)
    now = utcnow()
    for age_days, start in ((30, 0), (1, 40)):
        when = now - timedelta(days=age_days)
        head = store.head_release(S).id
        recs = [
            record(S, head, prompt=f"Q {i}", answer=f"A {i}", id=id_at(when, i))
            for i in range(start, start + 40)
        ]
        store.add_records(recs)
        for r in recs:
            store.add_report(report(S, r.id, score=1.0))
    exp = collect(store, S, "scored", recipe="sft")
    week = pool(exp, SHARE, max_n=1000, max_age_s=7 * 24 * 3600, now=now)
    everything = pool(exp, SHARE, max_n=1000, max_age_s=60 * 24 * 3600, now=now)
    assert 0 < len(week) < len(everything)
    for r in week:
        when = id_time(r["record_ids"][0])
        assert when is not None and now - when < timedelta(days=7)


def test_what_holds_nothing_out() -> None:
    assert evaluation_pool.fraction(load_settings()) == 0.25
    assert evaluation_pool.fraction(load_settings(gate={"policy": "always"})) == 0.0
    assert evaluation_pool.fraction(load_settings(gate={"eval_dataset": "tasks.jsonl"})) == 0.0
    # tttd's own gate is `always` unless the configuration names one
    assert evaluation_pool.fraction(load_settings(reef={"recipe": "tttd"})) == 0.0
    tttd_improve = load_settings(reef={"recipe": "tttd"}, gate={"policy": "improve"})
    assert evaluation_pool.fraction(tttd_improve) == 0.25


def test_record_id_times() -> None:
    when = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    assert id_time(id_at(when, 12345)) == when
    made = new_id("rec")
    t = id_time(made)
    assert t is not None and abs(t - utcnow()) < timedelta(seconds=5)
    for foreign in ("rec-123", "abc", "rec_" + "u" * 26, "rec_" + "z" * 26):
        assert id_time(foreign) is None


@pytest.mark.parametrize("share", [0.1, 0.5])
def test_the_share_is_about_right(share: float) -> None:
    rows = [{"messages": f'[{{"content":"q{i}"}}]', "completion": "a"} for i in range(2000)]
    _, evaluation = split(rows, share)
    assert abs(len(evaluation) / 2000 - share) < 0.05
