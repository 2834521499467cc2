"""The dashboard's queries (reef.store.browse) on SQLite and Postgres: report references written
with each report, filtered pages below a cursor within a bounded window, per-release scores,
traffic counts by time-sortable id, a record's reports."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import timedelta

import pytest

from reef.intervals import wilson
from reef.records import Record, Report, new_id, utcnow
from reef.store import tables
from reef.store.browse import Browse, RecordFilter, id_at
from reef.store.sql import SQLStore


def _report(scenario: str, refs: tuple[str, ...], score: float | None) -> Report:
    return Report(new_id("rpt"), scenario, utcnow(), refs, score=score, feedback="ok")


def test_filters_pages_and_scores(store: SQLStore, make_record: Callable[..., Record]) -> None:
    base = store.ensure_scenario("ui").head_release_id
    recs = [
        make_record(
            "ui",
            base,
            request={"messages": [{"role": "user", "content": f"Question {i} 100%_sure"}]},
            tags={"user": f"u{i % 2}"},
        )
        for i in range(10)
    ]
    recs.sort(key=lambda r: r.id)  # ids made in one millisecond need not come out in order
    store.add_records(recs)
    store.add_report(_report("ui", (recs[1].id, recs[2].id), 1.0))
    store.add_report(_report("ui", (recs[2].id,), 0.0))
    store.add_report(_report("ui", (recs[3].id,), None))
    x = tables.report_references
    with store.engine.connect() as conn:
        assert conn.execute(x.select()).all().__len__() == 4  # one row per quoted receipt

    browse = Browse(store, window=4)
    page = browse.records("ui", RecordFilter(), limit=3)
    assert [r.id for r in page.records] == [r.id for r in recs[::-1][:3]]
    assert page.next_before == recs[7].id and not page.window_end
    rest = browse.records("ui", RecordFilter(), before=page.next_before, limit=100)
    assert [r.id for r in rest.records] == [r.id for r in recs[::-1][3:]]
    assert rest.next_before is None

    # a filter walks at most `window` records below the cursor, then says where it stopped
    fb = browse.records("ui", RecordFilter(feedback=True), limit=100)
    assert fb.records == [] and fb.window_end and fb.next_before == recs[6].id
    fb = Browse(store).records("ui", RecordFilter(feedback=True), limit=100)
    assert [r.id for r in fb.records] == [recs[3].id, recs[2].id, recs[1].id]
    assert fb.feedback[recs[2].id].reports == 2 and fb.feedback[recs[2].id].mean_score == 0.5
    big = Browse(store)
    none = big.records("ui", RecordFilter(feedback=False), limit=100)
    assert len(none.records) == 7
    scored = big.records("ui", RecordFilter(min_score=0.5), limit=100)
    assert [r.id for r in scored.records] == [recs[2].id, recs[1].id]
    text = big.records("ui", RecordFilter(text="question 7 "), limit=100)
    seven = [r.id for r in recs if "Question 7 " in r.request["messages"][0]["content"]]
    assert [r.id for r in text.records] == seven
    literal = big.records("ui", RecordFilter(text="100%_s"), limit=100)  # no wildcards
    assert len(literal.records) == 10
    assert big.records("ui", RecordFilter(text="100x_s"), limit=100).records == []
    tagged = big.records("ui", RecordFilter(tag="user=u1"), limit=100)
    assert len(tagged.records) == 5
    assert big.records("ui", RecordFilter(release_id="rel_other"), limit=100).records == []
    later = big.records("ui", RecordFilter(since=utcnow() + timedelta(minutes=1)), limit=100)
    assert later.records == []

    scores = big.release_scores("ui")
    assert scores[base].n == 3 and abs(scores[base].mean - 2 / 3) < 1e-9
    assert scores[base].low < scores[base].mean < scores[base].high
    # every score is 0 or 1: the interval is Wilson's, inside [0, 1]
    assert scores[base].bounds == (0.0, 1.0)
    assert (scores[base].low, scores[base].high) == pytest.approx(wilson(2, 3, z=1.96))

    reports = big.reports_for("ui", [recs[2].id, recs[5].id])
    assert [p.score for p in reports[recs[2].id]] == [1.0, 0.0] and reports[recs[5].id] == []

    traffic = big.traffic("ui")
    assert traffic.records == 10 and traffic.quoted == 3 and len(traffic.hourly) == 24

    # named metrics per release: booleans count 1/0, categorical ones have no mean
    for helpful, accuracy in ((True, 0.5), (False, 0.75), (True, 1.0)):
        metrics = {"helpful": helpful, "accuracy": accuracy, "tone": "formal"}
        store.add_report(dataclasses.replace(_report("ui", (recs[4].id,), None), metrics=metrics))
    named = big.release_metrics("ui")[base]
    assert sorted(named) == ["accuracy", "helpful"]
    assert (named["helpful"].n, named["helpful"].mean) == (3, pytest.approx(2 / 3))
    assert named["accuracy"].mean == pytest.approx(0.75) and named["accuracy"].bounds == (0, 1)
    assert big.release_metrics("nothing-here") == {}


def test_id_at_orders_like_new_id() -> None:
    now = utcnow()
    made = new_id("rec")
    assert (
        id_at("rec", now - timedelta(seconds=1)) < made < id_at("rec", now + timedelta(seconds=1))
    )


def test_deleting_a_scenario_drops_its_references(
    store: SQLStore, make_record: Callable[..., Record]
) -> None:
    base = store.ensure_scenario("gone").head_release_id
    rec = make_record("gone", base)
    store.add_records([rec])
    store.add_report(_report("gone", (rec.id,), 1.0))
    store.delete_scenario("gone")
    x = tables.report_references
    with store.engine.connect() as conn:
        assert conn.execute(x.select().where(x.c.scenario == "gone")).all() == []


def test_text_search_scans_a_bounded_number_of_bytes(
    store: SQLStore, make_record: Callable[..., Record]
) -> None:
    """Text search compares the first TEXT_SCAN_CHARS of each request and answer, over at most
    `text_window` records a page: any token can repeat it, so its cost must not grow with
    the bodies' size or the scenario's."""
    from reef.store.browse import TEXT_SCAN_CHARS

    base = store.ensure_scenario("big").head_release_id
    filler = "x" * TEXT_SCAN_CHARS
    recs = [
        make_record("big", base, request={"messages": [{"role": "user", "content": text}]})
        for text in ("early needle " + filler, filler + " late needle", "plain", "plain")
    ]
    recs.sort(key=lambda r: r.id)
    store.add_records(recs)
    found = Browse(store).records("big", RecordFilter(text="needle"), limit=100)
    early = [r.id for r in recs if r.request["messages"][0]["content"].startswith("early")]
    assert [r.id for r in found.records] == early  # the late one lies past the scanned part
    page = Browse(store, window=100, text_window=2).records(
        "big", RecordFilter(text="needle"), limit=100
    )
    assert page.window_end and page.next_before == recs[2].id  # two records looked at
    other = Browse(store, window=100, text_window=2).records(
        "big", RecordFilter(feedback=False), limit=100
    )
    assert len(other.records) == 4  # other filters keep the full window
