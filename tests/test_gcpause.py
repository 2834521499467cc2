"""reef.gcpause: the cyclic collector is off inside a pause, nested and across threads, and
back as it was after the last one ends."""

from __future__ import annotations

import gc
import threading

from reef import gcpause


def test_nested_and_concurrent_pauses_restore_the_collector() -> None:
    assert gc.isenabled()
    inside = threading.Event()
    release = threading.Event()

    def other() -> None:
        with gcpause.paused():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    with gcpause.paused():
        assert not gc.isenabled()
        with gcpause.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause is still open
        t.start()
        assert inside.wait(10)
    assert not gc.isenabled()  # the other thread's pause is still open
    release.set()
    t.join(10)
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled() -> None:
    gc.disable()
    try:
        with gcpause.paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_an_exception_ends_the_pause() -> None:
    try:
        with gcpause.paused():
            raise ValueError("x")
    except ValueError:
        pass
    assert gc.isenabled()
