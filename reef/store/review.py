"""The annotation queue in the store: turns people are asked to review (reef.review fills it).

An item is added once per turn (a unique key on scenario and record; a second add is a no-op,
so every replica may fill the same queue at once). A reviewer takes an item by a conditional
UPDATE that only succeeds while nobody holds it (no claim, or a claim past its lease) and
checks the rowcount: of two reviewers racing for the same item, on SQLite or on Postgres across
replicas, exactly one gets it and the other moves on to the next."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import Row, case, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite

from reef.records import new_id, utcnow
from reef.store import tables
from reef.store.database import Database

REVIEW_STATUSES = ("open", "done", "skipped")
_TRIES = 20  # candidates read per claim attempt: those another reviewer took meanwhile are passed


@dataclass(frozen=True)
class ReviewItem:
    """One turn in a scenario's annotation queue. `status`: open (to review; held by
    `claimed_by` until `claimed_until`), done (reviewed: `report_id` is the review's report) or
    skipped."""

    id: str
    scenario: str
    record_id: str
    reason: str
    created_at: datetime
    status: str = "open"
    claimed_by: str | None = None
    claimed_until: datetime | None = None
    done_by: str | None = None
    done_at: datetime | None = None
    report_id: str | None = None


@dataclass(frozen=True)
class QueueProgress:
    """How far a scenario's queue is: items open (held now among them), done, skipped."""

    open: int = 0
    held: int = 0
    done: int = 0
    skipped: int = 0

    @property
    def total(self) -> int:
        return self.open + self.done + self.skipped


class ReviewStore(Protocol):
    """Each scenario's annotation queue: items added once, taken by one reviewer at a time."""

    def add_review_items(self, scenario: str, picked: Sequence[tuple[str, str]]) -> int:
        """Add (record_id, reason) items to the queue; a turn already in it (in any status)
        is left as it is. Returns how many were added."""
        ...

    def claim_review_item(
        self, scenario: str, reviewer: str, lease_s: float, item_id: str | None = None
    ) -> ReviewItem | None:
        """Give `reviewer` an open item for `lease_s` seconds: the one they already hold, else
        the oldest nobody holds (or whose hold expired), else None. With `item_id`, that item
        only. Never gives an item another reviewer holds."""
        ...

    def finish_review_item(
        self, scenario: str, item_id: str, reviewer: str, status: str, report_id: str | None
    ) -> bool:
        """Close an item `reviewer` holds (done with its report, or skipped). False when
        they no longer hold it (another reviewer took it after their lease ran out)."""
        ...

    def review_items(
        self, scenario: str, status: str | None, limit: int, *, newest: bool = False
    ) -> list[ReviewItem]:
        """The queue's items (of `status`, or all), oldest first (`newest`: newest first)."""
        ...

    def review_items_by_id(self, scenario: str, ids: Sequence[str]) -> list[ReviewItem]:
        """The items of these ids (those that exist)."""
        ...

    def queue_progress(self, scenario: str) -> QueueProgress: ...

    def recent_turns(self, scenario: str, limit: int) -> list[tuple[str, str]]:
        """The scenario's `limit` newest records as (record id, release id), newest first:
        what a fill of the queue looks at."""
        ...


class SQLReview(Database, ReviewStore):
    """ReviewStore on SQLite or Postgres."""

    def add_review_items(self, scenario: str, picked: Sequence[tuple[str, str]]) -> int:
        if not picked:
            return 0
        now = utcnow()
        rows = [
            {
                "id": new_id("rvw"),
                "scenario": scenario,
                "record_id": record_id,
                "reason": reason,
                # in the order given (the queue serves the oldest first)
                "created_at": now + timedelta(microseconds=i),
                "status": "open",
            }
            for i, (record_id, reason) in enumerate(dict(picked).items())
        ]
        with self._tx(f"adding review items to '{scenario}'", write=True) as conn:
            dialect_insert = sqlite.insert if self._sqlite else postgresql.insert
            t = tables.review_items
            stmt = dialect_insert(t).on_conflict_do_nothing(
                index_elements=["scenario", "record_id"]
            )
            # the rows RETURNING gives are those inserted (executemany's rowcount is not
            # known on every driver)
            return len(conn.execute(stmt.returning(t.c.id), rows).all())

    def claim_review_item(
        self, scenario: str, reviewer: str, lease_s: float, item_id: str | None = None
    ) -> ReviewItem | None:
        t = tables.review_items
        now = utcnow()
        free = or_(t.c.claimed_by.is_(None), t.c.claimed_until < now, t.c.claimed_by == reviewer)
        query = select(t).where(t.c.scenario == scenario, t.c.status == "open", free)
        if item_id is not None:
            query = query.where(t.c.id == item_id)
        # the item the reviewer already holds first, then the oldest
        mine = (t.c.claimed_by == reviewer) & (t.c.claimed_until >= now)
        query = query.order_by(case((mine, 0), else_=1), t.c.created_at, t.c.id).limit(_TRIES)
        with self._tx(f"taking a review item of '{scenario}'", write=True) as conn:
            for row in conn.execute(query).all():
                took = conn.execute(
                    update(t)
                    .where(t.c.id == row.id, t.c.status == "open", free)
                    .values(claimed_by=reviewer, claimed_until=now + timedelta(seconds=lease_s))
                ).rowcount
                if took == 1:
                    got = conn.execute(select(t).where(t.c.id == row.id)).one()
                    return _item_of(got)
        return None

    def finish_review_item(
        self, scenario: str, item_id: str, reviewer: str, status: str, report_id: str | None
    ) -> bool:
        if status not in ("done", "skipped"):
            raise ValueError(f"an item finishes done or skipped, not {status!r}")
        t = tables.review_items
        with self._tx(f"finishing review item '{item_id}'", write=True) as conn:
            changed = conn.execute(
                update(t)
                .where(
                    t.c.scenario == scenario,
                    t.c.id == item_id,
                    t.c.status == "open",
                    t.c.claimed_by == reviewer,
                )
                .values(status=status, done_by=reviewer, done_at=utcnow(), report_id=report_id)
            ).rowcount
        return bool(changed == 1)

    def review_items(
        self, scenario: str, status: str | None, limit: int, *, newest: bool = False
    ) -> list[ReviewItem]:
        t = tables.review_items
        query = select(t).where(t.c.scenario == scenario)
        if status is not None:
            query = query.where(t.c.status == status)
        order = (t.c.created_at.desc(), t.c.id.desc()) if newest else (t.c.created_at, t.c.id)
        query = query.order_by(*order).limit(max(limit, 0))
        with self._tx(f"listing review items of '{scenario}'") as conn:
            return [_item_of(r) for r in conn.execute(query).all()]

    def review_items_by_id(self, scenario: str, ids: Sequence[str]) -> list[ReviewItem]:
        t = tables.review_items
        query = select(t).where(t.c.scenario == scenario, t.c.id.in_(list(ids)))
        with self._tx(f"reading review items of '{scenario}'") as conn:
            return [_item_of(r) for r in conn.execute(query).all()]

    def queue_progress(self, scenario: str) -> QueueProgress:
        t = tables.review_items
        now = utcnow()
        holding = (t.c.status == "open") & t.c.claimed_by.is_not(None) & (t.c.claimed_until >= now)
        held = func.sum(case((holding, 1), else_=0))
        query = (
            select(t.c.status, func.count(), held)
            .where(t.c.scenario == scenario)
            .group_by(t.c.status)
        )
        with self._tx(f"counting the review queue of '{scenario}'") as conn:
            rows = conn.execute(query).all()
        counts = {str(r[0]): int(r[1]) for r in rows}
        held_now = sum(int(r[2] or 0) for r in rows)
        return QueueProgress(
            open=counts.get("open", 0),
            held=held_now,
            done=counts.get("done", 0),
            skipped=counts.get("skipped", 0),
        )

    def recent_turns(self, scenario: str, limit: int) -> list[tuple[str, str]]:
        r = tables.records
        query = (
            select(r.c.id, r.c.release_id)
            .where(r.c.scenario == scenario)
            .order_by(r.c.created_at.desc(), r.c.id.desc())
            .limit(max(limit, 0))
        )
        with self._tx(f"reading the recent turns of '{scenario}'") as conn:
            return [(str(a), str(b)) for a, b in conn.execute(query).all()]


def _item_of(row: Row[Any]) -> ReviewItem:
    return ReviewItem(
        id=row.id,
        scenario=row.scenario,
        record_id=row.record_id,
        reason=row.reason,
        created_at=row.created_at,
        status=row.status,
        claimed_by=row.claimed_by,
        claimed_until=row.claimed_until,
        done_by=row.done_by,
        done_at=row.done_at,
        report_id=row.report_id,
    )
