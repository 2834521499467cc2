"""Records in the store: the group commit's batches, reads by id, sessions and Idempotency-Keys."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from sqlalchemy import Engine, delete, select
from sqlalchemy.exc import IntegrityError

from reef.errors import Conflict, IdempotencyKeyReused, NotFound, SessionTurnTaken, StoreError
from reef.records import Record
from reef.store import tables
from reef.store.connect import describe_error
from reef.store.database import IN_CHUNK, Database
from reef.store.rows import RECORD_COLUMNS, RecordInsert, record_of, record_row, records_of


class RecordStore(Protocol):
    """Records: written in batches, read by id or page, stitched into sessions, looked up by
    Idempotency-Key, deleted by retention."""

    def add_records(self, records: Sequence[Record]) -> None:
        """Insert all in one transaction (the group commit's unit). A record whose
        Idempotency-Key (scenario, route) or session turn (scenario, session, turn) another
        record holds is refused: IdempotencyKeyReused, SessionTurnTaken; nothing is written."""
        ...

    def get_record(self, scenario: str, record_id: str) -> Record: ...

    def list_records(
        self, scenario: str, after: str | None = None, limit: int = 100
    ) -> list[Record]:
        """Records with id > `after`, oldest first."""
        ...

    def existing_record_ids(self, scenario: str, ids: Iterable[str]) -> set[str]:
        """Which of `ids` are records of `scenario`."""
        ...

    def get_records(self, scenario: str, ids: Iterable[str]) -> list[Record]:
        """The records of `scenario` among `ids`, in id order; ids that are not records of the
        scenario are left out. Looked up by id (in batches), never by scanning the scenario."""
        ...

    def quoted_records(self, scenario: str) -> list[Record]:
        """Every record of `scenario` that some report of it quotes, in id order: one query,
        the join done by the database (the report_references key), records no report quotes
        never read. What experience is collected from."""
        ...

    def delete_records(
        self, scenario: str, ids: Sequence[str], known_reports: Mapping[str, Iterable[str]]
    ) -> set[str]:
        """Delete these records in one short transaction, except any that a report not in
        `known_reports[record_id]` now quotes (feedback that arrived after the caller decided
        the record was not needed). Returns the ids deleted. Releases and consumption receipts
        are not touched."""
        ...

    # idempotency ---------------------------------------------------------------------------
    def find_idempotent(self, scenario: str, route: str, key: str) -> Record | None:
        """The record stored under this Idempotency-Key for this route in the scenario, if any
        (a key is unique per scenario and route)."""
        ...

    def idempotent_ids(self, scenario: str, route: str, keys: Sequence[str]) -> dict[str, str]:
        """For each of `keys` that a record of `scenario` and `route` holds as its
        Idempotency-Key, that record's id (bulk imports skip what they added before)."""
        ...


class SQLRecords(Database, RecordStore):
    """RecordStore on SQLite or Postgres. Records are inserted through the DB-API directly
    (see RecordInsert); everything else goes through SQLAlchemy Core."""

    def __init__(self, engine: Engine):
        super().__init__(engine)
        self._insert_records = RecordInsert(engine)

    def add_records(self, records: Sequence[Record]) -> None:
        if not records:
            return
        rows = [record_row(r) for r in records]
        what = (
            f"adding record '{records[0].id}'" if len(rows) == 1 else f"adding {len(rows)} records"
        )
        try:
            # executemany: one statement, one transaction, one fsync for the whole batch.
            self._insert_records(rows, what)
        except IntegrityError as e:
            raise self._explain_record_clash(records, e) from e

    def _explain_record_clash(self, records: Sequence[Record], e: IntegrityError) -> Exception:
        """Which rule the batch broke, named (the batch itself was rolled back)."""
        ids = [r.id for r in records]
        seen: set[str] = set()
        for record_id in ids:
            if record_id in seen:
                return Conflict(f"record id '{record_id}' appears twice in one batch")
            seen.add(record_id)
        scenario_names = sorted({r.scenario for r in records})
        with self._tx("checking a failed insert") as conn:
            known = set(
                conn.scalars(
                    select(tables.scenarios.c.name).where(
                        tables.scenarios.c.name.in_(scenario_names)
                    )
                )
            )
            missing = [s for s in scenario_names if s not in known]
            if missing:
                return NotFound(f"scenario '{missing[0]}' not found")
            existing: list[str] = []
            for i in range(0, len(ids), IN_CHUNK):
                chunk = ids[i : i + IN_CHUNK]
                existing += conn.scalars(
                    select(tables.records.c.id).where(tables.records.c.id.in_(chunk))
                )
            if existing:
                return Conflict(f"record id '{min(existing)}' already exists")
            t = tables.records
            keyed = [(r.scenario, r.route, r.idempotency_key) for r in records if r.idempotency_key]
            key_columns = (t.c.scenario, t.c.route, t.c.idempotency_key)
            clash = _taken(conn, key_columns, keyed)
            if clash is not None:
                (_, _, key), taken = clash
                return IdempotencyKeyReused(
                    f"Idempotency-Key '{key}' is already used by record '{taken}'"
                    if taken
                    else "an Idempotency-Key appears twice in one batch"
                )
            turns = [(r.scenario, r.session_id, r.turn) for r in records if r.session_id]
            clash = _taken(conn, (t.c.scenario, t.c.session_id, t.c.turn), turns)
            if clash is not None:
                (_, session_id, turn), taken = clash
                return SessionTurnTaken(
                    f"turn {turn} of session '{session_id}' is already record '{taken}'"
                    if taken
                    else "a session's turn appears twice in one batch"
                )
        return StoreError(f"adding records failed: {describe_error(e)}")

    def get_record(self, scenario: str, record_id: str) -> Record:
        return record_of(self._one(tables.records, scenario, record_id, "record"))

    def list_records(
        self, scenario: str, after: str | None = None, limit: int = 100
    ) -> list[Record]:
        return [record_of(r) for r in self._page(tables.records, scenario, after, limit, "record")]

    def existing_record_ids(self, scenario: str, ids: Iterable[str]) -> set[str]:
        t = tables.records
        wanted = list(dict.fromkeys(ids))
        found: set[str] = set()
        with self._tx(f"looking up records of scenario '{scenario}'") as conn:
            for i in range(0, len(wanted), IN_CHUNK):
                chunk = wanted[i : i + IN_CHUNK]
                found.update(
                    conn.scalars(select(t.c.id).where(t.c.scenario == scenario, t.c.id.in_(chunk)))
                )
            if not found:
                self._require_scenario(conn, scenario)
        return found

    def get_records(self, scenario: str, ids: Iterable[str]) -> list[Record]:
        t = tables.records
        wanted = list(dict.fromkeys(ids))
        out: list[Record] = []
        with self._tx(f"reading records of scenario '{scenario}'") as conn:
            for i in range(0, len(wanted), IN_CHUNK):
                chunk = wanted[i : i + IN_CHUNK]
                query = select(*RECORD_COLUMNS).where(t.c.scenario == scenario, t.c.id.in_(chunk))
                out += records_of(conn.execute(query).all())
        out.sort(key=lambda r: r.id)
        return out

    def quoted_records(self, scenario: str) -> list[Record]:
        t, x = tables.records, tables.report_references
        quoted = select(x.c.record_id).where(x.c.scenario == scenario)
        query = (
            select(*RECORD_COLUMNS)
            .where(t.c.scenario == scenario, t.c.id.in_(quoted))
            .order_by(t.c.id)
        )
        with self._tx(f"reading the reported records of scenario '{scenario}'") as conn:
            return records_of(conn.execute(query).all())

    def delete_records(
        self, scenario: str, ids: Sequence[str], known_reports: Mapping[str, Iterable[str]]
    ) -> set[str]:
        r, x = tables.records, tables.report_references
        known = {rid: set(reps) for rid, reps in known_reports.items()}
        deleted: set[str] = set()
        with self._tx(f"deleting archived records of '{scenario}'", write=True) as conn:
            for i in range(0, len(ids), IN_CHUNK):
                chunk = list(ids[i : i + IN_CHUNK])
                quoted = conn.execute(
                    select(x.c.record_id, x.c.report_id).where(
                        x.c.scenario == scenario, x.c.record_id.in_(chunk)
                    )
                )
                fresh = {rid for rid, rep in quoted if rep not in known.get(rid, ())}
                doomed = [rid for rid in chunk if rid not in fresh]
                if doomed:
                    conn.execute(delete(r).where(r.c.scenario == scenario, r.c.id.in_(doomed)))
                    deleted.update(doomed)
        return deleted

    # idempotency ---------------------------------------------------------------------------
    def _first_record(self, query: Any, what: str) -> Record | None:
        with self._tx(what) as conn:
            row = conn.execute(query.limit(1)).first()
        return None if row is None else record_of(row)

    def find_idempotent(self, scenario: str, route: str, key: str) -> Record | None:
        t = tables.records
        query = select(t).where(
            t.c.scenario == scenario, t.c.route == route, t.c.idempotency_key == key
        )
        return self._first_record(query, f"looking up an Idempotency-Key in '{scenario}'")

    def idempotent_ids(self, scenario: str, route: str, keys: Sequence[str]) -> dict[str, str]:
        t = tables.records
        out: dict[str, str] = {}
        with self._tx(f"looking up Idempotency-Keys in '{scenario}'") as conn:
            for i in range(0, len(keys), IN_CHUNK):
                query = select(t.c.idempotency_key, t.c.id).where(
                    t.c.scenario == scenario,
                    t.c.route == route,
                    t.c.idempotency_key.in_(list(keys[i : i + IN_CHUNK])),
                )
                out.update({key: rid for key, rid in conn.execute(query)})
        return out


def _taken(conn: Any, columns: Sequence[Any], values: list[tuple[Any, ...]]) -> Any:
    """The first of `values` (one tuple per record of a refused batch, over `columns`, a
    unique index) that the batch repeats, as (value, None), or that a stored record holds, as
    (value, that record's id); None when neither."""
    if len(set(values)) < len(values):
        return next(v for i, v in enumerate(values) if v in values[:i]), None
    for value in values:
        where = [column == v for column, v in zip(columns, value, strict=True)]
        taken = conn.execute(select(tables.records.c.id).where(*where)).first()
        if taken is not None:
            return value, taken.id
    return None
