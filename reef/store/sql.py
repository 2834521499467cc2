"""The SQL store: SQLite (embedded default, WAL) or Postgres (psycopg 3) behind one Store."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
from alembic import command
from alembic.config import Config
from sqlalchemy import (
    Connection,
    Engine,
    Float,
    Row,
    String,
    case,
    delete,
    exists,
    func,
    insert,
    literal,
    literal_column,
    select,
    text,
    true,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import (
    DataError,
    DBAPIError,
    IntegrityError,
    SQLAlchemyError,
    StatementError,
)

from reef.errors import (
    BadRequest,
    Conflict,
    HeadMoved,
    IdempotencyKeyReused,
    NotFound,
    ReefError,
    SessionTurnTaken,
    StoreError,
)
from reef.records import (
    CANDIDATE_STATUSES,
    JOB_STATUSES,
    RELEASE_OPERATIONS,
    Candidate,
    Consumption,
    Deletion,
    Job,
    Record,
    Release,
    Report,
    Scenario,
    ShadowRecord,
    new_id,
    utcnow,
)
from reef.store import tables
from reef.store.base import Store
from reef.store.connect import create_sql_engine, describe_error
from reef.store.quotas import SQLQuotas
from reef.store.rows import (
    RecordInsert,
    candidate_of,
    candidate_row,
    job_of,
    job_row,
    record_of,
    record_row,
    release_of,
    release_row,
    report_of,
    report_row,
    scenario_of,
)

MIGRATIONS = Path(__file__).parent / "migrations"

# Any constant shared by every Reef process: serializes `migrate()` across processes on one
# Postgres database (two API replicas starting at once).
_MIGRATION_LOCK = 0x5245_4546  # "REEF"

# Keeps IN (...) lists below SQLite's older 999-parameter limit.
_IN_CHUNK = 500


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
    return SQLStore(
        create_sql_engine(
            database_url,
            pool_size=pool_size,
            max_overflow=max_overflow,
            busy_timeout_ms=busy_timeout_ms,
            connect_timeout_s=connect_timeout_s,
        )
    )


class SQLStore(Store):
    """Store on a SQLAlchemy engine. Writes go through Core (no ORM objects on the hot path);
    records go through the DB-API directly (see RecordInsert)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._sqlite = engine.dialect.name == "sqlite"
        self._insert_records = RecordInsert(engine)
        self._quotas = SQLQuotas(engine)

    @property
    def quotas(self) -> SQLQuotas:
        return self._quotas

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
        except DataError as e:
            # A value the database cannot hold (Postgres text refuses NUL characters): the
            # data's fault, not the database's.
            raise BadRequest(f"invalid value while {what}: {describe_error(e)}") from e
        except DBAPIError as e:
            raise StoreError(f"database error while {what}: {describe_error(e)}") from e
        except StatementError as e:
            # Raised before the database saw anything: a value that cannot be bound (say, a
            # body that is not JSON-serializable). The data's fault, not the database's.
            raise BadRequest(f"cannot store {what}: {describe_error(e)}") from e
        except SQLAlchemyError as e:
            raise StoreError(f"database error while {what}: {describe_error(e)}") from e
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
        self._quotas.close()
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
            base = Release(
                id=release_id,
                scenario=name,
                seq=0,
                parent_id=None,
                kind="base",
                created_at=now,
                operation="creation",
            )
            conn.execute(insert(tables.releases).values(release_row(base)))
            # Checked after the insert: on Postgres a deletion committing meanwhile is then
            # seen (the insert waited for its row lock); on SQLite writers take turns anyway.
            self._refuse_deleted_name(conn, name)
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
        return scenario_of(row)

    def list_scenarios(self) -> list[Scenario]:
        with self._tx("listing scenarios") as conn:
            rows = conn.execute(select(tables.scenarios).order_by(tables.scenarios.c.name)).all()
        return [scenario_of(r) for r in rows]

    def delete_scenario(self, name: str) -> None:
        try:
            with self._tx(f"deleting scenario '{name}'", write=True) as conn:
                self._require_scenario(conn, name)
                # Explicit rather than trusting ON DELETE CASCADE alone: the result must not
                # depend on a connection having foreign keys switched on. Candidates go before
                # releases: a candidate's parent is a release.
                for table in (
                    tables.consumptions,
                    tables.records,
                    tables.reports,
                    tables.report_references,
                    tables.shadow_records,
                    tables.candidates,
                    tables.jobs,
                    tables.releases,
                ):
                    conn.execute(delete(table).where(table.c.scenario == name))
                conn.execute(delete(tables.scenarios).where(tables.scenarios.c.name == name))
                # The tombstone commits with the deletion: the files and MLflow entries it
                # names are removed afterwards (reef.deletion), and a crash in between leaves
                # it here for `reef gc`.
                d = tables.scenario_deletions
                conn.execute(delete(d).where(d.c.name == name))
                conn.execute(insert(d).values(name=name, deleted_at=utcnow()))
        except IntegrityError as e:
            raise StoreError(f"deleting scenario '{name}' failed: {describe_error(e)}") from e

    def _refuse_deleted_name(self, conn: Connection, name: str) -> None:
        d = tables.scenario_deletions
        if conn.execute(select(d.c.name).where(d.c.name == name)).first() is not None:
            raise Conflict(
                f"scenario '{name}' was deleted and its files are still being removed: "
                "run `reef gc`, then use the name again",
                code="scenario_deleting",
            )

    def pending_deletions(self) -> list[Deletion]:
        d = tables.scenario_deletions
        with self._tx("listing pending scenario deletions") as conn:
            rows = conn.execute(select(d).order_by(d.c.deleted_at, d.c.name)).all()
        return [Deletion(scenario=r.name, deleted_at=r.deleted_at) for r in rows]

    def finish_deletion(self, name: str) -> None:
        d = tables.scenario_deletions
        with self._tx(f"finishing the deletion of scenario '{name}'", write=True) as conn:
            conn.execute(delete(d).where(d.c.name == name))

    # engines (deploy fan-out) ---------------------------------------------------
    def register_engine(self, url: str, *, started: bool = False) -> None:
        t = tables.engines
        now = utcnow()
        values = {"heartbeat_at": now, **({"started_at": now} if started else {})}
        with self._tx(f"registering engine {url}", write=True) as conn:
            if conn.execute(update(t).where(t.c.url == url).values(**values)).rowcount == 0:
                conn.execute(insert(t).values(url=url, started_at=now, heartbeat_at=now))

    def live_engines(self, max_age_s: float) -> list[str]:
        t = tables.engines
        since = utcnow() - timedelta(seconds=max_age_s)
        with self._tx("listing registered engines") as conn:
            rows = conn.execute(select(t.c.url).where(t.c.heartbeat_at >= since).order_by(t.c.url))
            return [r.url for r in rows]

    def unregister_engine(self, url: str) -> None:
        t = tables.engines
        with self._tx(f"unregistering engine {url}", write=True) as conn:
            conn.execute(delete(t).where(t.c.url == url))

    # records --------------------------------------------------------------------
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
            for i in range(0, len(ids), _IN_CHUNK):
                chunk = ids[i : i + _IN_CHUNK]
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
            for i in range(0, len(wanted), _IN_CHUNK):
                chunk = wanted[i : i + _IN_CHUNK]
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
            for i in range(0, len(wanted), _IN_CHUNK):
                chunk = wanted[i : i + _IN_CHUNK]
                query = select(t).where(t.c.scenario == scenario, t.c.id.in_(chunk))
                out += [record_of(r) for r in conn.execute(query)]
        out.sort(key=lambda r: r.id)
        return out

    def count_awaiting_feedback(self, scenario: str, recipe: str) -> int:
        r, p, c = tables.records, tables.reports, tables.consumptions
        # The receipts the scenario's reports quote, expanded from their JSON lists in the
        # database: a scan of the reports (few), never of the records (many).
        if self._sqlite:
            refs = func.json_each(p.c.references).table_valued("value")
            quoted: Any = refs.c.value
        else:
            refs = func.jsonb_array_elements_text(p.c.references).table_valued("value")
            quoted = refs.c.value.collate("C")  # ids compare bytewise (see tables.Key)
        query = (
            select(func.count())
            .select_from(r)
            .where(
                r.c.scenario == scenario,
                r.c.id.not_in(
                    select(quoted).select_from(p).join(refs, true()).where(p.c.scenario == scenario)
                ),
                # NOT IN (not NOT EXISTS): one hashed set of the recipe's receipts whatever the
                # planner believes of the table's size (measured: a nested anti-join on stale
                # Postgres statistics took 350 ms at 100k records, the hashed set 20 ms)
                r.c.id.not_in(
                    select(c.c.record_id).where(c.c.scenario == scenario, c.c.recipe == recipe)
                ),
            )
        )
        with self._tx(f"counting records awaiting feedback in '{scenario}'") as conn:
            return int(conn.execute(query).scalar_one())

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

    def find_session_parent(self, scenario: str, state_hashes: Sequence[str]) -> Record | None:
        hashes = list(dict.fromkeys(state_hashes))[:_IN_CHUNK]
        if not hashes:
            return None
        t = tables.records
        child = t.alias("child")
        # The caller lists the hashes longest conversation first: rank by that position.
        rank = case({h: i for i, h in enumerate(hashes)}, value=t.c.state_hash)
        # Equal states (many users asked the same and got the same answer): the newest one not
        # continued yet is the conversation a client goes on with; the oldest would make every
        # later one a fork of it, and leave their answers without a next turn.
        continued = case(
            (exists().where(child.c.parent_id == t.c.id, child.c.scenario == t.c.scenario), 1),
            else_=0,
        )
        query = (
            select(t)
            .where(t.c.scenario == scenario, t.c.state_hash.in_(hashes))
            .order_by(rank, continued, t.c.created_at.desc(), t.c.id.desc())
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

    def session_records(self, scenario: str, session_id: str, limit: int = 1000) -> list[Record]:
        t = tables.records
        tail = (
            select(t.c.id)
            .where(t.c.scenario == scenario, t.c.session_id == session_id)
            .order_by(t.c.turn.desc(), t.c.id.desc())
            .limit(1)
            .scalar_subquery()
        )
        # From the tail up its parent links, one indexed lookup per turn, in one statement.
        chain = (
            select(t.c.id, t.c.parent_id, literal_column("1").label("depth"))
            .where(t.c.scenario == scenario, t.c.id == tail)
            .cte("chain", recursive=True)
        )
        chain = chain.union_all(
            select(t.c.id, t.c.parent_id, chain.c.depth + 1)
            .join(chain, t.c.id == chain.c.parent_id)
            .where(t.c.scenario == scenario, chain.c.depth < limit)
        )
        query = select(t).join(chain, t.c.id == chain.c.id).order_by(chain.c.depth.desc())
        with self._tx(f"reading session '{session_id}'") as conn:
            return [record_of(row) for row in conn.execute(query)]

    def has_children(self, scenario: str, record_id: str) -> bool:
        t = tables.records
        query = select(exists().where(t.c.parent_id == record_id, t.c.scenario == scenario))
        with self._tx(f"looking up children of record '{record_id}'") as conn:
            return bool(conn.execute(query).scalar())

    # retention -----------------------------------------------------------------
    def quoting_reports(self, scenario: str, record_ids: Iterable[str]) -> dict[str, set[str]]:
        x = tables.report_references
        wanted = list(dict.fromkeys(record_ids))
        out: dict[str, set[str]] = {}
        with self._tx(f"reading the reports quoting records of '{scenario}'") as conn:
            for i in range(0, len(wanted), _IN_CHUNK):
                query = select(x.c.record_id, x.c.report_id).where(
                    x.c.scenario == scenario, x.c.record_id.in_(wanted[i : i + _IN_CHUNK])
                )
                for record_id, report_id in conn.execute(query):
                    out.setdefault(record_id, set()).add(report_id)
        return out

    def delete_records(
        self, scenario: str, ids: Sequence[str], known_reports: Mapping[str, Iterable[str]]
    ) -> set[str]:
        r, x = tables.records, tables.report_references
        known = {rid: set(reps) for rid, reps in known_reports.items()}
        deleted: set[str] = set()
        with self._tx(f"deleting archived records of '{scenario}'", write=True) as conn:
            for i in range(0, len(ids), _IN_CHUNK):
                chunk = list(ids[i : i + _IN_CHUNK])
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

    def delete_reports(self, scenario: str, reports: Sequence[Report]) -> int:
        p, x = tables.reports, tables.report_references
        with self._tx(f"deleting archived reports of '{scenario}'", write=True) as conn:
            for i in range(0, len(reports), _IN_CHUNK):
                chunk = reports[i : i + _IN_CHUNK]
                ids = [rep.id for rep in chunk]
                refs = sorted({rid for rep in chunk for rid in rep.references})
                conn.execute(delete(p).where(p.c.scenario == scenario, p.c.id.in_(ids)))
                # by (scenario, record_id), the reference table's key, then the report ids
                for j in range(0, len(refs), _IN_CHUNK):
                    conn.execute(
                        delete(x).where(
                            x.c.scenario == scenario,
                            x.c.record_id.in_(refs[j : j + _IN_CHUNK]),
                            x.c.report_id.in_(ids),
                        )
                    )
        return len(reports)

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
            raise StoreError(f"{what} failed: {describe_error(e)}") from e

    def consumed_record_ids(self, scenario: str, recipe: str) -> set[str]:
        t = tables.consumptions
        query = select(t.c.record_id).where(t.c.scenario == scenario, t.c.recipe == recipe)
        with self._tx(f"reading consumption receipts of '{scenario}'") as conn:
            return set(conn.scalars(query))

    # reports --------------------------------------------------------------------
    def add_report(self, report: Report) -> tuple[Report, bool]:
        try:
            with self._tx(f"adding report '{report.id}'", write=True) as conn:
                conn.execute(insert(tables.reports).values(report_row(report)))
                self._insert_references(conn, report)
            return report, True
        except IntegrityError as e:
            clash = e
        # Insert first, compare on a clash: race-safe (the database picks the one winner) and
        # cheapest for the usual case, a new report.
        t = tables.reports
        with self._tx(f"reading report '{report.id}'") as conn:
            row = conn.execute(
                select(t).where(t.c.scenario == report.scenario, t.c.id == report.id)
            ).first()
            if row is None:
                self._require_scenario(conn, report.scenario)
                raise StoreError(f"adding report '{report.id}' failed: {describe_error(clash)}")
        if row.content_hash == report.content_hash:
            return report_of(row), False
        raise Conflict(f"report_id {report.id} already exists with different content")

    def _insert_references(self, conn: Connection, report: Report) -> None:
        """The report's receipts as report_references rows, with the release that served each
        record: one INSERT ... SELECT over the records' primary key."""
        r, x = tables.records, tables.report_references
        refs = list(dict.fromkeys(report.references))
        for i in range(0, len(refs), _IN_CHUNK):
            quoted = select(
                r.c.scenario,
                r.c.id,
                literal(report.id, String).label("report_id"),
                r.c.release_id,
                literal(report.score, Float).label("score"),
            ).where(r.c.scenario == report.scenario, r.c.id.in_(refs[i : i + _IN_CHUNK]))
            conn.execute(
                insert(x).from_select(
                    ["scenario", "record_id", "report_id", "release_id", "score"], quoted
                )
            )

    def get_report(self, scenario: str, report_id: str) -> Report:
        return report_of(self._one(tables.reports, scenario, report_id, "report"))

    def list_reports(
        self, scenario: str, after: str | None = None, limit: int = 100
    ) -> list[Report]:
        return [report_of(r) for r in self._page(tables.reports, scenario, after, limit, "report")]

    # releases -------------------------------------------------------------------
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

    def publish_release(self, release: Release) -> Release:
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

    # candidates -----------------------------------------------------------------
    def add_candidate(self, candidate: Candidate) -> Candidate:
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
        return candidate_of(row)

    # jobs -----------------------------------------------------------------------
    def add_job(self, job: Job) -> Job:
        _check_job_status(job.status)
        with self._tx(f"adding job '{job.id}'", write=True) as conn:
            self._require_scenario(conn, job.scenario)
            conn.execute(insert(tables.jobs).values(job_row(job)))
        return job

    def get_job(self, scenario: str, job_id: str) -> Job:
        return job_of(self._one(tables.jobs, scenario, job_id, "job"))

    def update_job(
        self,
        scenario: str,
        job_id: str,
        *,
        status: str | None = None,
        step: dict[str, Any] | None = None,
        candidate_id: str | None = None,
        result: dict[str, Any] | None = None,
        message: str | None = None,
    ) -> Job:
        if status is not None:
            _check_job_status(status)
        j = tables.jobs
        with self._tx(f"updating job '{job_id}'", write=True) as conn:
            row = conn.execute(
                select(j).where(j.c.scenario == scenario, j.c.id == job_id).with_for_update()
            ).first()
            if row is None:
                self._require_scenario(conn, scenario)
                raise NotFound(f"job '{job_id}' not found in scenario '{scenario}'")
            now = utcnow()
            values: dict[str, Any] = {"updated_at": now}
            if status is not None:
                values["status"] = status
            if step is not None:
                values["steps"] = [*row.steps, {"at": now.isoformat(), **step}]
            if candidate_id is not None:
                values["candidate_id"] = candidate_id
            if result is not None:
                values["result"] = result
            if message is not None:
                values["message"] = message
            conn.execute(update(j).where(j.c.id == job_id).values(values))
            row = conn.execute(select(j).where(j.c.id == job_id)).one()
        return job_of(row)

    # shadow records -------------------------------------------------------------------------
    def add_shadow_records(self, shadows: Sequence[ShadowRecord]) -> None:
        if not shadows:
            return
        names = [f.name for f in dataclasses.fields(ShadowRecord)]
        rows = [{name: getattr(s, name) for name in names} for s in shadows]
        try:
            with self._tx(f"storing {len(rows)} shadow records", write=True) as conn:
                conn.execute(insert(tables.shadow_records), rows)
        except IntegrityError as e:
            raise StoreError(f"storing shadow records: {describe_error(e)}") from e

    def list_shadow_records(
        self,
        scenario: str,
        release_id: str | None = None,
        after: str | None = None,
        limit: int = 100,
    ) -> list[ShadowRecord]:
        t = tables.shadow_records
        query = select(t).where(t.c.scenario == scenario)
        if release_id is not None:
            query = query.where(t.c.release_id == release_id)
        if after is not None:
            query = query.where(t.c.id > after)
        query = query.order_by(t.c.id).limit(max(limit, 0))
        with self._tx(f"listing shadow records of scenario '{scenario}'") as conn:
            rows = conn.execute(query).all()
            if not rows:
                self._require_scenario(conn, scenario)
        return [ShadowRecord(**dict(r._mapping)) for r in rows]

    def shadow_sums(
        self, scenario: str, release_id: str, low: float, high: float
    ) -> tuple[int, float, float]:
        t = tables.shadow_records
        sqlite = self.engine.dialect.name == "sqlite"

        def clipped(column: Any) -> Any:
            if sqlite:
                return func.min(func.max(column, low), high)
            return func.least(func.greatest(column, low), high)

        shadow, control = clipped(t.c.score), clipped(t.c.control_score)
        query = select(
            func.count(),
            func.coalesce(func.sum(shadow), 0.0),
            func.coalesce(func.sum(control), 0.0),
        ).where(
            t.c.scenario == scenario,
            t.c.release_id == release_id,
            t.c.score.is_not(None),
            t.c.control_score.is_not(None),
        )
        with self._tx(f"summing shadow scores of '{release_id}'") as conn:
            n, shadow_total, control_total = conn.execute(query).one()
        return int(n), float(shadow_total), float(control_total)


def _check_job_status(status: str) -> None:
    if status not in JOB_STATUSES:
        raise BadRequest(
            f"unknown job status {status!r}: use one of {sorted(JOB_STATUSES)}", param="status"
        )


def _check_status(status: str) -> None:
    if status not in CANDIDATE_STATUSES:
        raise BadRequest(
            f"unknown candidate status {status!r}: use one of {sorted(CANDIDATE_STATUSES)}",
            param="status",
        )


# rows <-> records -----------------------------------------------------------------


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
