"""The release chain in the store: releases appended by compare-and-swap on the head, and the
candidates that may become them (their status moves by compare-and-swap too)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

from sqlalchemy import Connection, insert, select, update
from sqlalchemy.exc import IntegrityError

from reef.errors import BadRequest, Conflict, HeadMoved, NotFound, ReefError, StoreError
from reef.records import (
    CANDIDATE_STATUSES,
    RELEASE_OPERATIONS,
    Candidate,
    Consumption,
    Release,
    utcnow,
)
from reef.store import tables
from reef.store.connect import describe_error
from reef.store.database import Database
from reef.store.events import Delivery, insert_deliveries
from reef.store.reports import insert_consumptions
from reef.store.rows import candidate_of, candidate_row, release_of, release_row


class ChainStore(Protocol):
    """A scenario's append-only chain of releases and its candidates."""

    def get_release(self, scenario: str, release_id: str) -> Release: ...

    def list_releases(self, scenario: str) -> list[Release]:
        """The chain, oldest (seq 0) first."""
        ...

    def head_release(self, scenario: str) -> Release:
        """The release the scenario serves now."""
        ...

    def publish_release(
        self,
        release: Release,
        events: Sequence[Delivery] = (),
        consumptions: Sequence[Consumption] = (),
    ) -> Release:
        """Append `release` to its scenario's chain and make it the head, if and only if the
        head is still `release.parent_id` (compare-and-swap, atomic across processes).
        `events` (reef.events) and `consumptions` (the receipts of the batch the release was
        trained on) are stored in the same transaction: they exist if and only if the head
        moved.

        Returns the stored release: its `seq` is the parent's + 1 and its `created_at` the
        time of publishing, whatever the argument said. HeadMoved (nothing written) when the
        head is another release; NotFound for an unknown scenario; BadRequest without a
        parent or with an unknown `operation`; Conflict when the release id is taken.
        """
        ...

    # candidates ---------------------------------------------------------------------------
    def add_candidate(self, candidate: Candidate, events: Sequence[Delivery] = ()) -> Candidate:
        """Store a new candidate, and `events` in the same transaction; Conflict if its id
        exists, NotFound if its scenario or its parent release (in that scenario) does not."""
        ...

    def get_candidate(self, scenario: str, candidate_id: str) -> Candidate: ...

    def list_candidates(self, scenario: str, status: str | None = None) -> list[Candidate]:
        """The scenario's candidates (only those in `status`, if given), newest first."""
        ...

    def set_candidate_status(
        self,
        scenario: str,
        candidate_id: str,
        status: str,
        *,
        expected: str | None = None,
        message: str | None = None,
        model_uri: str | None = None,
        gate: dict[str, Any] | None = None,
        events: Sequence[Delivery] = (),
    ) -> Candidate:
        """Move a candidate to `status` and stamp `updated_at`; `message`, `model_uri` and
        `gate` replace the stored values when given (None leaves them); `events` are stored
        in the same transaction, so only when the move happens.

        With `expected`, a compare-and-swap: Conflict (code "candidate_status") unless the
        stored status is `expected`, so two workers cannot both act on one candidate.
        """
        ...


class SQLChain(Database, ChainStore):
    """ChainStore on SQLite or Postgres."""

    def get_release(self, scenario: str, release_id: str) -> Release:
        return release_of(self._one(tables.releases, scenario, release_id, "release"))

    def list_releases(self, scenario: str) -> list[Release]:
        t = tables.releases
        with self._tx(f"listing releases of scenario '{scenario}'") as conn:
            rows = conn.execute(select(t).where(t.c.scenario == scenario).order_by(t.c.seq)).all()
            if not rows:
                self._require_scenario(conn, scenario)
        return [release_of(r) for r in rows]

    def head_release(self, scenario: str) -> Release:
        s, t = tables.scenarios, tables.releases
        query = select(t).join(s, s.c.head_release_id == t.c.id).where(s.c.name == scenario)
        with self._tx(f"reading the head release of scenario '{scenario}'") as conn:
            row = conn.execute(query).first()
        if row is None:
            raise NotFound(f"scenario '{scenario}' not found")
        return release_of(row)

    def publish_release(
        self,
        release: Release,
        events: Sequence[Delivery] = (),
        consumptions: Sequence[Consumption] = (),
    ) -> Release:
        name, parent = release.scenario, release.parent_id
        if parent is None:
            raise BadRequest(
                f"release '{release.id}' has no parent_id: only a scenario's base release "
                "starts a chain",
                param="parent_id",
            )
        if release.operation not in RELEASE_OPERATIONS - {"creation"}:
            raise BadRequest(
                f"cannot publish a release with operation {release.operation!r}: use one of "
                f"{sorted(RELEASE_OPERATIONS - {'creation'})} ('creation' is the base release's)",
                param="operation",
            )
        s, t = tables.scenarios, tables.releases
        try:
            with self._tx(f"publishing release '{release.id}' to '{name}'", write=True) as conn:
                # The swap goes first. On Postgres the UPDATE row-locks the scenario, so a
                # concurrent publisher waits on it and, once this commits, re-reads the row
                # and matches nothing; on SQLite the write transaction holds the database
                # lock from BEGIN IMMEDIATE, so publishers run one after another.
                moved = conn.execute(
                    update(s)
                    .where(s.c.name == name, s.c.head_release_id == parent)
                    .values(head_release_id=release.id)
                ).rowcount
                if moved != 1:
                    raise self._head_moved(conn, name, parent)
                parent_seq = conn.execute(select(t.c.seq).where(t.c.id == parent)).scalar_one()
                # The store numbers and stamps the release: seq follows the chain, and
                # created_at is when it joined it, so both orders agree.
                stored = dataclasses.replace(release, seq=parent_seq + 1, created_at=utcnow())
                conn.execute(insert(t).values(release_row(stored)))
                insert_deliveries(conn, events)
                insert_consumptions(conn, consumptions)
        except IntegrityError as e:
            # Rolled back: the release id is taken, or another writer took seq + 1 (which
            # the swap above should make impossible, but the unique constraint is the proof).
            with self._tx(f"checking a failed publish of '{release.id}'") as conn:
                taken = conn.execute(select(t.c.scenario).where(t.c.id == release.id)).first()
                if taken is not None:
                    raise Conflict(
                        f"release id '{release.id}' already exists in scenario '{taken.scenario}'"
                    ) from e
                raise self._head_moved(conn, name, parent) from e
        return stored

    def _head_moved(self, conn: Connection, scenario: str, parent: str) -> ReefError:
        s = tables.scenarios
        head = conn.execute(select(s.c.head_release_id).where(s.c.name == scenario)).scalar()
        if head is None:
            return NotFound(f"scenario '{scenario}' not found")
        return HeadMoved(
            f"the head of scenario '{scenario}' is release '{head}', not '{parent}': "
            "another release was published first"
        )

    # candidates ---------------------------------------------------------------------------
    def add_candidate(self, candidate: Candidate, events: Sequence[Delivery] = ()) -> Candidate:
        _check_status(candidate.status)
        c, t = tables.candidates, tables.releases
        name = candidate.scenario
        try:
            with self._tx(f"adding candidate '{candidate.id}'", write=True) as conn:
                self._require_scenario(conn, name)
                parent = conn.execute(
                    select(t.c.id).where(t.c.id == candidate.parent_id, t.c.scenario == name)
                ).first()
                if parent is None:
                    raise NotFound(
                        f"release '{candidate.parent_id}' not found in scenario '{name}'",
                        param="parent_id",
                    )
                # The id is the release id it would publish as: one already on a chain could
                # never be published.
                if conn.execute(select(t.c.id).where(t.c.id == candidate.id)).first():
                    raise Conflict(f"candidate id '{candidate.id}' is already a release's id")
                conn.execute(insert(c).values(candidate_row(candidate)))
                insert_deliveries(conn, events)
                row = conn.execute(select(c).where(c.c.id == candidate.id)).one()
        except IntegrityError as e:
            with self._tx(f"checking a failed insert of candidate '{candidate.id}'") as conn:
                if conn.execute(select(c.c.id).where(c.c.id == candidate.id)).first():
                    raise Conflict(f"candidate '{candidate.id}' already exists") from e
                self._require_scenario(conn, name)
            raise StoreError(
                f"adding candidate '{candidate.id}' failed: {describe_error(e)}"
            ) from e
        return candidate_of(row)

    def get_candidate(self, scenario: str, candidate_id: str) -> Candidate:
        return candidate_of(self._one(tables.candidates, scenario, candidate_id, "candidate"))

    def list_candidates(self, scenario: str, status: str | None = None) -> list[Candidate]:
        c = tables.candidates
        query = select(c).where(c.c.scenario == scenario)
        if status is not None:
            _check_status(status)
            query = query.where(c.c.status == status)
        query = query.order_by(c.c.created_at.desc(), c.c.id.desc())
        with self._tx(f"listing candidates of scenario '{scenario}'") as conn:
            rows = conn.execute(query).all()
            if not rows:
                self._require_scenario(conn, scenario)
        return [candidate_of(r) for r in rows]

    def set_candidate_status(
        self,
        scenario: str,
        candidate_id: str,
        status: str,
        *,
        expected: str | None = None,
        message: str | None = None,
        model_uri: str | None = None,
        gate: dict[str, Any] | None = None,
        events: Sequence[Delivery] = (),
    ) -> Candidate:
        _check_status(status)
        if expected is not None:
            _check_status(expected)
        c = tables.candidates
        values: dict[str, Any] = {"status": status, "updated_at": utcnow()}
        if message is not None:
            values["message"] = message
        if model_uri is not None:
            values["model_uri"] = model_uri
        if gate is not None:
            values["gate"] = gate
        stmt = update(c).where(c.c.scenario == scenario, c.c.id == candidate_id)
        if expected is not None:
            # The compare-and-swap: the status check and the write are one statement.
            stmt = stmt.where(c.c.status == expected)
        what = f"setting the status of candidate '{candidate_id}'"
        with self._tx(what, write=True) as conn:
            changed = conn.execute(stmt.values(values)).rowcount
            row = conn.execute(
                select(c).where(c.c.scenario == scenario, c.c.id == candidate_id)
            ).first()
            if row is None:
                self._require_scenario(conn, scenario)
                raise NotFound(f"candidate '{candidate_id}' not found in scenario '{scenario}'")
            if changed != 1:
                raise Conflict(
                    f"candidate '{candidate_id}' is '{row.status}', not '{expected}': "
                    f"not moved to '{status}'",
                    code="candidate_status",
                )
            insert_deliveries(conn, events)
        return candidate_of(row)


def _check_status(status: str) -> None:
    if status not in CANDIDATE_STATUSES:
        raise BadRequest(
            f"unknown candidate status {status!r}: use one of {sorted(CANDIDATE_STATUSES)}",
            param="status",
        )
