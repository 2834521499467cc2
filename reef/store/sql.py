"""The SQL store: SQLite (embedded default, WAL) or Postgres (psycopg 3) behind one Store."""

from __future__ import annotations

from sqlalchemy import Engine

from reef.store.base import Store
from reef.store.chain import SQLChain
from reef.store.connect import create_sql_engine
from reef.store.database import MIGRATIONS
from reef.store.engines import SQLEngines
from reef.store.events import SQLEvents
from reef.store.jobs import SQLJobs
from reef.store.quotas import SQLQuotas
from reef.store.records import SQLRecords
from reef.store.reports import SQLReports
from reef.store.review import SQLReview
from reef.store.scenarios import SQLScenarios
from reef.store.sessions import SQLSessions
from reef.store.shadows import SQLShadows

__all__ = ["MIGRATIONS", "SQLStore", "open_store"]


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


class SQLStore(
    SQLScenarios,
    SQLRecords,
    SQLSessions,
    SQLReports,
    SQLChain,
    SQLJobs,
    SQLShadows,
    SQLEngines,
    SQLEvents,
    SQLReview,
    Store,
):
    """Every noun's SQL store on one SQLAlchemy engine (one pool, one set of transactions).
    Writes go through Core (no ORM objects on the hot path); records go through the DB-API
    directly (see reef.store.rows.RecordInsert)."""

    def __init__(self, engine: Engine):
        super().__init__(engine)
        self._quotas = SQLQuotas(engine)

    @property
    def quotas(self) -> SQLQuotas:
        """Request and token counters per token and scenario (reef.store.quotas)."""
        return self._quotas

    def close(self) -> None:
        self._quotas.close()
        super().close()

    def __repr__(self) -> str:
        return f"SQLStore({self.engine.url.render_as_string(hide_password=True)!r})"
