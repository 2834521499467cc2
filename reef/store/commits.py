"""Group commit: many concurrent record writes share one transaction (one fsync)."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from reef.errors import StoreError, StoreTimeout
from reef.records import Record
from reef.store.deadline import within
from reef.store.records import RecordStore

log = logging.getLogger(__name__)


class GroupCommitter:
    """Batches `add(record)` calls from many requests into `RecordStore.add_records` transactions.

    One flusher task takes everything pending (up to `max_batch`) and commits it in a worker
    thread; whatever arrives meanwhile waits for the next commit. Batches form naturally under
    load and a lone write is committed at once; `window_ms` adds an optional wait for company.
    `add` returns only once its record is committed (durable).

    Failures: when the database fails (StoreError), nothing of the batch was written and every
    waiter of that batch gets the error. When the database refuses a record (a duplicate id, an
    unknown scenario), the batch's records are retried one per transaction so that only the
    offending write fails, not the unrelated requests that shared its batch.

    Counters for metrics: `batches` (commit transactions attempted), `records` (records
    committed), `failed_batches`, `largest_batch`.

    `committed`, when given, is handed each batch's committed records after their waiters
    were answered (reef.telemetry: it must only queue them); its errors are logged.

    `deadline_s` (store.deadline_s on Postgres; None: unbounded): an `add` not committed within
    it raises StoreTimeout, and each commit's waits for the database end that long after it
    started (reef.store.deadline), so a database that never answers holds neither the callers
    nor the commit thread for good. A record whose caller gave up so is dropped if its batch
    has not left yet; one in the batch on its way may still be committed (never acknowledged).
    """

    def __init__(
        self,
        store: RecordStore,
        *,
        window_ms: float = 0.0,
        max_batch: int = 512,
        committed: Callable[[Sequence[Record]], None] | None = None,
        deadline_s: float | None = None,
    ):
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        if window_ms < 0:
            raise ValueError("window_ms must not be negative")
        self.store = store
        self.window_s = window_ms / 1000
        self.max_batch = max_batch
        self.batches = 0
        self.records = 0
        self.failed_batches = 0
        self.largest_batch = 0
        self.committed = committed
        self.deadline_s = deadline_s
        self._pending: deque[tuple[Record, asyncio.Future[None]]] = deque()
        self._wake = asyncio.Event()
        self._full = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        # Its own thread, not the loop's default executor: a commit must never queue behind
        # unrelated blocking work, and one thread keeps commits in arrival order.
        self._executor: ThreadPoolExecutor | None = None

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def start(self) -> None:
        if self._closing:
            raise StoreError("the group committer is closed")
        if self._task is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reef-commit")
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="reef-group-commit"
            )

    async def add(self, record: Record) -> None:
        """Return once `record` is committed; raise the commit's error otherwise."""
        if self._closing:
            raise StoreError("the group committer is closed: the server is shutting down")
        if self._task is None:
            await self.start()
        elif self._task.done():
            # The flusher died (a bug, or its loop is shutting down): never queue into a void.
            raise StoreError("the group committer has stopped")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((record, future))
        self._wake.set()
        if len(self._pending) >= self.max_batch:
            self._full.set()
        # Shielded: a caller that gives up (client disconnect) does not pull its record out of
        # a batch already on its way to the database.
        if self.deadline_s is None:
            await asyncio.shield(future)
            return
        timer = asyncio.timeout(self.deadline_s)
        try:
            async with timer:
                await asyncio.shield(future)
        except TimeoutError:
            if not timer.expired():
                raise
            # Cancelled, the record is skipped if its batch has not formed yet (_run): it was
            # never acknowledged, so it is never written behind its caller's back either.
            future.cancel()
            raise StoreTimeout(
                f"record '{record.id}' was not committed within {self.deadline_s:g} s",
                seconds=self.deadline_s,
            ) from None

    async def aclose(self) -> None:
        """Commit everything pending, then stop. Later `add` calls raise StoreError."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    # flusher --------------------------------------------------------------------
    async def _run(self) -> None:
        batch: list[tuple[Record, asyncio.Future[None]]] = []
        try:
            while True:
                if not self._pending:
                    if self._closing:
                        return
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                if self.window_s > 0 and len(self._pending) < self.max_batch and not self._closing:
                    self._full.clear()
                    try:
                        async with asyncio.timeout(self.window_s):
                            await self._full.wait()
                    except TimeoutError:
                        pass
                n = min(len(self._pending), self.max_batch)
                taken = [self._pending.popleft() for _ in range(n)]
                batch = [(r, f) for r, f in taken if not f.done()]  # callers past the deadline
                if batch:
                    await self._commit(batch)
                batch = []
        finally:
            # Only reached early if the task itself is cancelled (loop shutting down): no
            # waiter may hang. The batch in flight may or may not have been committed.
            stopped = StoreError("the group committer stopped before the commit was confirmed")
            for _, future in [*batch, *self._pending]:
                if not future.done():
                    future.set_exception(stopped)
            self._pending.clear()

    async def _commit(self, batch: list[tuple[Record, asyncio.Future[None]]]) -> None:
        loop = asyncio.get_running_loop()
        records = [record for record, _ in batch]
        self.batches += 1
        self.largest_batch = max(self.largest_batch, len(batch))
        try:
            await loop.run_in_executor(
                self._executor, within, self.deadline_s, self.store.add_records, records
            )
        except StoreError as e:
            self.failed_batches += 1
            for _, future in batch:
                _fail(future, e)
            return
        except Exception as e:
            self.failed_batches += 1
            if len(batch) == 1:
                _fail(batch[0][1], e)
                return
            outcomes = await loop.run_in_executor(self._executor, self._one_by_one, records)
            self.batches += len(outcomes)
            for (_, future), error in zip(batch, outcomes, strict=True):
                if error is None:
                    self.records += 1
                    _succeed(future)
                else:
                    self.failed_batches += 1
                    _fail(future, error)
            self._tell([r for r, e in zip(records, outcomes, strict=True) if e is None])
            return
        self.records += len(batch)
        for _, future in batch:
            _succeed(future)
        self._tell(records)

    def _tell(self, records: Sequence[Record]) -> None:
        if self.committed is None or not records:
            return
        try:
            self.committed(records)
        except Exception:
            log.exception("the group committer's `committed` hook failed")

    def _one_by_one(self, records: Sequence[Record]) -> list[Exception | None]:
        """Runs in the commit thread: each record in its own transaction."""
        outcomes: list[Exception | None] = []
        for record in records:
            try:
                within(self.deadline_s, self.store.add_records, [record])
            except Exception as e:
                outcomes.append(e)
            else:
                outcomes.append(None)
        return outcomes


def _succeed(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _fail(future: asyncio.Future[None], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
