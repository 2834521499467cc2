"""Rows ⇄ records: the store's conversions, the hot path's record insert, the id a time maps to."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import Engine, Row
from sqlalchemy.exc import DBAPIError, IntegrityError

from reef.errors import BadRequest, StoreError
from reef.records import Candidate, Job, Record, Release, Report, Scenario
from reef.store import tables
from reef.store.connect import describe_error


class RecordInsert:
    """Inserts a batch of records through the DB-API connection directly (one executemany,
    one transaction).

    Why: on the group commit's critical path SQLAlchemy's execution machinery (pool events,
    the BEGIN event, the execution context) cost ~200 us per commit on the project machine,
    as much as SQLite's WAL fsync itself (measured: 435 us vs 235 us p50 per one-record
    commit). Values are converted by the columns' own SQLAlchemy bind processors, so what is
    written is exactly what a Core insert writes and what the reads expect. Errors use the
    DB-API's standard exception classes, the same on sqlite3 and psycopg.
    """

    def __init__(self, engine: Engine):
        self.engine = engine
        self.dbapi = engine.dialect.loaded_dbapi
        self.sqlite = engine.dialect.name == "sqlite"
        columns = list(tables.records.columns)
        self.names = [c.name for c in columns]
        self.processors: list[Callable[[Any], Any] | None] = [
            c.type.bind_processor(engine.dialect) for c in columns
        ]
        mark = "?" if engine.dialect.paramstyle == "qmark" else "%s"
        marks = ", ".join(mark for _ in columns)
        self.sql = f"INSERT INTO records ({', '.join(self.names)}) VALUES ({marks})"

    def __call__(self, rows: list[dict[str, Any]], what: str) -> None:
        try:
            params = [
                tuple(
                    proc(row[name]) if proc else row[name]
                    for name, proc in zip(self.names, self.processors, strict=True)
                )
                for row in rows
            ]
        except (TypeError, ValueError, orjson.JSONEncodeError) as e:
            raise BadRequest(f"cannot store {what}: {type(e).__name__}: {e}") from e
        try:
            raw = self.engine.raw_connection()  # pooled: pragmas set, pre-pinged on Postgres
        except DBAPIError as e:
            raise StoreError(f"database error while {what}: {describe_error(e)}") from e
        except self.dbapi.Error as e:
            raise StoreError(f"database error while {what}: {describe_error(e)}") from e
        try:
            cursor = raw.cursor()
            try:
                if self.sqlite:  # autocommit mode (see _pragmas): take the write lock up front
                    cursor.execute("BEGIN IMMEDIATE")
                try:
                    cursor.executemany(self.sql, params)
                    if self.sqlite:
                        cursor.execute("COMMIT")
                    else:
                        raw.commit()
                except BaseException:
                    if self.sqlite:
                        cursor.execute("ROLLBACK")
                    elif not _closed(raw):
                        raw.rollback()
                    raise
            finally:
                cursor.close()
        except self.dbapi.IntegrityError as e:
            raise IntegrityError(self.sql, None, e) from e
        except self.dbapi.DataError as e:  # a value the database cannot hold (NUL in text)
            raise BadRequest(f"invalid value while {what}: {describe_error(e)}") from e
        except self.dbapi.Error as e:
            raise StoreError(f"database error while {what}: {describe_error(e)}") from e
        finally:
            if _closed(raw):
                # Lost, or closed at the serving path's deadline (reef.store.pgconn): the
                # pool drops it, rather than failing to roll it back on the way in.
                raw.invalidate()
            else:
                raw.close()  # back to the pool


def _closed(raw: Any) -> bool:
    """Whether a pooled DB-API connection is gone (psycopg's `closed`; sqlite3 has none)."""
    return getattr(raw.dbapi_connection, "closed", False) is True


# A record's fields are the records table's columns, one for one.
RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(Record))


def record_row(r: Record) -> dict[str, Any]:
    # Field by field: dataclasses.asdict deep-copies every body, which the hot path cannot afford.
    return {name: getattr(r, name) for name in RECORD_FIELDS}


def record_of(row: Row[Any]) -> Record:
    m = row._mapping
    values = {name: m[name] for name in RECORD_FIELDS}
    values["stream"] = bool(values["stream"])  # SQLite hands back 0/1
    return Record(**values)


# The records table's columns in the Record's field order: a query that selects these builds
# its Records positionally (records_of), 2-3x faster than by name on bulk reads.
RECORD_COLUMNS = tuple(tables.records.c[name] for name in RECORD_FIELDS)
_STREAM = RECORD_FIELDS.index("stream")


def records_of(rows: Iterable[Row[Any]]) -> list[Record]:
    """Records from rows of a `select(*RECORD_COLUMNS)` query."""
    out = []
    for row in rows:
        values = list(row)
        values[_STREAM] = bool(values[_STREAM])  # SQLite hands back 0/1
        out.append(Record(*values))
    return out


def report_row(r: Report) -> dict[str, Any]:
    return {
        "id": r.id,
        "scenario": r.scenario,
        "created_at": r.created_at,
        "references": list(r.references),
        "score": r.score,
        "feedback": r.feedback,
        "metrics": r.metrics,
        "metadata": r.metadata,
        "content_hash": r.content_hash,
    }


def report_of(row: Row[Any]) -> Report:
    m = row._mapping
    return Report(
        id=m["id"],
        scenario=m["scenario"],
        created_at=m["created_at"],
        references=tuple(m["references"]),
        score=m["score"],
        feedback=m["feedback"],
        metadata=m["metadata"],
        metrics=m["metrics"] or {},
    )


# The reports table's columns in the Report's field order, for bulk reads (reports_of).
REPORT_COLUMNS = tuple(tables.reports.c[f.name] for f in dataclasses.fields(Report))
_REFERENCES = REPORT_COLUMNS.index(tables.reports.c.references)
_METRICS = REPORT_COLUMNS.index(tables.reports.c.metrics)


def reports_of(rows: Iterable[Row[Any]]) -> list[Report]:
    """Reports from rows of a `select(*REPORT_COLUMNS)` query, built positionally (bulk reads:
    experience reads every report of a scenario)."""
    out = []
    for row in rows:
        values = list(row)
        values[_REFERENCES] = tuple(values[_REFERENCES])
        values[_METRICS] = values[_METRICS] or {}
        out.append(Report(*values))
    return out


def scenario_of(row: Row[Any]) -> Scenario:
    m = row._mapping
    return Scenario(
        name=m["name"],
        created_at=m["created_at"],
        head_release_id=m["head_release_id"],
        description=m["description"],
    )


# A release's and a candidate's fields are their tables' columns, one for one.
RELEASE_FIELDS = tuple(f.name for f in dataclasses.fields(Release))
CANDIDATE_FIELDS = tuple(f.name for f in dataclasses.fields(Candidate))
JOB_FIELDS = tuple(f.name for f in dataclasses.fields(Job))


def release_row(r: Release) -> dict[str, Any]:
    return {name: getattr(r, name) for name in RELEASE_FIELDS}


def release_of(row: Row[Any]) -> Release:
    m = row._mapping
    return Release(**{name: m[name] for name in RELEASE_FIELDS})


def candidate_row(c: Candidate) -> dict[str, Any]:
    return {name: getattr(c, name) for name in CANDIDATE_FIELDS}


def candidate_of(row: Row[Any]) -> Candidate:
    m = row._mapping
    return Candidate(**{name: m[name] for name in CANDIDATE_FIELDS})


def job_row(j: Job) -> dict[str, Any]:
    return {name: getattr(j, name) for name in JOB_FIELDS}


def job_of(row: Row[Any]) -> Job:
    m = row._mapping
    return Job(**{name: m[name] for name in JOB_FIELDS})


# time -> ids ------------------------------------------------------------------------------
_CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"


def id_at(prefix: str, when: datetime) -> str:
    """The smallest id `reef.records.new_id(prefix)` can give at `when`: ids sort by creation
    time, so a time range is an id range on the primary-key index."""
    n = max(0, int(when.timestamp() * 1000)) << 80
    chars = []
    for _ in range(26):
        n, r = divmod(n, 32)
        chars.append(_CROCKFORD[r])
    return f"{prefix}_{''.join(reversed(chars))}"
