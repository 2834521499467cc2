"""EventStore's contract on every backend: the outbox of webhook events. Deliveries written
with a chain change exist exactly when the change commits; due ones are claimed once (a second
deliverer skips them during the lease), counted per try, retried at their time, marked
delivered or failed, listed newest first and pruned once done."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta

import pytest

from reef.errors import Conflict, HeadMoved, NotFound
from reef.records import new_id, utcnow
from reef.store.events import Delivery, EventStore
from reef.store.sql import SQLStore
from tests.store.builders import new_candidate, new_release


def _delivery(scenario: str | None, kind: str = "candidate.rejected", **fields: object) -> Delivery:
    now = utcnow()
    values: dict[str, object] = {
        "id": new_id("evd"),
        "event_id": new_id("evt"),
        "kind": kind,
        "scenario": scenario,
        "url": "http://127.0.0.1:9/hook",
        "body": json.dumps({"type": kind}),
        "created_at": now,
    }
    values.update(fields)
    return Delivery(**values)  # type: ignore[arg-type]


def test_due_deliveries_are_claimed_once_retried_and_marked(
    event_store: EventStore, store: SQLStore
) -> None:
    first, second = _delivery("ev"), _delivery(None, "evolve.failed")
    later = _delivery("ev", next_attempt_at=utcnow() + timedelta(hours=1))
    event_store.add_deliveries([first, second, later])

    claimed = event_store.claim_deliveries(10, lease_s=60)
    assert [d.id for d in claimed] == [first.id, second.id]  # oldest first; `later` not due
    assert claimed[0].body == first.body and claimed[0].event_id == first.event_id
    assert event_store.claim_deliveries(10, lease_s=60) == []  # leased: another deliverer skips

    retry = utcnow() - timedelta(seconds=1)
    again = event_store.finish_delivery(first.id, error="HTTP 500", retry_at=retry)
    assert again.status == "pending" and again.attempts == 1 and again.last_error == "HTTP 500"
    (reclaimed,) = event_store.claim_deliveries(10, lease_s=60)
    assert reclaimed.id == first.id and reclaimed.event_id == first.event_id
    done = event_store.finish_delivery(first.id)
    assert done.status == "delivered" and done.attempts == 2 and done.delivered_at is not None
    assert done.last_error is None
    failed = event_store.finish_delivery(second.id, error="refused")
    assert failed.status == "failed" and failed.attempts == 1
    with pytest.raises(NotFound):
        event_store.finish_delivery("evd_missing")

    assert [d.id for d in event_store.recent_deliveries("ev", 10)] == [later.id, first.id]
    assert len(event_store.recent_deliveries(None, 10)) == 3
    assert len(event_store.recent_deliveries(None, 1)) == 1

    # only what is done (delivered, failed) goes, and only when older than the cut
    assert event_store.prune_deliveries(utcnow() - timedelta(hours=1)) == 0
    assert event_store.prune_deliveries(utcnow() + timedelta(seconds=1)) == 2
    assert [d.id for d in event_store.recent_deliveries(None, 10)] == [later.id]


def test_chain_events_exist_exactly_when_their_change_commits(
    event_store: EventStore, store: SQLStore
) -> None:
    store.create_scenario("ev-chain")
    head = store.head_release("ev-chain")
    rejected = _delivery("ev-chain", "candidate.rejected")
    cand = store.add_candidate(
        new_candidate("ev-chain", head.id, status="rejected"), events=[rejected]
    )
    with pytest.raises(Conflict):  # the same id again: neither it nor its event is stored
        store.add_candidate(cand, events=[_delivery("ev-chain")])
    assert [d.id for d in event_store.recent_deliveries("ev-chain", 10)] == [rejected.id]

    pending = store.add_candidate(new_candidate("ev-chain", head.id))
    with pytest.raises(Conflict):  # a compare-and-swap that fails stores no event
        store.set_candidate_status(
            "ev-chain", pending.id, "rejected", expected="canary", events=[_delivery("ev-chain")]
        )
    rolled = _delivery("ev-chain", "rollout.rolled_back")
    store.set_candidate_status(
        "ev-chain", pending.id, "rolled_back", expected="pending", events=[rolled]
    )

    published = _delivery("ev-chain", "release.published")
    release = new_release("ev-chain", head.id)
    store.publish_release(release, events=[published])
    with pytest.raises(HeadMoved):  # the head moved: the losing publisher's event is not kept
        store.publish_release(
            dataclasses.replace(release, id=new_id("rel")), events=[_delivery("ev-chain")]
        )
    kept = {d.id for d in event_store.recent_deliveries("ev-chain", 10)}
    assert kept == {rejected.id, rolled.id, published.id}
