"""The evolve worker `reef serve` starts runs below the server's CPU priority
(reef.worker_priority), every thread of it, so that its start-up imports and its training take
the cores only when the serving engine leaves them: idle is SCHED_IDLE (and nice 19), low is
nice +10, normal keeps the server's."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from reef.api.evolver import Evolver


def _threads(pid: int) -> dict[int, tuple[int, int]]:
    """Each thread of `pid` -> (its nice value, its scheduling policy)."""
    out = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{task}/stat").read_text()
            policy = os.sched_getscheduler(int(task))
        except OSError:  # the thread ended meanwhile
            continue
        out[int(task)] = (int(stat.rsplit(")", 1)[1].split()[16]), policy)  # field 19: nice
    return out


def _worker_threads(
    tmp_path: Path, priority: str, expected: tuple[int, int]
) -> dict[int, tuple[int, int]]:
    """Start the worker as `reef serve` does; once its threads have `expected` (nice,
    policy) and, below idle, its preload thread runs too, each thread's nice value and policy. (An
    idle worker on a machine busy with other tests may wait long for its next thread; the
    threads it starts inherit what the main thread has, which the kernel sees to.)"""
    overrides = {
        "reef": {"worker_priority": priority},
        "store": {"database_url": f"sqlite:///{tmp_path / 'reef.db'}"},
    }
    evolver = Evolver(None, overrides, state_dir=tmp_path)
    evolver.start()
    proc = evolver._proc
    assert proc is not None
    try:
        deadline = time.monotonic() + 60
        while True:  # the preload thread starts once the worker has configured itself
            threads = _threads(proc.pid)
            same = set(threads.values()) == {expected}
            settled = same and (priority == "idle" or len(threads) > 1)
            if settled or time.monotonic() > deadline:
                return threads
            assert proc.poll() is None, "the worker exited"
            time.sleep(0.05)
    finally:
        evolver.stop(timeout_s=1)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")
@pytest.mark.parametrize(
    ("priority", "nice", "policy"),
    [
        ("idle", 19, getattr(os, "SCHED_IDLE", 5)),
        ("low", 10, os.SCHED_OTHER),
        ("normal", 0, os.SCHED_OTHER),
    ],
)
def test_every_thread_of_the_worker_runs_at_its_priority(
    tmp_path: Path, priority: str, nice: int, policy: int
) -> None:
    expected = (min(os.getpriority(os.PRIO_PROCESS, 0) + nice, 19), policy)
    threads = _worker_threads(tmp_path, priority, expected)
    assert len(threads) > 1 or priority == "idle", threads
    assert set(threads.values()) == {expected}, threads
