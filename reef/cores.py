"""How many torch threads training and evaluation take: a fixed number, or (`auto`) every core
the rest of the machine left idle during the last step.

The evolve worker trains on the machine that serves. One training thread leaves the other
cores to the engine, but a round then trains at one core's speed while an idle engine leaves
them unused; a fixed count of every core stalls when the engine needs them (an OpenMP step
waits for its slowest thread, and a SCHED_IDLE thread on a busy core barely runs). `auto`
measures, between steps, how much CPU time the machine spent on anything but this process
since the last step (`/proc/stat` against this process's own CPU time) and takes the cores
that left free: all of them while nothing is served, one as soon as the engine answers.

torch keeps its thread count per OS thread (OpenMP's setting), so `adapt()` is called from the
thread that computes: the training loop's per-step callback, the evaluation's batch loop.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

AUTO = "auto"
# A core counts as free when the rest of the machine used less than this share of it: a
# thread on a core the engine uses part of the time stalls every step's barrier that often.
BUSY_SLACK = 0.25
MIN_WINDOW_S = 0.05


def machine_busy_s() -> float | None:
    """CPU seconds every core of the machine has spent busy since boot (Linux /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice: inside user and nice]
    ticks = [int(x) for x in fields[1:9]]
    busy = sum(ticks) - ticks[3] - ticks[4]
    return busy / os.sysconf("SC_CLK_TCK")


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass
class Sample:
    """Seconds: monotonic wall clock, the machine's busy CPU time, this process's CPU time."""

    wall: float
    busy: float
    own: float


class IdleCores:
    """Threads for the next step: the cores the rest of the machine left idle since the last
    call (at least 1, at most `most`)."""

    def __init__(self, most: int | None = None) -> None:
        self.most = most or usable_cores()
        self._last = self._sample()
        self._previous = 1

    @staticmethod
    def _sample() -> Sample | None:
        busy = machine_busy_s()
        if busy is None:
            return None
        return Sample(time.monotonic(), busy, time.process_time())

    def threads(self) -> int:
        now, last = self._sample(), self._last
        if now is None or last is None:
            return 1  # no /proc/stat: the safe count
        wall = now.wall - last.wall
        if wall < MIN_WINDOW_S:  # too short to tell: what the window before measured
            return self._previous
        self._last = now
        self._previous = free_threads(last, now, self.most)
        return self._previous


def free_threads(last: Sample, now: Sample, most: int) -> int:
    """The cores the machine's other work left idle between two samples (at least 1, at most
    `most`): its busy time less this process's own, over the wall time."""
    others = max(0.0, (now.busy - last.busy) - (now.own - last.own)) / (now.wall - last.wall)
    return max(1, min(most, math.floor(most - others + BUSY_SLACK)))


class _Policy:
    """The process's setting: `reef.train_threads` is process-wide, and the worker trains one
    run at a time (flows.weights._IN_PROCESS)."""

    lock = threading.Lock()
    fixed: int | None = None
    auto: IdleCores | None = None


def use(setting: int | str | None) -> None:
    """Take `reef.train_threads` for the training and evaluation this process runs next: a
    count, `auto` (chosen at every `adapt()`), or None (torch's default). Sets the calling
    thread's count now; other threads take it at their next `adapt()`."""
    import torch

    with _Policy.lock:
        _Policy.fixed, _Policy.auto = None, None
        if setting == AUTO:
            _Policy.auto = IdleCores()
        elif setting:
            _Policy.fixed = int(setting)
    if setting == AUTO:
        torch.set_num_threads(1)  # until a step has measured the machine
    elif setting:
        torch.set_num_threads(int(setting))


def adapt() -> int:
    """Set the calling thread's torch threads for its next step; returns the count."""
    import torch

    with _Policy.lock:
        auto, fixed = _Policy.auto, _Policy.fixed
        threads = auto.threads() if auto is not None else fixed
    if threads is not None and threads != torch.get_num_threads():
        log.debug("torch threads %d -> %d", torch.get_num_threads(), threads)
        torch.set_num_threads(threads)
    return torch.get_num_threads()
