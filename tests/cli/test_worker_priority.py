"""The evolve worker `reef serve` starts runs below the server's CPU priority (reef.worker_nice),
every thread of it, so that its start-up imports and its training take the cores only when the
serving engine leaves them; 0 keeps the server's priority."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from api.evolver import Evolver


def _nice(pid: int) -> dict[int, int]:
    """Each thread of `pid` -> its nice value (/proc/PID/task/TID/stat, field 19)."""
    out = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{task}/stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        out[int(task)] = int(stat.rsplit(")", 1)[1].split()[16])
    return out


def _worker_threads(tmp_path: Path, worker_nice: int) -> dict[int, int]:
    """Start the worker as `reef serve` does; once it has its preload thread running, the nice
    value of each of its threads."""
    overrides = {
        "reef": {"worker_nice": worker_nice},
        "store": {"database_url": f"sqlite:///{tmp_path / 'reef.db'}"},
    }
    evolver = Evolver(None, overrides, state_dir=tmp_path)
    evolver.start()
    proc = evolver._proc
    assert proc is not None
    try:
        deadline = time.monotonic() + 60
        while True:  # the preload thread starts once the worker has configured itself
            threads = _nice(proc.pid)
            if len(threads) > 1 or time.monotonic() > deadline:
                return threads
            assert proc.poll() is None, "the worker exited"
            time.sleep(0.05)
    finally:
        evolver.stop(timeout_s=1)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("worker_nice", [7, 0])
def test_every_thread_of_the_worker_runs_at_its_priority(tmp_path: Path, worker_nice: int) -> None:
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    threads = _worker_threads(tmp_path, worker_nice)
    assert len(threads) > 1, threads
    assert set(threads.values()) == {min(ours + worker_nice, 19)}, threads
