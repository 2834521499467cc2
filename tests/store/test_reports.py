"""ReportStore's contract on every backend: reports are idempotent per scenario and id, the
recipes' consumption receipts keep the first batch, and the sums readiness and rollouts take
(records awaiting feedback, an arm's scores) are single aggregate queries."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import pytest

from reef.errors import Conflict, NotFound
from reef.records import USER_TAG, Consumption, Record, Report, Slice, new_id, utcnow
from reef.store import tables
from reef.store.reports import ReportStore
from reef.store.rows import id_at
from reef.store.sql import SQLStore
from tests.store.builders import new_release, new_report

MakeRecord = Callable[..., Record]


def _base(store: SQLStore, name: str = "exp") -> str:
    return store.create_scenario(name).head_release_id


def _scored(scenario: str, *refs: str) -> Report:
    return Report(
        id=new_id("rep"), scenario=scenario, created_at=utcnow(), references=refs, score=1.0
    )


def test_report_round_trip_and_idempotency(
    report_store: ReportStore, store: SQLStore, make_record: MakeRecord
) -> None:
    sc = store.create_scenario("a")
    r = make_record("a", sc.head_release_id)
    store.add_records([r])
    report = new_report("a", (r.id, "rec_other"))

    stored, created = report_store.add_report(report)
    assert created is True
    assert stored == report
    assert report_store.get_report("a", report.id) == report

    # A retry (same id, same content, even a later timestamp) returns the stored one.
    retry = new_report(
        "a", report.references, id=report.id, created_at=utcnow() + timedelta(seconds=5)
    )
    again, created = report_store.add_report(retry)
    assert created is False
    assert again == report

    changed = new_report("a", report.references, id=report.id, score=0.0)
    with pytest.raises(
        Conflict, match=f"report_id {report.id} already exists with different content"
    ):
        report_store.add_report(changed)

    text_report = new_report("a", (r.id,), feedback="plain text", score=None, metadata={})
    report_store.add_report(text_report)
    assert report_store.get_report("a", text_report.id) == text_report
    assert report_store.list_reports("a") == sorted([report, text_report], key=lambda x: x.id)
    assert report_store.list_reports("a", after=min(report.id, text_report.id), limit=5) == [
        max([report, text_report], key=lambda x: x.id)
    ]


def test_report_ids_are_scoped_by_scenario(report_store: ReportStore, store: SQLStore) -> None:
    # another scenario's report_id neither blocks this one's nor shows through it
    store.create_scenario("a")
    store.create_scenario("b")
    theirs = new_report("a", ("rec_a",), id="judge-1", feedback="a's secret")
    ours = new_report("b", ("rec_b",), id="judge-1", score=0.0, feedback="b's")
    assert report_store.add_report(theirs) == (theirs, True)
    assert report_store.add_report(ours) == (ours, True)
    assert report_store.add_report(ours) == (ours, False)  # a retry in b is b's
    assert report_store.get_report("a", "judge-1") == theirs
    assert report_store.get_report("b", "judge-1") == ours
    assert report_store.list_reports("b") == [ours]
    with pytest.raises(Conflict) as e:
        report_store.add_report(new_report("b", ("rec_b",), id="judge-1", score=1.0))
    assert "a's secret" not in e.value.message and "'a'" not in e.value.message
    store.delete_scenario("a")
    assert report_store.get_report("b", "judge-1") == ours
    with pytest.raises(NotFound, match="scenario 'ghost' not found"):
        report_store.add_report(new_report("ghost", ("rec_x",), id="judge-1"))


def test_report_not_found_cases(report_store: ReportStore, store: SQLStore) -> None:
    store.create_scenario("a")
    with pytest.raises(NotFound, match="report 'rep_nope' not found in scenario 'a'"):
        report_store.get_report("a", "rep_nope")
    with pytest.raises(NotFound, match="scenario 'ghost' not found"):
        report_store.add_report(new_report("ghost", ("rec_x",)))
    with pytest.raises(NotFound, match="release 'rel_nope' not found in scenario 'a'"):
        store.get_release("a", "rel_nope")


def test_concurrent_identical_reports_create_once(
    report_store: ReportStore, store: SQLStore
) -> None:
    store.create_scenario("a")
    report = new_report("a", ("rec_x",))
    n = 6
    barrier = threading.Barrier(n)
    created: list[bool] = []

    def add() -> None:
        barrier.wait()
        created.append(report_store.add_report(report)[1])

    threads = [threading.Thread(target=add) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(created) == [False] * (n - 1) + [True]
    assert report_store.list_reports("a") == [report]


def test_consumptions_are_idempotent_and_scoped_by_recipe(
    report_store: ReportStore, store: SQLStore, make_record: MakeRecord
) -> None:
    release = _base(store)
    a, b = make_record("exp", release), make_record("exp", release)
    store.add_records([a, b])
    now = utcnow()
    report_store.add_consumptions([Consumption("exp", "sft", a.id, "batch-1", now)])
    report_store.add_consumptions(
        [
            Consumption("exp", "sft", a.id, "batch-2", now),  # already consumed: kept as is
            Consumption("exp", "sft", b.id, "batch-2", now),
            Consumption("exp", "dpo", a.id, "batch-3", now),
        ]
    )
    report_store.add_consumptions([])
    assert report_store.consumed_record_ids("exp", "sft") == {a.id, b.id}
    assert report_store.consumed_record_ids("exp", "dpo") == {a.id}
    assert report_store.consumed_record_ids("exp", "grpo") == set()
    with store.engine.connect() as conn:
        t = tables.consumptions
        batch = conn.execute(t.select().where(t.c.recipe == "sft", t.c.record_id == a.id)).one()
    assert batch.batch_id == "batch-1"

    with pytest.raises(NotFound, match="scenario 'nope'"):
        report_store.add_consumptions([Consumption("nope", "sft", a.id, "b", now)])


def test_count_awaiting_feedback_leaves_out_quoted_and_consumed_records(
    report_store: ReportStore, store: SQLStore, make_record: MakeRecord
) -> None:
    base = store.ensure_scenario("a").head_release_id
    other = store.ensure_scenario("b").head_release_id
    recs = [make_record("a", base) for _ in range(10)]
    theirs = [make_record("b", other) for _ in range(3)]
    store.add_records([*recs, *theirs])
    assert report_store.count_awaiting_feedback("a", "sft") == 10

    report_store.add_report(_scored("a", recs[0].id))
    report_store.add_report(_scored("a", recs[1].id, recs[2].id))  # a trajectory quotes two
    report_store.add_report(_scored("a", recs[1].id))  # quoted twice counts once
    report_store.add_report(_scored("b", theirs[0].id))  # another scenario's report
    assert report_store.count_awaiting_feedback("a", "sft") == 7

    now = utcnow()
    report_store.add_consumptions(
        [
            Consumption("a", "sft", recs[3].id, "batch_1", now),  # consumed, never quoted
            Consumption("a", "sft", recs[0].id, "batch_1", now),  # quoted and consumed
            Consumption("a", "dpo", recs[4].id, "batch_2", now),  # another recipe's receipt
        ]
    )
    assert report_store.count_awaiting_feedback("a", "sft") == 6
    assert report_store.count_awaiting_feedback("a", "dpo") == 6
    assert report_store.count_awaiting_feedback("b", "sft") == 2
    assert report_store.count_awaiting_feedback("nope", "sft") == 0


def test_count_awaiting_feedback_of_a_slice_counts_its_tagged_records(
    report_store: ReportStore, store: SQLStore, make_record: MakeRecord
) -> None:
    base = store.ensure_scenario("sl").head_release_id
    planner = [make_record("sl", base, tags={"role": "planner", "app": "x"}) for _ in range(4)]
    executor = [make_record("sl", base, tags={"role": "executor"}) for _ in range(3)]
    untagged = [make_record("sl", base) for _ in range(2)]
    store.add_records([*planner, *executor, *untagged])
    report_store.add_report(_scored("sl", planner[0].id))

    def count(within: Slice | None = None) -> int:
        return report_store.count_awaiting_feedback("sl", "sft", within)

    assert count() == 8
    assert count(Slice({"role": "planner"})) == 3
    assert count(Slice({"role": "executor"})) == 3
    assert count(Slice({"role": "planner", "app": "x"})) == 3
    assert count(Slice({"role": "planner", "app": "y"})) == 0
    assert count(Slice()) == 8


def test_count_awaiting_feedback_of_sessions_and_users(
    report_store: ReportStore, store: SQLStore, make_record: MakeRecord
) -> None:
    """reef.select.sessions / .users, counted in the database (session_id, the reef.user tag)."""
    base = store.ensure_scenario("su").head_release_id
    run = [make_record("su", base, session_id="run-a", turn=k) for k in range(3)]
    other = make_record("su", base, session_id="run-b", turn=0)
    alice = [make_record("su", base, tags={USER_TAG: "alice"}) for _ in range(2)]
    bob = make_record("su", base, tags={USER_TAG: "bob", "role": "planner"}, session_id="run-a")
    store.add_records([*run, other, *alice, bob])
    report_store.add_report(_scored("su", run[0].id))

    def count(within: Slice) -> int:
        return report_store.count_awaiting_feedback("su", "sft", within)

    assert count(Slice(sessions=("run-a",))) == 3  # two of the run's turns and bob's
    assert count(Slice(sessions=("run-a", "run-b"))) == 4
    assert count(Slice(users=("alice",))) == 2
    assert count(Slice(users=("alice", "bob"))) == 3
    assert count(Slice({"role": "planner"}, sessions=("run-a",), users=("bob",))) == 1
    assert count(Slice(sessions=("run-b",), users=("bob",))) == 0


def test_quoting_reports_and_deleting_reports_with_their_references(
    report_store: ReportStore, store: SQLStore, make_record: MakeRecord
) -> None:
    base = _base(store, "a")
    other = _base(store, "b")
    recs = [make_record("a", base) for _ in range(4)]
    theirs = make_record("b", other)
    store.add_records([*recs, theirs])
    first, _ = report_store.add_report(_scored("a", recs[0].id, recs[1].id))
    second, _ = report_store.add_report(_scored("a", recs[1].id))
    report_store.add_report(_scored("b", theirs.id))

    wanted = [r.id for r in recs] + [theirs.id, "rec_unknown"]
    assert report_store.quoting_reports("a", wanted) == {
        recs[0].id: {first.id},
        recs[1].id: {first.id, second.id},
    }
    assert report_store.quoting_reports("a", []) == {}

    assert report_store.delete_reports("a", [first]) == 1
    assert report_store.list_reports("a") == [second]
    assert report_store.quoting_reports("a", wanted) == {recs[1].id: {second.id}}
    assert report_store.quoting_reports("b", [theirs.id]) != {}  # another scenario's stay
    assert report_store.count_awaiting_feedback("a", "sft") == 3


def test_arm_sums_clip_the_scores_of_one_release_since_a_time(
    report_store: ReportStore, store: SQLStore, make_record: MakeRecord
) -> None:
    head = _base(store, "a")
    canary = store.publish_release(new_release("a", head)).id
    now = utcnow()
    # Ids sort by time: a record made an hour ago has an hour-old id.
    old = make_record("a", canary, id=id_at("rec", now - timedelta(hours=1)))
    served = [make_record("a", canary) for _ in range(3)]
    control = make_record("a", head)
    unscored = make_record("a", canary)
    store.add_records([old, *served, control, unscored])
    for record, score in zip([old, *served, control], [1.0, 0.5, 3.0, -1.0, 0.25], strict=True):
        report_store.add_report(new_report("a", (record.id,), score=score))
    report_store.add_report(new_report("a", (unscored.id,), score=None))

    since = now - timedelta(minutes=10)
    assert report_store.arm_sums("a", canary, since, 0.0, 1.0) == (3, 1.5)  # 0.5 + 1 + 0
    assert report_store.arm_sums("a", canary, since, -5.0, 5.0) == (3, 2.5)
    assert report_store.arm_sums("a", canary, now - timedelta(hours=2), 0.0, 1.0) == (4, 2.5)
    assert report_store.arm_sums("a", head, since, 0.0, 1.0) == (1, 0.25)
    assert report_store.arm_sums("a", canary, now + timedelta(hours=1), 0.0, 1.0) == (0, 0.0)
    assert report_store.arm_sums("b", canary, since, 0.0, 1.0) == (0, 0.0)
