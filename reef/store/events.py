"""Event deliveries in the store: the outbox of webhook events (reef.events).

A delivery is one event bound for one webhook. It is written in the same transaction as the
state change it tells of (`insert_deliveries`, called by the chain's writes), so an event
exists exactly when its change is durable; the deliverer claims what is due, sends it and
marks it delivered, or failed with the time of its next try."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import Connection, Row, delete, insert, or_, select, update

from reef.errors import NotFound
from reef.records import utcnow
from reef.store import tables
from reef.store.database import Database

DELIVERY_STATUSES = frozenset({"pending", "delivered", "failed"})


@dataclass(frozen=True)
class Delivery:
    """One event bound for one webhook: `body` is the exact JSON sent (and signed) on every
    try; `event_id` is the same for every webhook and every try (receivers de-duplicate on
    it). `status`: pending (due at `next_attempt_at`), delivered, or failed (given up)."""

    id: str
    event_id: str
    kind: str
    scenario: str | None
    url: str
    body: str
    created_at: datetime
    status: str = "pending"
    attempts: int = 0
    next_attempt_at: datetime | None = None
    delivered_at: datetime | None = None
    last_error: str | None = None


class EventStore(Protocol):
    """The outbox: deliveries written with their state change, then sent until delivered."""

    def add_deliveries(self, deliveries: Sequence[Delivery]) -> None:
        """Store new pending deliveries (due at once) in a transaction of their own: for an
        event whose change is already durable (a failed run)."""
        ...

    def claim_deliveries(self, limit: int, lease_s: float) -> list[Delivery]:
        """Up to `limit` pending deliveries that are due, oldest first, each claimed for
        `lease_s` seconds (its next try moved that far by a compare-and-swap), so another
        deliverer (a replica) leaves it alone meanwhile."""
        ...

    def finish_delivery(
        self, delivery_id: str, *, error: str | None = None, retry_at: datetime | None = None
    ) -> Delivery:
        """Count a try: delivered when `error` is None; else pending again at `retry_at`, or
        failed (given up) when `retry_at` is None. NotFound for an unknown id."""
        ...

    def recent_deliveries(self, scenario: str | None, limit: int) -> list[Delivery]:
        """The newest deliveries (of `scenario`, or of every scenario and none), newest first."""
        ...

    def prune_deliveries(self, before: datetime) -> int:
        """Delete delivered and failed deliveries created before `before`; how many."""
        ...


class SQLEvents(Database, EventStore):
    """EventStore on SQLite or Postgres."""

    def add_deliveries(self, deliveries: Sequence[Delivery]) -> None:
        if not deliveries:
            return
        with self._tx("adding event deliveries", write=True) as conn:
            insert_deliveries(conn, deliveries)

    def claim_deliveries(self, limit: int, lease_s: float) -> list[Delivery]:
        e = tables.event_deliveries
        now = utcnow()
        due = (
            select(e)
            .where(e.c.status == "pending", e.c.next_attempt_at <= now)
            .order_by(e.c.next_attempt_at, e.c.id)
            .limit(max(limit, 0))
        )
        claimed = []
        with self._tx("claiming event deliveries", write=True) as conn:
            for row in conn.execute(due).all():
                until = now + timedelta(seconds=lease_s)
                took = conn.execute(
                    update(e)
                    .where(
                        e.c.id == row.id,
                        e.c.status == "pending",
                        e.c.next_attempt_at == row.next_attempt_at,
                    )
                    .values(next_attempt_at=until)
                ).rowcount
                if took == 1:
                    claimed.append(_delivery_of(row))
        return claimed

    def finish_delivery(
        self, delivery_id: str, *, error: str | None = None, retry_at: datetime | None = None
    ) -> Delivery:
        e = tables.event_deliveries
        now = utcnow()
        values: dict[str, Any] = {"attempts": e.c.attempts + 1}
        if error is None:
            values |= {"status": "delivered", "delivered_at": now, "last_error": None}
        elif retry_at is None:
            values |= {"status": "failed", "last_error": error[:2000]}
        else:
            values |= {"next_attempt_at": retry_at, "last_error": error[:2000]}
        with self._tx(f"finishing event delivery '{delivery_id}'", write=True) as conn:
            changed = conn.execute(update(e).where(e.c.id == delivery_id).values(values)).rowcount
            if changed != 1:
                raise NotFound(f"event delivery '{delivery_id}' not found")
            row = conn.execute(select(e).where(e.c.id == delivery_id)).one()
        return _delivery_of(row)

    def recent_deliveries(self, scenario: str | None, limit: int) -> list[Delivery]:
        e = tables.event_deliveries
        query = select(e)
        if scenario is not None:
            query = query.where(e.c.scenario == scenario)
        query = query.order_by(e.c.created_at.desc(), e.c.id.desc()).limit(max(limit, 0))
        with self._tx("listing event deliveries") as conn:
            rows = conn.execute(query).all()
        return [_delivery_of(r) for r in rows]

    def prune_deliveries(self, before: datetime) -> int:
        e = tables.event_deliveries
        done = or_(e.c.status == "delivered", e.c.status == "failed")
        with self._tx("pruning event deliveries", write=True) as conn:
            return int(conn.execute(delete(e).where(done, e.c.created_at < before)).rowcount)


def insert_deliveries(conn: Connection, deliveries: Sequence[Delivery]) -> None:
    """Write `deliveries` (pending, due at once) in the caller's transaction: the chain's
    writes call it, so an event is stored exactly when the change it tells of commits."""
    if not deliveries:
        return
    rows = []
    for d in deliveries:
        if d.status not in DELIVERY_STATUSES:
            raise ValueError(f"unknown delivery status {d.status!r}")
        rows.append(
            {
                "id": d.id,
                "event_id": d.event_id,
                "kind": d.kind,
                "scenario": d.scenario,
                "url": d.url,
                "body": d.body,
                "created_at": d.created_at,
                "status": d.status,
                "attempts": d.attempts,
                "next_attempt_at": d.next_attempt_at or d.created_at,
                "delivered_at": d.delivered_at,
                "last_error": d.last_error,
            }
        )
    conn.execute(insert(tables.event_deliveries), rows)


def _delivery_of(row: Row[Any]) -> Delivery:
    return Delivery(
        id=row.id,
        event_id=row.event_id,
        kind=row.kind,
        scenario=row.scenario,
        url=row.url,
        body=row.body,
        created_at=row.created_at,
        status=row.status,
        attempts=row.attempts,
        next_attempt_at=row.next_attempt_at,
        delivered_at=row.delivered_at,
        last_error=row.last_error,
    )
