"""Background tasks: one shape for work that runs beside a process's main work, periodically or
when triggered, with `start()` and `stop()`.

Every long-lived piece of background work uses it: in a serving process the engine registry's
heartbeat, the rollout watcher, the readiness numbers behind /metrics and the shadow copies'
writer (api.services.Services starts and stops them with the app); in the evolve worker the
schedule, the judge, retention and the dispatcher of triggers (cli.worker).

A task runs one step at a time on a thread of its own, so a step may block (a database, a
training run's submission) without holding up anything else. Steps never overlap: triggers
that arrive while a step runs coalesce into one more step after it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class BackgroundTask:
    """`step()` on a thread of its own: every `every_s` seconds (None: only when triggered),
    and whenever `trigger()` asks.

    - `now`: the first step runs as soon as the task starts (else after `every_s`).
    - `gather_s`: a triggered step waits this long first, so the triggers of that window are
      one step (e.g. one database write for the answers of 0.2 s).
    - `first` runs in the caller of `start()` before the thread starts (its error is raised
      there); `last` runs in the caller of `stop()` after the thread ended (its error is
      logged).

    A step that raises is logged and the task goes on; a step that must tell its own story
    (a warning, a retry time) catches its errors itself."""

    def __init__(
        self,
        name: str,
        step: Callable[[], object],
        *,
        every_s: float | None = None,
        now: bool = False,
        gather_s: float = 0.0,
        first: Callable[[], object] | None = None,
        last: Callable[[], object] | None = None,
    ):
        if every_s is not None and every_s <= 0:
            raise ValueError(f"background task {name}: every_s must be > 0, not {every_s}")
        self.name = name
        self.every_s = every_s
        self._step = step
        self._now = now
        self._gather_s = gather_s
        self._first = first
        self._last = last
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Run `first`, then the thread; starting a running task does nothing."""
        if self._thread is not None:
            return
        if self._first is not None:
            self._first()
        self._stopping.clear()
        if self._now:
            self._wake.set()
        self._thread = threading.Thread(target=self._run, name=f"reef-{self.name}", daemon=True)
        self._thread.start()

    def trigger(self) -> None:
        """Ask for a step soon (coalesced with any other request before it runs). A trigger
        before `start()` is kept: the first step follows the start."""
        self._wake.set()

    def stop(self, timeout_s: float | None = 30.0) -> None:
        """End the thread after the step in progress (waiting up to `timeout_s`: a step still
        running then finishes on its own, on a daemon thread), then run `last`."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stopping.set()
        self._wake.set()
        thread.join(timeout_s)
        if thread.is_alive():
            log.warning("background task %s did not stop within %s s", self.name, timeout_s)
        if self._last is not None:
            try:
                self._last()
            except Exception:
                log.exception("background task %s failed to finish", self.name)

    def _run(self) -> None:
        while True:
            triggered = self._wake.wait(self.every_s)
            if self._stopping.is_set():
                return
            if triggered and self._gather_s > 0:
                self._stopping.wait(self._gather_s)  # a stop cuts the window short
            self._wake.clear()
            try:
                self._step()
            except Exception:
                log.exception("background task %s failed", self.name)
