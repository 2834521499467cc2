"""One SQLAlchemy engine and its transactions: what every SQL store shares, and the schema's life."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import orjson
from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, Row, func, select, text
from sqlalchemy.exc import (
    DataError,
    DBAPIError,
    IntegrityError,
    SQLAlchemyError,
    StatementError,
)

from reef.errors import BadRequest, NotFound, ReefError, StoreError
from reef.store import tables
from reef.store.connect import describe_error

MIGRATIONS = Path(__file__).parent / "migrations"


class _MigrationsAtDebug(logging.Filter):
    """Alembic's INFO lines (its plugins, its dialect, then each migration's docstring: a
    dozen on a fresh database) are logged at DEBUG: migrating is routine, its error is what
    matters."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO:
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


for _name in ("alembic.runtime.migration", "alembic.runtime.plugins"):
    logging.getLogger(_name).addFilter(_MigrationsAtDebug())

# Any constant shared by every Reef process: serializes `migrate()` across processes on one
# Postgres database (two API replicas starting at once).
_MIGRATION_LOCK = 0x5245_4546  # "REEF"

# Keeps IN (...) lists below SQLite's older 999-parameter limit.
IN_CHUNK = 500


class Lifecycle(Protocol):
    """The database's own life: its schema, whether it answers, its connections."""

    def migrate(self) -> None:
        """Bring the schema to the newest Alembic revision (idempotent)."""
        ...

    def ping(self) -> bool:
        """True when the database answers a trivial query. No side effects."""
        ...

    def close(self) -> None: ...


class Database(Lifecycle):
    """A store's base on one SQLAlchemy engine: transactions that turn database failures into
    ReefErrors, the scenario check and the id lookups every table shares. Each noun's SQL store
    (reef.store.records, .reports, .chain, ...) derives from it; `SQLStore` is all of them."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._sqlite = engine.dialect.name == "sqlite"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.engine.url.render_as_string(hide_password=True)!r})"

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
        self,
        table: Any,
        scenario: str,
        after: str | None,
        limit: int,
        noun: str,
        columns: tuple[Any, ...] = (),
    ) -> list[Row[Any]]:
        """Rows of `table` (its `columns`, or all of them) in this scenario with id > `after`,
        oldest first."""
        query = select(*columns) if columns else select(table)
        query = query.where(table.c.scenario == scenario)
        if after is not None:
            query = query.where(table.c.id > after)
        query = query.order_by(table.c.id).limit(max(limit, 0))
        with self._tx(f"listing {noun}s of scenario '{scenario}'") as conn:
            rows = list(conn.execute(query).all())
            if not rows:
                self._require_scenario(conn, scenario)
        return rows

    def _clipped(self, column: Any, low: float, high: float) -> Any:
        """`column` clipped to [low, high] in SQL (SQLite's min/max, Postgres' least/greatest)."""
        if self._sqlite:
            return func.min(func.max(column, low), high)
        return func.least(func.greatest(column, low), high)

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
