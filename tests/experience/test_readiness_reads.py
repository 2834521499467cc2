"""Readiness reads only what reports quote: collect() never pages through a scenario's records
(the status route, /metrics and the evolve worker call it on every check), and its numbers
stay what they were."""

from __future__ import annotations

from typing import Any

from reef.experience import collect
from reef.readiness import readiness
from reef.records import Consumption, Record, utcnow
from reef.settings import load_settings
from reef.store.sql import SQLStore
from tests.experience.conftest import append_release, record, report, session

S = "no-scans"


class NoScans(SQLStore):
    """The same database; listing records (a scan of the scenario) fails the test."""

    def list_records(self, *args: Any, **kwargs: Any) -> list[Record]:
        raise AssertionError("readiness paged through every record of the scenario")


def test_collect_reads_quoted_records_only(store: SQLStore) -> None:
    base = store.ensure_scenario(S).head_release_id
    quiet = [record(S, base) for _ in range(7)]  # nobody reports on these
    good, bad, stale, consumed = (record(S, base) for _ in range(4))
    turns = session(S, base, 3)
    store.add_records([*quiet, good, bad, stale, consumed, *turns])
    store.add_report(report(S, good.id, score=1.0))
    store.add_report(report(S, bad.id, score=None, feedback="meh"))
    store.add_report(report(S, consumed.id, score=0.5))
    store.add_report(report(S, *(r.id for r in turns), score=1.0))
    store.add_consumptions([Consumption(S, "sft", consumed.id, "batch_0", utcnow())])
    store.add_consumptions([Consumption(S, "sft", quiet[0].id, "batch_0", utcnow())])
    # `stale` was served by the base release, now two releases behind the head
    store.add_report(report(S, stale.id, score=1.0))
    append_release(store, S)
    append_release(store, S)

    guarded = NoScans(store.engine)
    exp = collect(guarded, S, "scored", recipe="sft", max_staleness=1)
    assert exp.awaiting_feedback == 6  # the 7 quiet ones, less the consumed one
    assert dict(exp.dropped) == {"consumed": 1, "no_score": 1, "stale": 3}
    assert exp.samples == ()
    anything = collect(guarded, S, "scored", recipe="sft", max_staleness=None)
    assert {s.record_ids for s in anything.samples} == {
        (good.id,),
        (stale.id,),
        tuple(r.id for r in turns),
    }
    r = readiness(guarded, S, load_settings(reef={"batch_size": 3, "max_staleness": 5}).reef)
    assert (r.eligible, r.ready, r.awaiting_feedback) == (3, True, 6)
