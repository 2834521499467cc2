"""The Store's reads that keep readiness and sessions off full scans, on every backend:
records by id, the awaiting-feedback count as one aggregate, a session as one query."""

from __future__ import annotations

from collections.abc import Callable

from reef.records import Consumption, Record, Report, new_id, utcnow
from reef.store.sql import SQLStore

MakeRecord = Callable[..., Record]


def _report(scenario: str, *refs: str) -> Report:
    return Report(
        id=new_id("rep"), scenario=scenario, created_at=utcnow(), references=refs, score=1.0
    )


def test_get_records_reads_by_id_in_batches_scoped_to_the_scenario(
    store: SQLStore, make_record: MakeRecord
) -> None:
    base = store.ensure_scenario("a").head_release_id
    other = store.ensure_scenario("b").head_release_id
    mine = [make_record("a", base) for _ in range(1203)]  # more than one IN (...) batch
    theirs = make_record("b", other)
    store.add_records([*mine, theirs])

    wanted = [r.id for r in mine[::-2]] + [mine[0].id, "rec_unknown", theirs.id]
    got = store.get_records("a", wanted)
    assert [r.id for r in got] == sorted({r.id for r in mine[::-2]} | {mine[0].id})
    by_id = {r.id: r for r in mine}
    assert all(r == by_id[r.id] for r in got)  # whole records, exactly as stored
    assert store.get_records("a", []) == []
    assert store.get_records("b", [mine[1].id]) == []


def test_count_awaiting_feedback_leaves_out_quoted_and_consumed_records(
    store: SQLStore, make_record: MakeRecord
) -> None:
    base = store.ensure_scenario("a").head_release_id
    other = store.ensure_scenario("b").head_release_id
    recs = [make_record("a", base) for _ in range(10)]
    theirs = [make_record("b", other) for _ in range(3)]
    store.add_records([*recs, *theirs])
    assert store.count_awaiting_feedback("a", "sft") == 10

    store.add_report(_report("a", recs[0].id))
    store.add_report(_report("a", recs[1].id, recs[2].id))  # a trajectory quotes two
    store.add_report(_report("a", recs[1].id))  # quoted twice counts once
    store.add_report(_report("b", theirs[0].id))  # another scenario's report
    assert store.count_awaiting_feedback("a", "sft") == 7

    now = utcnow()
    store.add_consumptions(
        [
            Consumption("a", "sft", recs[3].id, "batch_1", now),  # consumed, never quoted
            Consumption("a", "sft", recs[0].id, "batch_1", now),  # quoted and consumed
            Consumption("a", "dpo", recs[4].id, "batch_2", now),  # another recipe's receipt
        ]
    )
    assert store.count_awaiting_feedback("a", "sft") == 6
    assert store.count_awaiting_feedback("a", "dpo") == 6
    assert store.count_awaiting_feedback("b", "sft") == 2
    assert store.count_awaiting_feedback("nope", "sft") == 0


def test_session_records_is_the_parent_chain_ending_at_the_tail(
    store: SQLStore, make_record: MakeRecord
) -> None:
    base = store.ensure_scenario("a").head_release_id
    ses, fork = new_id("ses"), new_id("ses")
    turns: list[Record] = []
    for k in range(4):
        parent = turns[-1].id if turns else None
        turns.append(make_record("a", base, session_id=ses, turn=k, parent_id=parent))
    # a fork: a new session whose first record continues turn 1 of the first one
    forked = [make_record("a", base, session_id=fork, turn=2, parent_id=turns[1].id)]
    forked.append(make_record("a", base, session_id=fork, turn=3, parent_id=forked[0].id))
    noise = make_record("a", base, session_id=new_id("ses"), turn=0)
    store.add_records([*turns, *forked, noise])

    assert store.session_records("a", ses) == turns
    assert store.session_records("a", fork) == [turns[0], turns[1], *forked]
    assert [r.id for r in store.session_records("a", fork, limit=3)] == [
        turns[1].id,
        *(r.id for r in forked),
    ]
    assert store.session_records("a", "ses_unknown") == []
    assert store.session_records("b", ses) == []
