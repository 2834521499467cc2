"""The annotation queue in the store, on SQLite and on Postgres: a turn is added once, and of
reviewers racing for items through two stores (two connection pools, as two replicas have)
each item goes to exactly one; a claim past its lease can be taken by another; only the holder
finishes an item."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

from reef.records import Record
from reef.store.sql import SQLStore, open_store


def _turns(store: SQLStore, make_record: Callable[..., Record], n: int) -> list[str]:
    head = store.ensure_scenario("q")
    records = [make_record("q", head.head_release_id) for _ in range(n)]
    store.add_records(records)
    return [r.id for r in records]


def test_items_are_added_once(store: SQLStore, make_record: Callable[..., Record]) -> None:
    ids = _turns(store, make_record, 3)
    assert store.add_review_items("q", [(i, "sample") for i in ids]) == 3
    assert store.add_review_items("q", [(ids[0], "canary"), (ids[1], "sample")]) == 0
    items = store.review_items("q", None, 10)
    assert [i.record_id for i in items] == ids
    assert {i.reason for i in items} == {"sample"}
    assert store.queue_progress("q").open == 3
    assert store.recent_turns("q", 2) == [
        (r, store.get_record("q", r).release_id) for r in ids[::-1][:2]
    ]


def test_racing_reviewers_never_share_an_item(
    store: SQLStore, database_url: str, make_record: Callable[..., Record]
) -> None:
    ids = _turns(store, make_record, 24)
    store.add_review_items("q", [(i, "sample") for i in ids])
    other = open_store(database_url)  # another replica's pool on the same database
    got: dict[str, list[str]] = {}
    start = threading.Barrier(6)

    def reviewer(name: str, s: SQLStore) -> None:
        mine: list[str] = []
        start.wait()
        while (item := s.claim_review_item("q", name, 600)) is not None:
            mine.append(item.id)
            assert s.finish_review_item("q", item.id, name, "done", None)
        got[name] = mine

    try:
        threads = [
            threading.Thread(target=reviewer, args=(f"r{i}", store if i % 2 else other))
            for i in range(6)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        other.close()
    taken = Counter(i for mine in got.values() for i in mine)
    assert len(got) == 6
    assert sorted(taken) == sorted(i.id for i in store.review_items("q", None, 100))
    assert set(taken.values()) == {1}  # every item once, none twice
    p = store.queue_progress("q")
    assert (p.open, p.done) == (0, 24)


def test_a_claim_holds_until_its_lease_ends(
    store: SQLStore, make_record: Callable[..., Record]
) -> None:
    ids = _turns(store, make_record, 2)
    store.add_review_items("q", [(i, "sample") for i in ids])
    a = store.claim_review_item("q", "ann", 600)
    assert a is not None and a.record_id == ids[0] and a.claimed_by == "ann"
    # ann asking again gets the item she holds; ben gets the other one, then nothing
    again = store.claim_review_item("q", "ann", 600)
    assert again is not None and again.id == a.id
    b = store.claim_review_item("q", "ben", 600)
    assert b is not None and b.record_id == ids[1]
    assert store.claim_review_item("q", "cy", 600) is None
    assert store.claim_review_item("q", "cy", 600, item_id=a.id) is None
    assert store.queue_progress("q").held == 2
    # ben's hold lapses: cy may take it, and ben can no longer finish it
    store.claim_review_item("q", "ben", 0.01, item_id=b.id)
    time.sleep(0.05)
    c = store.claim_review_item("q", "cy", 600)
    assert c is not None and c.id == b.id and c.claimed_by == "cy"
    assert not store.finish_review_item("q", b.id, "ben", "done", None)
    assert store.finish_review_item("q", b.id, "cy", "skipped", None)
    assert store.finish_review_item("q", a.id, "ann", "done", "rpt_x")
    p = store.queue_progress("q")
    assert (p.open, p.done, p.skipped, p.total) == (0, 1, 1, 2)
    done = store.review_items("q", "done", 10)
    assert [(i.done_by, i.report_id) for i in done] == [("ann", "rpt_x")]
    store.delete_scenario("q")
    assert store.review_items("q", None, 10) == []
