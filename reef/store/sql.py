"""The SQL store: SQLite (embedded default, WAL) or Postgres (psycopg 3) behind one Store."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
from alembic import command
from alembic.config import Config
from sqlalchemy import (
    Connection,
    Engine,
    Row,
    case,
    create_engine,
    delete,
    event,
    exists,
    insert,
    select,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    IntegrityError,
    SQLAlchemyError,
    StatementError,
)

from reef.errors import (
    BadRequest,
    ConfigError,
    Conflict,
    IdempotencyKeyReused,
    NotFound,
    ReefError,
    StoreError,
)
from reef.records import Consumption, Record, Release, Report, Scenario, new_id, utcnow
from reef.store import tables
from reef.store.base import Store

MIGRATIONS = Path(__file__).parent / "migrations"

# Any constant shared by every Reef process: serializes `migrate()` across processes on one
# Postgres database (two API replicas starting at once).
_MIGRATION_LOCK = 0x5245_4546  # "REEF"

# Keeps IN (...) lists below SQLite's older 999-parameter limit.
_IN_CHUNK = 500


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def _normalize_url(database_url: str) -> URL:
    try:
        url = make_url(database_url)
    except ArgumentError:
        raise ConfigError(
            f"database_url {database_url!r} is not a URL: use sqlite:///path or "
            "postgresql+psycopg://user@host/db"
        ) from None
    # psycopg 3 is the only Postgres driver installed: plain postgresql:// means it too.
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    return url


def _sqlite_engine(url: URL, *, pool_size: int, max_overflow: int, busy_timeout_ms: int) -> Engine:
    if not url.database or url.database == ":memory:" or url.query.get("mode") == "memory":
        raise ConfigError("SQLite needs a file (sqlite:///path/reef.db): records must survive")
    path = Path(url.database).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    url = url.set(database=str(path))
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        connect_args={"check_same_thread": False, "timeout": busy_timeout_ms / 1000},
        json_serializer=_dumps,
        json_deserializer=orjson.loads,
    )

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control from the sqlite3 module (which begins lazily and never for
        # DDL), so `begin` below issues BEGIN itself: every transaction, DDL included, is real.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        _enable_wal(cursor, busy_timeout_ms)
        # FULL: the WAL is fsynced at every commit, so an acknowledged record survives power
        # loss, not only a crash of the process.
        cursor.execute("PRAGMA synchronous = FULL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        # Writers take the write lock up front (waiting up to busy_timeout): a deferred
        # transaction that reads, then writes, fails at once with "database is locked" when
        # another writer committed in between.
        immediate = conn.get_execution_options().get("reef_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def _enable_wal(cursor: Any, busy_timeout_ms: int) -> None:
    """Switch to WAL (persistent, so a no-op once done). On a fresh file the switch needs the
    database to itself, and SQLite answers "database is locked" at once, without its busy
    handler, while another connection holds it: several processes or threads opening a new
    state dir together retry here until the first switch has happened."""
    deadline = time.monotonic() + busy_timeout_ms / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _postgres_engine(
    url: URL, *, pool_size: int, max_overflow: int, connect_timeout_s: int
) -> Engine:
    try:
        return create_engine(
            url,
            pool_size=pool_size,
            max_overflow=max_overflow,
            # A replica restarted or a connection cut by a proxy: checked before use, not
            # failed on the request that happens to draw it.
            pool_pre_ping=True,
            connect_args={"connect_timeout": connect_timeout_s, "application_name": "reef"},
            json_serializer=_dumps,
            json_deserializer=orjson.loads,
        )
    except (ImportError, ArgumentError) as e:
        raise ConfigError(f"cannot use database_url driver {url.drivername!r}: {e}") from None


def open_store(
    database_url: str,
    *,
    pool_size: int = 5,
    max_overflow: int = 10,
    busy_timeout_ms: int = 30_000,
    connect_timeout_s: int = 10,
) -> SQLStore:
    """A store on `sqlite:///path` or `postgresql+psycopg://...`. Call `migrate()` before use.

    busy_timeout_ms: SQLite only, how long a writer waits for the write lock.
    connect_timeout_s: Postgres only, how long a new connection may take.
    """
    url = _normalize_url(database_url)
    backend = url.get_backend_name()
    if backend == "sqlite":
        engine = _sqlite_engine(
            url, pool_size=pool_size, max_overflow=max_overflow, busy_timeout_ms=busy_timeout_ms
        )
    elif backend == "postgresql":
        engine = _postgres_engine(
            url, pool_size=pool_size, max_overflow=max_overflow, connect_timeout_s=connect_timeout_s
        )
    else:
        raise ConfigError(
            f"unsupported database {backend!r} in database_url: use sqlite:///path "
            "or postgresql+psycopg://user@host/db"
        )
    return SQLStore(engine)


def _describe(e: SQLAlchemyError) -> str:
    # The driver's own message, without SQLAlchemy's echo of the statement and parameters
    # (which can be a whole batch of request bodies).
    orig = getattr(e, "orig", None) or e
    first = str(orig).strip().splitlines()[0] if str(orig).strip() else ""
    return f"{type(orig).__name__}: {first}"


class _RecordInsert:
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
            raise StoreError(f"database error while {what}: {_describe(e)}") from e
        except self.dbapi.Error as e:
            raise StoreError(f"database error while {what}: {type(e).__name__}: {e}") from e
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
                    else:
                        raw.rollback()
                    raise
            finally:
                cursor.close()
        except self.dbapi.IntegrityError as e:
            raise IntegrityError(self.sql, None, e) from e
        except self.dbapi.Error as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise StoreError(f"database error while {what}: {type(e).__name__}: {first}") from e
        finally:
            raw.close()  # back to the pool


class SQLStore(Store):
    """Store on a SQLAlchemy engine. Writes go through Core (no ORM objects on the hot path);
    records go through the DB-API directly (see _RecordInsert)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._sqlite = engine.dialect.name == "sqlite"
        self._insert_records = _RecordInsert(engine)

    def __repr__(self) -> str:
        return f"SQLStore({self.engine.url.render_as_string(hide_password=True)!r})"

    # plumbing -------------------------------------------------------------------
    @contextmanager
    def _tx(self, what: str, *, write: bool = False) -> Iterator[Connection]:
        """One transaction. Database failures become StoreError; IntegrityError is left to
        the caller, which knows what a clash means there."""
        try:
            with self.engine.connect() as conn:
                if write:
                    conn.execution_options(reef_write=True)
                with conn.begin():
                    yield conn
        except IntegrityError:
            raise
        except DBAPIError as e:
            raise StoreError(f"database error while {what}: {_describe(e)}") from e
        except StatementError as e:
            # Raised before the database saw anything: a value that cannot be bound (say, a
            # body that is not JSON-serializable). The data's fault, not the database's.
            raise BadRequest(f"cannot store {what}: {_describe(e)}") from e
        except SQLAlchemyError as e:
            raise StoreError(f"database error while {what}: {_describe(e)}") from e
        except orjson.JSONEncodeError as e:
            # psycopg serializes JSON itself, so on Postgres the same fault arrives unwrapped.
            raise BadRequest(f"cannot store {what}: {type(e).__name__}: {e}") from e

    def _require_scenario(self, conn: Connection, name: str) -> None:
        found = conn.execute(
            select(tables.scenarios.c.name).where(tables.scenarios.c.name == name)
        ).first()
        if found is None:
            raise NotFound(f"scenario '{name}' not found")

    # lifecycle ------------------------------------------------------------------
    def migrate(self) -> None:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        try:
            with self._tx("migrating the schema", write=True) as conn:
                if not self._sqlite:
                    # Two processes starting at once: the second waits here, then finds the
                    # schema at head. (On SQLite the write transaction's lock does the same.)
                    conn.execute(
                        text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK}
                    )
                config.attributes["connection"] = conn
                command.upgrade(config, "head")
        except ReefError:
            raise
        except Exception as e:
            # Alembic's own errors (an unknown revision in the database, say) and any
            # constraint a migration trips over.
            raise StoreError(f"migrating the schema failed: {type(e).__name__}: {e}") from e

    def ping(self) -> bool:
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
                conn.rollback()
        except Exception:
            return False
        return True

    def close(self) -> None:
        self.engine.dispose()

    # scenarios ------------------------------------------------------------------
    def _insert_scenario(self, name: str, description: str | None) -> Scenario:
        now = utcnow()
        release_id = new_id("rel")
        with self._tx(f"creating scenario '{name}'", write=True) as conn:
            # The head foreign key is deferred: both rows are checked together at commit.
            conn.execute(
                insert(tables.scenarios).values(
                    name=name, description=description, created_at=now, head_release_id=release_id
                )
            )
            conn.execute(
                insert(tables.releases).values(
                    id=release_id,
                    scenario=name,
                    seq=0,
                    parent_id=None,
                    kind="base",
                    created_at=now,
                    uri=None,
                    metadata={},
                )
            )
        return Scenario(
            name=name, created_at=now, head_release_id=release_id, description=description
        )

    def ensure_scenario(self, name: str) -> Scenario:
        try:
            return self.get_scenario(name)
        except NotFound:
            pass
        try:
            return self._insert_scenario(name, None)
        except IntegrityError:
            # Another thread or process created it between our read and our insert.
            return self.get_scenario(name)

    def create_scenario(self, name: str, description: str | None = None) -> Scenario:
        try:
            return self._insert_scenario(name, description)
        except IntegrityError:
            raise Conflict(f"scenario '{name}' already exists") from None

    def get_scenario(self, name: str) -> Scenario:
        with self._tx(f"reading scenario '{name}'") as conn:
            row = conn.execute(
                select(tables.scenarios).where(tables.scenarios.c.name == name)
            ).first()
        if row is None:
            raise NotFound(f"scenario '{name}' not found")
        return _scenario(row)

    def list_scenarios(self) -> list[Scenario]:
        with self._tx("listing scenarios") as conn:
            rows = conn.execute(select(tables.scenarios).order_by(tables.scenarios.c.name)).all()
        return [_scenario(r) for r in rows]

    def delete_scenario(self, name: str) -> None:
        try:
            with self._tx(f"deleting scenario '{name}'", write=True) as conn:
                self._require_scenario(conn, name)
                # Explicit rather than trusting ON DELETE CASCADE alone: the result must not
                # depend on a connection having foreign keys switched on.
                for table in (
                    tables.consumptions,
                    tables.records,
                    tables.reports,
                    tables.releases,
                ):
                    conn.execute(delete(table).where(table.c.scenario == name))
                conn.execute(delete(tables.scenarios).where(tables.scenarios.c.name == name))
        except IntegrityError as e:
            raise StoreError(f"deleting scenario '{name}' failed: {_describe(e)}") from e

    # records --------------------------------------------------------------------
    def add_records(self, records: Sequence[Record]) -> None:
        if not records:
            return
        rows = [_record_row(r) for r in records]
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
            for i in range(0, len(ids), _IN_CHUNK):
                chunk = ids[i : i + _IN_CHUNK]
                existing += conn.scalars(
                    select(tables.records.c.id).where(tables.records.c.id.in_(chunk))
                )
            if existing:
                return Conflict(f"record id '{min(existing)}' already exists")
            keyed = [(r.scenario, r.idempotency_key) for r in records if r.idempotency_key]
            if len(set(keyed)) < len(keyed):
                return IdempotencyKeyReused("an Idempotency-Key appears twice in one batch")
            t = tables.records
            for scenario, key in keyed:
                taken = conn.execute(
                    select(t.c.id).where(t.c.scenario == scenario, t.c.idempotency_key == key)
                ).first()
                if taken is not None:
                    return IdempotencyKeyReused(
                        f"Idempotency-Key '{key}' is already used by record '{taken.id}'"
                    )
        return StoreError(f"adding records failed: {_describe(e)}")

    def _one(self, table: Any, scenario: str, item_id: str, noun: str) -> Row[Any]:
        """The row of `table` with this id in this scenario; NotFound names which is missing."""
        with self._tx(f"reading {noun} '{item_id}'") as conn:
            row = conn.execute(
                select(table).where(table.c.scenario == scenario, table.c.id == item_id)
            ).first()
            if row is None:
                self._require_scenario(conn, scenario)
                raise NotFound(f"{noun} '{item_id}' not found in scenario '{scenario}'")
        return row

    def _page(
        self, table: Any, scenario: str, after: str | None, limit: int, noun: str
    ) -> list[Row[Any]]:
        """Rows of `table` in this scenario with id > `after`, oldest first."""
        query = select(table).where(table.c.scenario == scenario)
        if after is not None:
            query = query.where(table.c.id > after)
        query = query.order_by(table.c.id).limit(max(limit, 0))
        with self._tx(f"listing {noun}s of scenario '{scenario}'") as conn:
            rows = list(conn.execute(query).all())
            if not rows:
                self._require_scenario(conn, scenario)
        return rows

    def get_record(self, scenario: str, record_id: str) -> Record:
        return _record(self._one(tables.records, scenario, record_id, "record"))

    def list_records(
        self, scenario: str, after: str | None = None, limit: int = 100
    ) -> list[Record]:
        return [_record(r) for r in self._page(tables.records, scenario, after, limit, "record")]

    def existing_record_ids(self, scenario: str, ids: Iterable[str]) -> set[str]:
        t = tables.records
        wanted = list(dict.fromkeys(ids))
        found: set[str] = set()
        with self._tx(f"looking up records of scenario '{scenario}'") as conn:
            for i in range(0, len(wanted), _IN_CHUNK):
                chunk = wanted[i : i + _IN_CHUNK]
                found.update(
                    conn.scalars(select(t.c.id).where(t.c.scenario == scenario, t.c.id.in_(chunk)))
                )
            if not found:
                self._require_scenario(conn, scenario)
        return found

    def _first_record(self, query: Any, what: str) -> Record | None:
        with self._tx(what) as conn:
            row = conn.execute(query.limit(1)).first()
        return None if row is None else _record(row)

    def find_idempotent(self, scenario: str, key: str) -> Record | None:
        t = tables.records
        query = select(t).where(t.c.scenario == scenario, t.c.idempotency_key == key)
        return self._first_record(query, f"looking up an Idempotency-Key in '{scenario}'")

    def find_session_parent(self, scenario: str, state_hashes: Sequence[str]) -> Record | None:
        hashes = list(dict.fromkeys(state_hashes))[:_IN_CHUNK]
        if not hashes:
            return None
        t = tables.records
        # The caller lists the hashes longest conversation first: rank by that position.
        rank = case({h: i for i, h in enumerate(hashes)}, value=t.c.state_hash)
        query = (
            select(t)
            .where(t.c.scenario == scenario, t.c.state_hash.in_(hashes))
            .order_by(rank, t.c.created_at, t.c.id)
        )
        return self._first_record(query, f"looking up a session parent in '{scenario}'")

    def session_tail(self, scenario: str, session_id: str) -> Record | None:
        t = tables.records
        query = (
            select(t)
            .where(t.c.scenario == scenario, t.c.session_id == session_id)
            .order_by(t.c.turn.desc(), t.c.id.desc())
        )
        return self._first_record(query, f"reading session '{session_id}'")

    def has_children(self, scenario: str, record_id: str) -> bool:
        t = tables.records
        query = select(exists().where(t.c.parent_id == record_id, t.c.scenario == scenario))
        with self._tx(f"looking up children of record '{record_id}'") as conn:
            return bool(conn.execute(query).scalar())

    # consumption receipts -------------------------------------------------------
    def add_consumptions(self, consumptions: Sequence[Consumption]) -> None:
        if not consumptions:
            return
        rows = [
            {
                "scenario": c.scenario,
                "recipe": c.recipe,
                "record_id": c.record_id,
                "batch_id": c.batch_id,
                "created_at": c.created_at,
            }
            for c in consumptions
        ]
        # A receipt already stored stays as it is (the first batch that consumed it wins).
        dialect_insert = sqlite.insert if self._sqlite else postgresql.insert
        stmt = dialect_insert(tables.consumptions).on_conflict_do_nothing(
            index_elements=["scenario", "recipe", "record_id"]
        )
        what = f"adding {len(rows)} consumption receipts"
        try:
            with self._tx(what, write=True) as conn:
                for i in range(0, len(rows), _IN_CHUNK):
                    conn.execute(stmt, rows[i : i + _IN_CHUNK])
        except IntegrityError as e:
            for name in sorted({c.scenario for c in consumptions}):
                self.get_scenario(name)  # NotFound names the missing one
            raise StoreError(f"{what} failed: {_describe(e)}") from e

    def consumed_record_ids(self, scenario: str, recipe: str) -> set[str]:
        t = tables.consumptions
        query = select(t.c.record_id).where(t.c.scenario == scenario, t.c.recipe == recipe)
        with self._tx(f"reading consumption receipts of '{scenario}'") as conn:
            return set(conn.scalars(query))

    # reports --------------------------------------------------------------------
    def add_report(self, report: Report) -> tuple[Report, bool]:
        try:
            with self._tx(f"adding report '{report.id}'", write=True) as conn:
                conn.execute(insert(tables.reports).values(_report_row(report)))
            return report, True
        except IntegrityError as e:
            clash = e
        # Insert first, compare on a clash: race-safe (the database picks the one winner) and
        # cheapest for the usual case, a new report.
        t = tables.reports
        with self._tx(f"reading report '{report.id}'") as conn:
            row = conn.execute(select(t).where(t.c.id == report.id)).first()
            if row is None:
                self._require_scenario(conn, report.scenario)
                raise StoreError(f"adding report '{report.id}' failed: {_describe(clash)}")
        if row.scenario == report.scenario and row.content_hash == report.content_hash:
            return _report(row), False
        raise Conflict(f"report_id {report.id} already exists with different content")

    def get_report(self, scenario: str, report_id: str) -> Report:
        return _report(self._one(tables.reports, scenario, report_id, "report"))

    def list_reports(
        self, scenario: str, after: str | None = None, limit: int = 100
    ) -> list[Report]:
        return [_report(r) for r in self._page(tables.reports, scenario, after, limit, "report")]

    # releases -------------------------------------------------------------------
    def get_release(self, scenario: str, release_id: str) -> Release:
        t = tables.releases
        with self._tx(f"reading release '{release_id}'") as conn:
            row = conn.execute(
                select(t).where(t.c.scenario == scenario, t.c.id == release_id)
            ).first()
            if row is None:
                self._require_scenario(conn, scenario)
                raise NotFound(f"release '{release_id}' not found in scenario '{scenario}'")
        return _release(row)

    def list_releases(self, scenario: str) -> list[Release]:
        t = tables.releases
        with self._tx(f"listing releases of scenario '{scenario}'") as conn:
            rows = conn.execute(select(t).where(t.c.scenario == scenario).order_by(t.c.seq)).all()
            if not rows:
                self._require_scenario(conn, scenario)
        return [_release(r) for r in rows]


# rows <-> records -----------------------------------------------------------------
def _record_row(r: Record) -> dict[str, Any]:
    # Attribute by attribute: dataclasses.asdict deep-copies every body, which the hot path
    # cannot afford.
    return {
        "id": r.id,
        "scenario": r.scenario,
        "created_at": r.created_at,
        "route": r.route,
        "model": r.model,
        "stream": r.stream,
        "request": r.request,
        "response": r.response,
        "release_id": r.release_id,
        "prompt_token_ids": r.prompt_token_ids,
        "completion_token_ids": r.completion_token_ids,
        "logprobs": r.logprobs,
        "timings": r.timings,
        "tags": r.tags,
        "session_id": r.session_id,
        "turn": r.turn,
        "parent_id": r.parent_id,
        "state_hash": r.state_hash,
        "idempotency_key": r.idempotency_key,
    }


def _record(row: Row[Any]) -> Record:
    m = row._mapping
    return Record(
        id=m["id"],
        scenario=m["scenario"],
        created_at=m["created_at"],
        route=m["route"],
        model=m["model"],
        stream=bool(m["stream"]),
        request=m["request"],
        response=m["response"],
        release_id=m["release_id"],
        prompt_token_ids=m["prompt_token_ids"],
        completion_token_ids=m["completion_token_ids"],
        logprobs=m["logprobs"],
        timings=m["timings"],
        tags=m["tags"],
        session_id=m["session_id"],
        turn=m["turn"],
        parent_id=m["parent_id"],
        state_hash=m["state_hash"],
        idempotency_key=m["idempotency_key"],
    )


def _report_row(r: Report) -> dict[str, Any]:
    return {
        "id": r.id,
        "scenario": r.scenario,
        "created_at": r.created_at,
        "references": list(r.references),
        "score": r.score,
        "feedback": r.feedback,
        "metadata": r.metadata,
        "content_hash": r.content_hash,
    }


def _report(row: Row[Any]) -> Report:
    m = row._mapping
    return Report(
        id=m["id"],
        scenario=m["scenario"],
        created_at=m["created_at"],
        references=tuple(m["references"]),
        score=m["score"],
        feedback=m["feedback"],
        metadata=m["metadata"],
    )


def _scenario(row: Row[Any]) -> Scenario:
    m = row._mapping
    return Scenario(
        name=m["name"],
        created_at=m["created_at"],
        head_release_id=m["head_release_id"],
        description=m["description"],
    )


def _release(row: Row[Any]) -> Release:
    m = row._mapping
    return Release(
        id=m["id"],
        scenario=m["scenario"],
        seq=m["seq"],
        parent_id=m["parent_id"],
        kind=m["kind"],
        created_at=m["created_at"],
        uri=m["uri"],
        metadata=m["metadata"],
    )
