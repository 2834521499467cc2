"""The serving path's deadline on store work (reef.store.deadline, reef.store.pgconn): the
caller is answered at the deadline, the thread's wait for Postgres ends there too, on a
connection that is then closed and never handed out again. A server that never answers is
stood in for by one that answers too late (pg_sleep): the client cannot tell them apart, which
is the point. The frozen server itself is tests/faults/test_postgres_frozen.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from reef.errors import StoreTimeout
from reef.store.deadline import bounded, for_store, within
from reef.store.sql import open_store


def test_the_caller_is_answered_at_the_deadline_whatever_the_thread_does() -> None:
    async def main() -> float:
        started = time.monotonic()
        with pytest.raises(StoreTimeout, match=r"did not answer within 0\.2 s") as caught:
            await bounded(0.2, time.sleep, 0.6)  # a thread busy elsewhere (a pool wait, say)
        assert "did not answer within 0.2 s" in caught.value.public_message()
        return time.monotonic() - started

    assert 0.15 <= asyncio.run(main()) < 1.0
    assert asyncio.run(bounded(None, sum, [1, 2])) == 3  # no deadline: a plain thread hop


def test_work_whose_deadline_passed_before_it_started_never_reaches_the_database() -> None:
    ran: list[bool] = []
    with pytest.raises(StoreTimeout, match="waited for a thread"):
        within(1.0, lambda: ran.append(True), expires_at=time.monotonic() - 0.1)
    assert ran == []


def test_sqlite_has_no_deadline(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'reef.db'}")
    try:
        assert for_store(store, 10.0) is None
    finally:
        store.close()


@pytest.mark.postgres
def test_a_wait_past_the_deadline_closes_its_connection_and_the_next_work_gets_a_new_one(
    make_postgres_database: Callable[[], str],
) -> None:
    store = open_store(make_postgres_database())
    store.migrate()
    assert for_store(store, 10.0) == 10.0
    used: list[Any] = []

    def too_late() -> None:
        with store._tx("waiting on a server that does not answer") as conn:
            used.append(conn.connection.dbapi_connection)
            conn.execute(text("SELECT pg_sleep(5)"))

    try:
        started = time.monotonic()
        with pytest.raises(StoreTimeout, match=r"no answer within 0\.5 s") as caught:
            within(0.5, too_late)
        waited = time.monotonic() - started
        assert "connection closed" in caught.value.message
        # the thread came back at the deadline, its connection closed and out of the pool
        assert 0.45 <= waited < 2.0
        assert used[0].closed
        assert store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
        # later work, bounded or not, is served on fresh connections
        assert within(2.0, store.ping)
        for name in ("a", "b", "c"):
            within(2.0, store.create_scenario, name)
        assert [s.name for s in store.list_scenarios()] == ["a", "b", "c"]
    finally:
        store.close()
