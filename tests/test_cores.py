"""reef.train_threads: a fixed count, or `auto` (the cores the rest of the machine left idle
during the last step), applied to the thread that computes."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest
import torch

from reef import cores
from reef.cores import IdleCores, Sample, free_threads
from reef.errors import ConfigError
from reef.settings import load_settings


def test_the_free_cores_are_what_the_others_left_over_the_window():
    last = Sample(wall=100.0, busy=1_000.0, own=50.0)
    # 2 s: the machine busy 2 s in all, of which 2 s were this process's: the others left both
    assert free_threads(last, Sample(102.0, 1_002.0, 52.0), most=2) == 2
    # the others used a whole core (2 s of busy time besides ours over 2 s): one is left
    assert free_threads(last, Sample(102.0, 1_004.0, 52.0), most=2) == 1
    # a fifth of a core taken by the others still counts as free; half of one does not
    assert free_threads(last, Sample(102.0, 1_000.4, 50.0), most=2) == 2
    assert free_threads(last, Sample(102.0, 1_001.0, 50.0), most=2) == 1
    # never below one, never above the cap
    assert free_threads(last, Sample(102.0, 1_010.0, 50.0), most=2) == 1
    assert free_threads(last, Sample(102.0, 1_000.0, 50.0), most=8) == 8


def _spin(stop: multiprocessing.synchronize.Event) -> None:
    while not stop.is_set():
        pass


def test_auto_takes_one_thread_while_every_core_is_busy_elsewhere():
    """Real /proc/stat: a busy process per core, at this process's priority."""
    share = IdleCores()
    stop = multiprocessing.get_context("fork").Event()
    procs = [
        multiprocessing.get_context("fork").Process(target=_spin, args=(stop,))
        for _ in range(share.most)
    ]
    for p in procs:
        p.start()
    try:
        time.sleep(0.2)
        share.threads()  # the window starts with every spinner running
        time.sleep(1.0)
        assert share.threads() == 1
    finally:
        stop.set()
        for p in procs:
            p.join(10)


def test_this_process_own_work_is_measured_with_its_threads():
    """The training's own threads are taken off the machine's busy time (else a two-core
    machine training on both would see them as the others' work and drop to 1): the process
    CPU clock counts every thread's time, a spinning thread's second included."""
    stop = threading.Event()
    spinner = threading.Thread(target=lambda: [None for _ in iter(stop.is_set, True)])
    started = time.process_time()
    spinner.start()
    time.sleep(1.0)
    stop.set()
    spinner.join()
    assert time.process_time() - started > 0.5


def test_use_sets_the_count_and_adapt_keeps_it_on_every_thread():
    before = torch.get_num_threads()
    seen: list[int] = []
    try:
        cores.use(1)
        assert torch.get_num_threads() == 1
        worker = threading.Thread(target=lambda: seen.append(cores.adapt()))
        worker.start()
        worker.join()
        assert seen == [1]
        cores.use("auto")
        assert torch.get_num_threads() == 1  # until a step has measured
        time.sleep(0.1)
        assert 1 <= cores.adapt() <= cores.usable_cores()
    finally:
        cores.use(None)
        torch.set_num_threads(before)


@pytest.mark.parametrize(("value", "expected"), [("auto", "auto"), (2, 2), ("3", 3), (None, None)])
def test_the_setting_takes_a_count_or_auto(value, expected):
    assert load_settings(None, reef={"train_threads": value}).reef.train_threads == expected


@pytest.mark.parametrize("value", [0, "all", -1])
def test_the_setting_refuses_anything_else(value):
    with pytest.raises(ConfigError, match="train_threads"):
        load_settings(None, reef={"train_threads": value})
