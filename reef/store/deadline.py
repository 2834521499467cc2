"""A client-side deadline for the serving path's store work (store.deadline_s).

A PostgreSQL server that accepts connections and then never answers (its processes stopped
with SIGSTOP, a paused VM, a hung storage layer under it) is bounded by nothing else: its
kernel still acknowledges the data sent and the keepalives, so libpq's tcp_user_timeout and
keepalives (reef.store.connect) never fire. Without a deadline a call whose record commit or
lookup reaches such a server waits for good, and so does the thread doing the work; every
later call parks another thread behind it.

Two halves, one expiry for each piece of store work:

- the caller's (`bounded`): the work runs in a worker thread, and the awaiting call is
  answered StoreTimeout (503 `store_unavailable`, Retry-After) once the expiry passes, whatever
  the thread is doing then: waiting for the database, for a pooled connection, for a thread;
- the thread's (`within`): the expiry is put in the thread's context, and every wait of a
  Postgres connection for the server (reef.store.connect.DeadlineConnection: each statement,
  fetch, commit and pre-ping; a new connection's connect_timeout) ends at it. A wait that
  reaches it closes its connection, so the pool discards it, and raises: the thread returns
  at the deadline instead of never, and the next work gets a fresh connection, which the
  server answers again once it thaws.

Work outside these (the evolve worker, `reef gc`, the server's background tasks, migrations)
carries no expiry and waits as before: a long migration or a lock wait is not a frozen server.
`seconds=None` (SQLite: a local file, whose writers wait busy_timeout for its lock) leaves the
work unbounded as well.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, NamedTuple, TypeVar

from sqlalchemy.exc import DBAPIError

from reef.errors import StoreError, StoreTimeout

T = TypeVar("T")


class Deadline(NamedTuple):
    expires_at: float  # time.monotonic()
    seconds: float  # the whole allowance, for messages

    def left(self) -> float:
        return self.expires_at - time.monotonic()


_CURRENT: ContextVar[Deadline | None] = ContextVar("reef_store_deadline", default=None)


def current() -> Deadline | None:
    """The deadline of the store work running in this context, if it has one."""
    return _CURRENT.get()


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def within(
    seconds: float | None, fn: Callable[..., T], /, *args: Any, expires_at: float | None = None
) -> T:
    """`fn(*args)` (store work, called in a worker thread) with every wait for the database
    ending at `expires_at` (default: `seconds` from now). A database failure once it passed is
    raised as StoreTimeout; work whose deadline passed before it started (it waited for a
    thread) is refused without touching the database."""
    if seconds is None:
        return fn(*args)
    deadline = Deadline(time.monotonic() + seconds if expires_at is None else expires_at, seconds)
    if deadline.left() <= 0:
        raise StoreTimeout(
            f"{_name(fn)} was not started: its {seconds:g} s passed while it waited for a thread",
            seconds=seconds,
        )
    token = _CURRENT.set(deadline)
    try:
        return fn(*args)
    except (StoreError, DBAPIError) as e:
        if isinstance(e, StoreTimeout) or deadline.left() > 0:
            raise
        what = e.message if isinstance(e, StoreError) else str(e).splitlines()[0]
        raise StoreTimeout(f"no answer within {seconds:g} s: {what}", seconds=seconds) from e
    finally:
        _CURRENT.reset(token)


async def bounded(
    seconds: float | None,
    fn: Callable[..., T],
    /,
    *args: Any,
    run: Callable[..., Awaitable[Any]] = asyncio.to_thread,
) -> T:
    """`fn(*args)` in a worker thread (`run`: asyncio.to_thread, or another pool's), under
    `within`, and StoreTimeout for the caller once `seconds` pass: the thread itself returns at
    the same expiry, its connection closed. `seconds=None`: `run(fn, *args)` as it is."""
    if seconds is None:
        done: T = await run(fn, *args)
        return done
    expires_at = time.monotonic() + seconds
    timer = asyncio.timeout(seconds)
    try:
        async with timer:
            done = await run(functools.partial(within, seconds, fn, *args, expires_at=expires_at))
            return done
    except TimeoutError:
        if not timer.expired():
            raise
        raise StoreTimeout(
            f"{_name(fn)}: the database did not answer within {seconds:g} s", seconds=seconds
        ) from None


def for_store(store: object, seconds: float) -> float | None:
    """The deadline for a store's serving work: `seconds` on Postgres; None on SQLite (a local
    file: nothing there accepts a request and then never answers, and its writers wait
    busy_timeout for the file's lock, as they always have)."""
    dialect = getattr(getattr(store, "engine", None), "dialect", None)
    return seconds if getattr(dialect, "name", None) == "postgresql" else None
