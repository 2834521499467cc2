"""Background tasks: periodic and triggered steps on a thread of their own, never overlapping,
coalescing triggers, surviving a failing step, with `first` and `last` around the thread."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from reef.background import BackgroundTask


def _until(what: str, check: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_periodic_task_steps_on_its_interval_and_outlives_a_failing_step() -> None:
    steps: list[float] = []

    def step() -> None:
        steps.append(time.monotonic())
        if len(steps) == 2:
            raise RuntimeError("one bad step")

    task = BackgroundTask("periodic", step, every_s=0.05)
    task.start()
    try:
        _until("four steps", lambda: len(steps) >= 4)
        assert task.running
    finally:
        task.stop()
    assert not task.running
    after = len(steps)
    time.sleep(0.2)
    assert len(steps) == after  # stopped: no step after stop()
    assert all(b - a >= 0.04 for a, b in itertools.pairwise(steps))


def test_triggers_coalesce_while_a_step_runs_and_steps_never_overlap() -> None:
    release = threading.Event()
    running, steps, overlap = [0], [0], [False]

    def step() -> None:
        running[0] += 1
        overlap[0] |= running[0] > 1
        release.wait(5)
        steps[0] += 1
        running[0] -= 1

    task = BackgroundTask("triggered", step)
    task.trigger()  # before start: kept, the first step follows the start
    task.start()
    try:
        _until("the first step running", lambda: running[0] == 1)
        for _ in range(10):  # ten triggers during one step: one more step
            task.trigger()
        release.set()
        _until("two steps", lambda: steps[0] == 2)
        time.sleep(0.2)
        assert steps[0] == 2 and not overlap[0]
    finally:
        task.stop()


def test_gather_makes_a_window_of_triggers_one_step() -> None:
    batches: list[int] = []
    pending = [0]

    def step() -> None:
        batches.append(pending[0])
        pending[0] = 0

    task = BackgroundTask("gathering", step, gather_s=0.3)
    task.start()
    try:
        for _ in range(5):
            pending[0] += 1
            task.trigger()
            time.sleep(0.02)
        _until("one step", lambda: batches)
        time.sleep(0.4)
        assert batches == [5]
    finally:
        task.stop()


def test_first_runs_in_start_and_last_in_stop() -> None:
    order: list[str] = []
    task = BackgroundTask(
        "bracketed",
        lambda: order.append("step"),
        every_s=60,
        now=True,
        first=lambda: order.append("first"),
        last=lambda: order.append("last"),
    )
    task.start()
    task.start()  # a second start does nothing
    _until("the first step (now=True)", lambda: "step" in order)
    task.stop()
    task.stop()  # nor does a second stop
    assert order == ["first", "step", "last"]


def test_a_failing_first_fails_the_start() -> None:
    def enter() -> None:
        raise RuntimeError("no registry")

    task = BackgroundTask("failing", lambda: None, every_s=1, first=enter)
    with pytest.raises(RuntimeError, match="no registry"):
        task.start()
    assert not task.running
    with pytest.raises(ValueError, match="every_s"):
        BackgroundTask("zero", lambda: None, every_s=0)
