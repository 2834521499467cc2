"""GroupCommitter on both backends: batching, durability on return, failure propagation."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from reef.errors import NotFound, StoreError, StoreTimeout
from reef.records import Record
from reef.store.commits import GroupCommitter
from reef.store.sql import SQLStore, open_store

MakeRecord = Callable[..., Record]


def test_concurrent_adds_share_commits_and_are_readable_on_return(
    store: SQLStore, make_record: MakeRecord
) -> None:
    sc = store.create_scenario("gc")
    records = [make_record("gc", sc.head_release_id) for _ in range(200)]
    unreadable: list[str] = []

    async def add(committer: GroupCommitter, r: Record) -> None:
        await committer.add(r)
        # Checked synchronously, before any other task runs: committed means readable now.
        if not store.existing_record_ids("gc", [r.id]):
            unreadable.append(r.id)

    async def main() -> GroupCommitter:
        committer = GroupCommitter(store, max_batch=64)
        await committer.start()
        await asyncio.gather(*(add(committer, r) for r in records))
        await committer.aclose()
        return committer

    committer = asyncio.run(main())
    assert unreadable == []
    assert committer.records == 200
    assert committer.failed_batches == 0
    assert 1 <= committer.batches < 200
    assert committer.largest_batch <= 64
    assert store.list_records("gc", limit=1000) == sorted(records, key=lambda r: r.id)


def test_window_collects_sequentially_arriving_writes(
    store: SQLStore, make_record: MakeRecord
) -> None:
    sc = store.create_scenario("gc")

    async def main() -> GroupCommitter:
        committer = GroupCommitter(store, window_ms=200)
        tasks = []
        for _ in range(20):
            tasks.append(asyncio.create_task(committer.add(make_record("gc", sc.head_release_id))))
            await asyncio.sleep(0.001)
        await asyncio.gather(*tasks)
        await committer.aclose()
        return committer

    committer = asyncio.run(main())
    assert committer.records == 20
    assert committer.batches <= 2


@contextmanager
def _writes_blocked(database_url: str) -> Iterator[None]:
    """Another client holds the write lock on the records, as a stuck migration would."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        conn = sqlite3.connect(url.database or "", isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")
            conn.close()
        return
    plain = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(plain) as pg:
        pg.execute("LOCK TABLE records IN ACCESS EXCLUSIVE MODE")
        try:
            yield
        finally:
            pg.rollback()


def _impatient_store(database_url: str) -> SQLStore:
    """A store that gives up on a held lock after 200 ms instead of waiting."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        return open_store(database_url, busy_timeout_ms=200)
    impatient = url.update_query_dict({"options": "-c lock_timeout=200"})
    return open_store(impatient.render_as_string(hide_password=False))


def test_a_failing_batch_fails_every_waiter_and_writes_nothing(
    database_url: str, store: SQLStore, make_record: MakeRecord
) -> None:
    sc = store.create_scenario("gc")
    impatient = _impatient_store(database_url)
    records = [make_record("gc", sc.head_release_id) for _ in range(50)]

    async def main() -> tuple[list[BaseException | None], GroupCommitter]:
        committer = GroupCommitter(impatient)
        await committer.start()
        with _writes_blocked(database_url):
            results = await asyncio.gather(
                *(committer.add(r) for r in records), return_exceptions=True
            )
        # The committer survives the failure: the next write goes through.
        await committer.add(make_record("gc", sc.head_release_id, id="rec_after"))
        await committer.aclose()
        return results, committer

    try:
        results, committer = asyncio.run(main())
    finally:
        impatient.close()
    assert all(isinstance(r, StoreError) for r in results), results
    assert "database error while adding" in str(results[-1])
    assert committer.failed_batches >= 1
    assert committer.records == 1
    assert store.existing_record_ids("gc", [r.id for r in records]) == set()
    assert store.existing_record_ids("gc", ["rec_after"]) == {"rec_after"}


def test_a_refused_record_fails_only_its_own_waiter(
    store: SQLStore, make_record: MakeRecord
) -> None:
    sc = store.create_scenario("gc")
    good = [make_record("gc", sc.head_release_id) for _ in range(30)]
    bad = make_record("ghost", sc.head_release_id)

    async def main() -> list[BaseException | None]:
        committer = GroupCommitter(store)
        await committer.start()
        writes = [committer.add(r) for r in good[:15]] + [committer.add(bad)]
        writes += [committer.add(r) for r in good[15:]]
        results = await asyncio.gather(*writes, return_exceptions=True)
        await committer.aclose()
        return results

    results = asyncio.run(main())
    assert isinstance(results[15], NotFound)
    assert "scenario 'ghost' not found" in str(results[15])
    assert results[:15] + results[16:] == [None] * 30
    assert store.existing_record_ids("gc", [r.id for r in good]) == {r.id for r in good}


def test_aclose_commits_pending_then_refuses(store: SQLStore, make_record: MakeRecord) -> None:
    sc = store.create_scenario("gc")
    records = [make_record("gc", sc.head_release_id) for _ in range(40)]

    async def main() -> None:
        committer = GroupCommitter(store, window_ms=50)
        tasks = [asyncio.create_task(committer.add(r)) for r in records]
        await asyncio.sleep(0)  # the adds are queued, none committed yet
        await committer.aclose()
        # Committed by aclose itself, before the waiters have even resumed.
        assert len(store.existing_record_ids("gc", [r.id for r in records])) == 40
        assert await asyncio.gather(*tasks) == [None] * 40
        with pytest.raises(StoreError, match="closed"):
            await committer.add(make_record("gc", sc.head_release_id))

    asyncio.run(main())


def test_a_cancelled_waiter_does_not_lose_its_record(
    store: SQLStore, make_record: MakeRecord
) -> None:
    sc = store.create_scenario("gc")
    record = make_record("gc", sc.head_release_id)

    async def main() -> None:
        committer = GroupCommitter(store, window_ms=50)
        task = asyncio.create_task(committer.add(record))
        await asyncio.sleep(0.01)
        task.cancel()
        await committer.aclose()

    asyncio.run(main())
    assert store.existing_record_ids("gc", [record.id]) == {record.id}


def test_a_write_past_the_deadline_is_refused_and_the_committer_goes_on(
    database_url: str, store: SQLStore, make_record: MakeRecord
) -> None:
    """store.deadline_s: a commit the database does not answer in time fails its caller at the
    deadline, and the next write goes through once the database answers. On Postgres the
    connection that waited was closed before its COMMIT was sent, so the record is not stored;
    SQLite's thread waits for the file's lock (no deadline there in serving) and commits it
    once the lock is free: stored, never acknowledged, which is allowed."""
    sc = store.create_scenario("gc")
    late = make_record("gc", sc.head_release_id)
    after = make_record("gc", sc.head_release_id)

    async def main() -> float:
        committer = GroupCommitter(store, deadline_s=0.5)
        await committer.start()
        with _writes_blocked(database_url):
            started = time.monotonic()
            with pytest.raises(StoreTimeout, match=r"within 0\.5 s"):
                await committer.add(late)
            waited = time.monotonic() - started
            await asyncio.sleep(0.3)  # the commit thread's own deadline passes too
        await committer.add(after)
        await committer.aclose()
        return waited

    assert 0.45 <= asyncio.run(main()) < 2.0
    assert store.existing_record_ids("gc", [after.id]) == {after.id}
    postgres = make_url(database_url).get_backend_name() == "postgresql"
    assert store.existing_record_ids("gc", [late.id]) == (set() if postgres else {late.id})


def test_a_record_whose_caller_gave_up_before_its_batch_left_is_never_written(
    tmp_path: Path, make_record: MakeRecord
) -> None:
    url = f"sqlite:///{tmp_path / 'reef.db'}"
    store = open_store(url)
    store.migrate()
    sc = store.create_scenario("gc")
    first = make_record("gc", sc.head_release_id)  # its batch leaves, then waits for the lock
    queued = make_record("gc", sc.head_release_id)  # waits behind it, past its deadline

    async def main() -> tuple[list[BaseException | None], GroupCommitter]:
        committer = GroupCommitter(store, deadline_s=0.3)
        await committer.start()
        with _writes_blocked(url):
            adds = [asyncio.create_task(committer.add(first))]
            await asyncio.sleep(0.05)
            adds.append(asyncio.create_task(committer.add(queued)))
            results = await asyncio.gather(*adds, return_exceptions=True)
        await committer.aclose()
        return results, committer

    try:
        results, committer = asyncio.run(main())
        assert [type(r) for r in results] == [StoreTimeout, StoreTimeout]
        # the batch on its way was committed once the lock was free (never acknowledged);
        # the record still queued when its caller was answered was dropped, never written
        assert store.existing_record_ids("gc", [first.id, queued.id]) == {first.id}
        assert committer.records == 1 and committer.batches == 1
    finally:
        store.close()
