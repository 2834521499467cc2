"""Database engines for the SQL store: URL checks, SQLite pragmas and WAL, Postgres pooling."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from reef.errors import ConfigError


def dumps_json(value: Any) -> str:
    return orjson.dumps(value).decode()


# Postgres text holds no NUL character, so JSONB (and JSON's text operators) refuse `\u0000`.
# A value whose JSON has one is stored as an envelope, {"$reef.nul": "<its JSON text>"}: inside
# a JSON string the escape is plain characters. Reading turns an envelope back into the value,
# so what a client sent round-trips. A value that is itself a one-key object under that key is
# put in an envelope too, so reading never mistakes one for the other. Top level only: nested
# values are inside the envelope's text.
NUL_ENVELOPE = "$reef.nul"


def dumps_postgres_json(value: Any) -> str:
    text = orjson.dumps(value)
    if b"\\u0000" in text or (type(value) is dict and len(value) == 1 and NUL_ENVELOPE in value):
        text = orjson.dumps({NUL_ENVELOPE: text.decode()})
    return text.decode()


def loads_postgres_json(data: str | bytes) -> Any:
    value = orjson.loads(data)
    if type(value) is dict and len(value) == 1:
        inner = value.get(NUL_ENVELOPE)
        if isinstance(inner, str):
            return orjson.loads(inner)
    return value


def normalize_url(database_url: str) -> URL:
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


def sqlite_engine(url: URL, *, pool_size: int, max_overflow: int, busy_timeout_ms: int) -> Engine:
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
        json_serializer=dumps_json,
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


# How long data sent to Postgres may go unacknowledged before the connection counts as broken.
TCP_USER_TIMEOUT_MS = 15_000


def postgres_engine(
    url: URL, *, pool_size: int, max_overflow: int, connect_timeout_s: int
) -> Engine:
    try:
        engine = create_engine(
            url,
            pool_size=pool_size,
            max_overflow=max_overflow,
            # A replica restarted or a connection cut by a proxy: checked before use, not
            # failed on the request that happens to draw it.
            pool_pre_ping=True,
            connect_args={
                "connect_timeout": connect_timeout_s,
                "application_name": "reef",
                # A database cut off by the network (packets dropped, nothing answered) fails
                # a connection's next write within tcp_user_timeout, and an idle one waiting
                # for an answer within the keepalives' minute, instead of the kernel's ~15
                # minutes of retransmissions: calls get their 503 and the pool a new connection.
                "tcp_user_timeout": TCP_USER_TIMEOUT_MS,
                "keepalives": 1,
                "keepalives_idle": 30,
                "keepalives_interval": 10,
                "keepalives_count": 3,
            },
            json_serializer=dumps_postgres_json,
            json_deserializer=loads_postgres_json,
        )
        from reef.store import pgconn
    except (ImportError, ArgumentError) as e:
        raise ConfigError(f"cannot use database_url driver {url.drivername!r}: {e}") from None

    @event.listens_for(engine, "do_connect")
    def _connect(_dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        # A server that is frozen (its kernel still acknowledging) is bounded by none of the
        # above: connections whose waits end at the serving path's deadline instead
        # (reef.store.deadline; work without one waits as before).
        return pgconn.connect(*cargs, **cparams)

    return engine


def create_sql_engine(
    database_url: str,
    *,
    pool_size: int,
    max_overflow: int,
    busy_timeout_ms: int,
    connect_timeout_s: int,
) -> Engine:
    """A SQLAlchemy engine for `sqlite:///path` or `postgresql+psycopg://...`, set up for Reef."""
    url = normalize_url(database_url)
    backend = url.get_backend_name()
    if backend == "sqlite":
        engine = sqlite_engine(
            url, pool_size=pool_size, max_overflow=max_overflow, busy_timeout_ms=busy_timeout_ms
        )
    elif backend == "postgresql":
        engine = postgres_engine(
            url, pool_size=pool_size, max_overflow=max_overflow, connect_timeout_s=connect_timeout_s
        )
    else:
        raise ConfigError(
            f"unsupported database {backend!r} in database_url: use sqlite:///path "
            "or postgresql+psycopg://user@host/db"
        )
    return engine


def describe_error(e: Exception) -> str:
    # The driver's own message (a SQLAlchemy error's `orig`, or a DB-API error itself), first
    # line only: without SQLAlchemy's echo of the statement and parameters (which can be a
    # whole batch of request bodies).
    orig = getattr(e, "orig", None) or e
    first = str(orig).strip().splitlines()[0] if str(orig).strip() else ""
    return f"{type(orig).__name__}: {first}"
