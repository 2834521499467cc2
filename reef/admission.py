"""Bounded admission to the engine: overload degrades (fast 429s), never collapses.

Every inference call the serving layer gives the engine first takes a running slot here:
at most `max_running` calls are in the engine at once, the rest wait in line (first come,
first served). The line is bounded:

- `max_queue`: a call that finds the line that long is refused at once (EngineBusy, 429,
  reason "queue_full"); None: no bound, 0: no call waits;
- `max_queue_wait_s`: a call still in line after this long is refused instead of being run
  (reason "queue_wait"): its client has waited as long as is useful; None: no limit.

A refused call was never given to the engine: nothing of it is recorded. `Retry-After` is an
estimate from the measured time calls hold their slot: how long the line ahead takes to drain,
at least a second. Shadow copies and admin generations do not pass here (they have their own
bounds); a slot is held from the engine's start of a call to its last token, not while the
record is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from dataclasses import dataclass

from reef.errors import EngineBusy

# Near full: the line at or above this share of max_queue makes the engine "busy" in /readyz.
NEAR_FULL = 0.9
# Retry-After is at least this and at most this many seconds.
RETRY_MIN_S = 1
RETRY_MAX_S = 60
# Weight of the newest hold time in the moving average behind Retry-After.
_EWMA = 0.2


@dataclass(frozen=True)
class Load:
    """The line at one instant."""

    running: int
    waiting: int
    max_running: int
    max_queue: int | None

    @property
    def busy(self) -> bool:
        """All slots taken and the line full or nearly (a bounded line only)."""
        if self.max_queue is None or self.running < self.max_running:
            return False
        return self.waiting >= math.ceil(self.max_queue * NEAR_FULL)


class Slot:
    """One running slot; `release` hands it to the next call in line (idempotent, and safe
    from a garbage collector's finalizer in any thread: it goes through the loop then)."""

    __slots__ = ("_admission", "_held", "_loop", "_since")

    def __init__(self, admission: Admission):
        self._admission = admission
        self._since = time.monotonic()
        self._held = True
        self._loop = asyncio.get_running_loop()

    def release(self) -> None:
        if not self._held:
            return
        self._held = False
        held_s = time.monotonic() - self._since
        try:
            here = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            here = False
        if here:
            self._admission._release(held_s)
            return
        with contextlib.suppress(RuntimeError):  # a closed loop: nothing waits any more
            self._loop.call_soon_threadsafe(self._admission._release, held_s)


class Admission:
    """The running slots and the bounded line in front of one engine. Event-loop only."""

    def __init__(
        self, max_running: int, max_queue: int | None = None, max_queue_wait_s: float | None = None
    ):
        if max_running < 1:
            raise ValueError("max_running must be at least 1")
        self.max_running = max_running
        self.max_queue = max_queue
        self.max_queue_wait_s = max_queue_wait_s
        self.running = 0
        self._line: deque[asyncio.Future[None]] = deque()
        self.refused: dict[str, int] = {"queue_full": 0, "queue_wait": 0}
        self._hold_s = 1.0  # moving average of how long a call holds its slot

    def load(self) -> Load:
        return Load(self.running, len(self._line), self.max_running, self.max_queue)

    def check(self) -> None:
        """Refuse now (queue_full) when a call arriving now would find the line full: the
        cheap early answer, before a call's work (its session, its quota) is done."""
        if self._full():
            raise self._refuse("queue_full")

    def _full(self) -> bool:
        if self.running < self.max_running and not self._line:
            return False
        return self.max_queue is not None and len(self._line) >= self.max_queue

    async def enter(self) -> Slot:
        """A running slot, at once or after a wait in line; EngineBusy when the line is full
        or the wait runs past max_queue_wait_s."""
        if self.running < self.max_running and not self._line:
            self.running += 1
            return Slot(self)
        if self._full():
            raise self._refuse("queue_full")
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._line.append(turn)
        try:
            if self.max_queue_wait_s is None:
                await asyncio.shield(turn)
            else:
                await asyncio.wait([turn], timeout=self.max_queue_wait_s)
        except BaseException:  # cancelled (the client left): give back what came meanwhile
            self._leave(turn)
            raise
        if not turn.done():
            self._leave(turn)
            raise self._refuse("queue_wait")
        return Slot(self)

    def _leave(self, turn: asyncio.Future[None]) -> None:
        """`turn` gives up its place; a slot already handed to it goes to the next in line."""
        if turn.done():
            self._release(None)
            return
        turn.cancel()
        with contextlib.suppress(ValueError):
            self._line.remove(turn)

    def _release(self, held_s: float | None) -> None:
        if held_s is not None:
            self._hold_s += _EWMA * (held_s - self._hold_s)
        while self._line:
            turn = self._line.popleft()
            if not turn.done():
                turn.set_result(None)  # the slot passes on: `running` stays
                return
        self.running -= 1

    def retry_after_s(self) -> int:
        """Seconds until the line ahead has probably drained: (waiting + 1) hold times shared
        by the running slots."""
        drain = self._hold_s * (len(self._line) + 1) / self.max_running
        return min(RETRY_MAX_S, max(RETRY_MIN_S, math.ceil(drain)))

    def _refuse(self, reason: str) -> EngineBusy:
        self.refused[reason] += 1
        retry = self.retry_after_s()
        if reason == "queue_full":
            message = (
                f"the engine is busy: {self.running} calls running and {len(self._line)} "
                f"waiting (engine.max_queue {self.max_queue}); retry in {retry}s"
            )
        else:
            message = (
                f"the engine is busy: this call waited {self.max_queue_wait_s:g}s for it "
                f"(engine.max_queue_wait_s) and was not run; retry in {retry}s"
            )
        return EngineBusy(message, retry_after_s=retry, reason=reason)
