"""Quota counters in the database (table `quota_counters`): requests and tokens per key in
fixed windows, shared by every replica.

A key names what is limited (a token, or a token in one scenario) and its window's length;
each row is one key in one window (`window_start`, epoch seconds). Admitting a call is one
statement over all its counters: an upsert that adds a request to each row whose counts are
still under their limits and returns the rows it changed. A row missing from what it returns
was at a limit: the transaction rolls back (no counter moves) and the caller is refused until
that window ends. Tokens are added after the answer, in the window current then. Rows of
windows that ended more than a day ago are pruned on the way.

Counters need not survive a power loss (a lost minute of counts errs towards admitting), so
their commits do not wait for the disk: on SQLite two connections of their own on the store's
file with `synchronous = OFF` (the store's stay FULL), driven through the DB-API (a counter
update is ~12 us there, SQLAlchemy's Core and pool would add ~0.5 ms); one answers at once
without waiting for the file's lock (`admit_now`: a call on the event loop), the other waits
for it (`admit`: in a worker thread). On Postgres each transaction sets `synchronous_commit`
off for itself, and every call waits (the network round trip is a wait).
"""

from __future__ import annotations

import functools
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from sqlalchemy import (
    BigInteger,
    Column,
    Engine,
    String,
    Table,
    and_,
    case,
    delete,
    or_,
    select,
    true,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import SQLModel

from reef.errors import StoreError

MINUTE = 60
DAY = 86_400
_PRUNE_EVERY = 512  # spends between two prunes, per process

# On the metadata the migrations are checked against (tests/store/test_database.py).
quota_counters: Table = Table(
    "quota_counters",
    SQLModel.metadata,
    Column("key", String(300), primary_key=True),
    Column("window_start", BigInteger, primary_key=True),
    Column("requests", BigInteger, nullable=False),
    Column("tokens", BigInteger, nullable=False),
    extend_existing=True,
)


T = TypeVar("T")


@dataclass(frozen=True)
class Counter:
    """One limited thing in one kind of window: `key` names it (the window's length is part
    of it), `max_requests` / `max_tokens` are its limits (None: not limited on that count)."""

    key: str
    window_s: int
    max_requests: int | None = None
    max_tokens: int | None = None

    def window(self, now: float) -> int:
        return int(now // self.window_s) * self.window_s


@dataclass(frozen=True)
class Refusal:
    """Why a call was refused: the counter at its limit, which count, and how long until its
    window ends (whole seconds, at least 1)."""

    counter: Counter
    count: Literal["requests", "tokens"]
    retry_after_s: int


@dataclass(frozen=True)
class Usage:
    key: str
    window_start: int
    requests: int
    tokens: int


@dataclass(frozen=True)
class Delta:
    """Requests and tokens to add to one counter's row (`key` in the window at
    `window_start`)."""

    key: str
    window_start: int
    requests: int
    tokens: int


WAIT = "wait"  # admit_now / spend_now: the answer needs a wait (a lock, the network)
_UNLIMITED = 2**62


class Quotas(Protocol):
    """Counters every replica shares."""

    def admit(self, counters: Sequence[Counter], now: float | None = None) -> Refusal | None:
        """Count one request on every counter, or on none when one is at a limit (then that
        one's Refusal)."""
        ...

    def admit_now(
        self, counters: Sequence[Counter], now: float | None = None
    ) -> Refusal | str | None:
        """`admit` without waiting for anything, or WAIT when it would have to."""
        ...

    def spend(self, counters: Sequence[Counter], tokens: int, now: float | None = None) -> None:
        """Add `tokens` to every counter's current window."""
        ...

    def spend_now(
        self, counters: Sequence[Counter], tokens: int, now: float | None = None
    ) -> str | None:
        """`spend` without waiting for anything, or WAIT (nothing counted) when it would."""
        ...

    def usage(self, keys: Sequence[str], now: float | None = None) -> list[Usage]:
        """The current window's counts of these keys (keys end in their window's length)."""
        ...

    def add(self, deltas: Sequence[Delta]) -> list[Usage]:
        """Add each delta to its row, unconditionally (a row missing starts at 0), and return
        those rows as they are after it: what every replica counted so far."""
        ...


def counter_key(subject: str, window_s: int) -> str:
    """The key of `subject` (say "token/app") in windows of `window_s` seconds."""
    return f"{subject}/{window_s}s"


def _window_of(key: str) -> int:
    return int(key.rsplit("/", 1)[-1].removesuffix("s"))


def _retry_after(counter: Counter, now: float) -> int:
    return max(1, math.ceil(counter.window(now) + counter.window_s - now))


def _refusal(counter: Counter, requests: int | None, now: float) -> Refusal:
    """At which of its limits `counter` is, given its row's request count (None: no row)."""
    at_requests = (
        counter.max_requests is not None
        and requests is not None
        and requests >= counter.max_requests
    )
    return Refusal(counter, "requests" if at_requests else "tokens", _retry_after(counter, now))


@functools.cache
def _admit_sql(n: int) -> str:
    values = ", ".join(["(?, ?, 1, 0)"] * n)
    whens = " ".join(["WHEN ? THEN requests < ? AND tokens < ?"] * n)
    return (
        f"INSERT INTO quota_counters (key, window_start, requests, tokens) VALUES {values} "
        "ON CONFLICT (key, window_start) DO UPDATE SET requests = requests + 1 "
        f"WHERE CASE quota_counters.key {whens} ELSE 1 END RETURNING key"
    )


@functools.cache
def _add_sql(n: int) -> str:
    values = ", ".join(["(?, ?, ?, ?)"] * n)
    return (
        f"INSERT INTO quota_counters (key, window_start, requests, tokens) VALUES {values} "
        "ON CONFLICT (key, window_start) DO UPDATE SET requests = requests + excluded.requests, "
        "tokens = tokens + excluded.tokens RETURNING key, window_start, requests, tokens"
    )


@functools.cache
def _spend_sql(n: int) -> str:
    values = ", ".join(["(?, ?, 0, ?)"] * n)
    return (
        f"INSERT INTO quota_counters (key, window_start, requests, tokens) VALUES {values} "
        "ON CONFLICT (key, window_start) DO UPDATE SET tokens = tokens + excluded.tokens"
    )


class _SQLiteCounters:
    """One connection of the counters' own on the store's SQLite file, used under a lock;
    `busy_ms` 0: a locked file answers WAIT at once."""

    def __init__(self, path: str, busy_ms: int):
        self.lock = threading.Lock()
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute(f"PRAGMA busy_timeout = {busy_ms}")
        self.conn.execute("PRAGMA synchronous = OFF")

    def admit(self, ordered: Sequence[Counter], now: float) -> Refusal | None:
        args: list[Any] = []
        for c in ordered:
            args += [c.key, c.window(now)]
        for c in ordered:
            args += [c.key, c.max_requests or _UNLIMITED, c.max_tokens or _UNLIMITED]
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            admitted = {row[0] for row in self.conn.execute(_admit_sql(len(ordered)), args)}
            refused = [c for c in ordered if c.key not in admitted]
            if not refused:
                self.conn.execute("COMMIT")
                return None
            self.conn.execute("ROLLBACK")  # nothing counted: the call is refused
        except BaseException:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise
        c = refused[0]
        row = self.conn.execute(
            "SELECT requests FROM quota_counters WHERE key = ? AND window_start = ?",
            (c.key, c.window(now)),
        ).fetchone()
        return _refusal(c, None if row is None else int(row[0]), now)

    def spend(self, ordered: Sequence[Counter], tokens: int, now: float, prune: bool) -> None:
        args: list[Any] = []
        for c in ordered:
            args += [c.key, c.window(now), tokens]
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            self.conn.execute(_spend_sql(len(ordered)), args)
            if prune:
                self.conn.execute(
                    "DELETE FROM quota_counters WHERE window_start < ?", (int(now) - 2 * DAY,)
                )
            self.conn.execute("COMMIT")
        except BaseException:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise

    def add(self, deltas: Sequence[Delta], prune_before: int | None) -> list[Usage]:
        args: list[Any] = []
        for d in deltas:
            args += [d.key, d.window_start, d.requests, d.tokens]
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            rows = self.conn.execute(_add_sql(len(deltas)), args).fetchall()
            if prune_before is not None:
                self.conn.execute(
                    "DELETE FROM quota_counters WHERE window_start < ?", (prune_before,)
                )
            self.conn.execute("COMMIT")
        except BaseException:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise
        return [Usage(r[0], int(r[1]), int(r[2]), int(r[3])) for r in rows]

    def close(self) -> None:
        with self.lock:
            self.conn.close()


def _busy(e: sqlite3.OperationalError) -> bool:
    return "locked" in str(e) or "busy" in str(e)


class SQLQuotas:
    """Quotas on a SQL store's database (SQLite or Postgres)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._sqlite_path = engine.url.database if engine.dialect.name == "sqlite" else None
        self._now: _SQLiteCounters | None = None
        self._waiting: _SQLiteCounters | None = None
        self._open_lock = threading.Lock()
        self._spends = 0

    def _sqlite(self) -> tuple[_SQLiteCounters, _SQLiteCounters]:
        if self._now is None or self._waiting is None:
            assert self._sqlite_path is not None
            with self._open_lock:  # opened on first use: a store without quotas opens nothing
                if self._now is None or self._waiting is None:
                    self._waiting = _SQLiteCounters(self._sqlite_path, 30_000)
                    self._now = _SQLiteCounters(self._sqlite_path, 0)
        return self._now, self._waiting

    def close(self) -> None:
        for counters in (self._now, self._waiting):
            if counters is not None:
                counters.close()

    def _prune_due(self) -> bool:
        self._spends += 1
        return self._spends % _PRUNE_EVERY == 1

    # SQLite --------------------------------------------------------------------------
    def admit_now(
        self, counters: Sequence[Counter], now: float | None = None
    ) -> Refusal | str | None:
        if not counters:
            return None
        ordered = sorted(counters, key=lambda c: c.key)
        at = time.time() if now is None else now
        return self._at_once("counting a request", lambda c: c.admit(ordered, at))

    def spend_now(
        self, counters: Sequence[Counter], tokens: int, now: float | None = None
    ) -> str | None:
        if not counters or tokens <= 0:
            return None
        ordered = sorted(counters, key=lambda c: c.key)
        at = time.time() if now is None else now
        return self._at_once(
            "counting tokens", lambda c: c.spend(ordered, tokens, at, self._prune_due())
        )

    def _at_once(self, what: str, call: Callable[[_SQLiteCounters], T]) -> T | str:
        """`call` on the connection that never waits: WAIT when the counters are not on
        SQLite, or its lock (ours, or the database file's) is taken now."""
        if self._sqlite_path is None:
            return WAIT
        at_once, _ = self._sqlite()
        if not at_once.lock.acquire(blocking=False):
            return WAIT
        try:
            return call(at_once)
        except sqlite3.OperationalError as e:
            if _busy(e):
                return WAIT
            raise StoreError(f"database error while {what}: {e}") from e
        finally:
            at_once.lock.release()

    def _waiting_for(self, what: str, call: Callable[[_SQLiteCounters], T]) -> T:
        """`call` on the SQLite connection that waits for the file's lock."""
        _, waiting = self._sqlite()
        try:
            with waiting.lock:
                return call(waiting)
        except sqlite3.Error as e:
            raise StoreError(f"database error while {what}: {e}") from e

    # every database ------------------------------------------------------------------
    def admit(self, counters: Sequence[Counter], now: float | None = None) -> Refusal | None:
        if not counters:
            return None
        now = time.time() if now is None else now
        ordered = sorted(counters, key=lambda c: c.key)  # one lock order on Postgres
        if self._sqlite_path is not None:
            return self._waiting_for("counting a request", lambda c: c.admit(ordered, now))
        t = quota_counters
        rows = [
            {"key": c.key, "window_start": c.window(now), "requests": 1, "tokens": 0}
            for c in ordered
        ]
        stmt = (
            postgresql.insert(t)
            .values(rows)
            .on_conflict_do_update(
                index_elements=[t.c.key, t.c.window_start],
                set_={"requests": t.c.requests + 1},
                where=case({c.key: _under(c) for c in ordered}, value=t.c.key, else_=true()),
            )
            .returning(t.c.key)
        )
        try:
            with self.engine.connect() as conn:
                tx = conn.begin()
                conn.exec_driver_sql("SET LOCAL synchronous_commit TO OFF")
                admitted = {row.key for row in conn.execute(stmt)}
                refused = [c for c in ordered if c.key not in admitted]
                if not refused:
                    tx.commit()
                    return None
                tx.rollback()  # nothing counted: the call is refused
                c = refused[0]
                row = conn.execute(
                    select(t.c.requests).where(t.c.key == c.key, t.c.window_start == c.window(now))
                ).first()
                return _refusal(c, None if row is None else int(row.requests), now)
        except SQLAlchemyError as e:
            raise StoreError(f"database error while counting a request: {e}") from e

    def spend(self, counters: Sequence[Counter], tokens: int, now: float | None = None) -> None:
        if not counters or tokens <= 0:
            return
        now = time.time() if now is None else now
        ordered = sorted(counters, key=lambda c: c.key)
        prune = self._prune_due()
        if self._sqlite_path is not None:
            self._waiting_for("counting tokens", lambda c: c.spend(ordered, tokens, now, prune))
            return
        t = quota_counters
        stmt = postgresql.insert(t).values(
            [
                {"key": c.key, "window_start": c.window(now), "requests": 0, "tokens": tokens}
                for c in ordered
            ]
        )
        stmt = stmt.on_conflict_do_update(
            index_elements=[t.c.key, t.c.window_start],
            set_={"tokens": t.c.tokens + stmt.excluded.tokens},
        )
        try:
            with self.engine.connect() as conn, conn.begin():
                conn.exec_driver_sql("SET LOCAL synchronous_commit TO OFF")
                conn.execute(stmt)
                if prune:
                    conn.execute(delete(t).where(t.c.window_start < int(now) - 2 * DAY))
        except SQLAlchemyError as e:
            raise StoreError(f"database error while counting tokens: {e}") from e

    def usage(self, keys: Sequence[str], now: float | None = None) -> list[Usage]:
        if not keys:
            return []
        now = time.time() if now is None else now
        t = quota_counters
        wanted = [
            and_(t.c.key == k, t.c.window_start == int(now // w) * w)
            for k, w in ((k, _window_of(k)) for k in keys)
        ]
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(select(t).where(or_(*wanted))).all()
        except SQLAlchemyError as e:
            raise StoreError(f"database error while reading quota counters: {e}") from e
        return [Usage(r.key, r.window_start, r.requests, r.tokens) for r in rows]

    def add(self, deltas: Sequence[Delta]) -> list[Usage]:
        if not deltas:
            return []
        deltas = sorted(deltas, key=lambda d: (d.key, d.window_start))  # one lock order
        prune_before = int(time.time()) - 2 * DAY if self._prune_due() else None
        if self._sqlite_path is not None:
            return self._waiting_for(
                "adding to quota counters", lambda c: c.add(deltas, prune_before)
            )
        t = quota_counters
        stmt = postgresql.insert(t).values(
            [
                {
                    "key": d.key,
                    "window_start": d.window_start,
                    "requests": d.requests,
                    "tokens": d.tokens,
                }
                for d in deltas
            ]
        )
        upsert = stmt.on_conflict_do_update(
            index_elements=[t.c.key, t.c.window_start],
            set_={
                "requests": t.c.requests + stmt.excluded.requests,
                "tokens": t.c.tokens + stmt.excluded.tokens,
            },
        ).returning(t.c.key, t.c.window_start, t.c.requests, t.c.tokens)
        try:
            with self.engine.connect() as conn, conn.begin():
                conn.exec_driver_sql("SET LOCAL synchronous_commit TO OFF")
                rows = conn.execute(upsert).all()
                if prune_before is not None:
                    conn.execute(delete(t).where(t.c.window_start < prune_before))
        except SQLAlchemyError as e:
            raise StoreError(f"database error while adding to quota counters: {e}") from e
        return [Usage(r.key, r.window_start, r.requests, r.tokens) for r in rows]


def _under(counter: Counter) -> Any:
    """The condition under which a row of this counter may take one more request."""
    t = quota_counters
    conditions = []
    if counter.max_requests is not None:
        conditions.append(t.c.requests < counter.max_requests)
    if counter.max_tokens is not None:
        conditions.append(t.c.tokens < counter.max_tokens)
    return and_(true(), *conditions)
