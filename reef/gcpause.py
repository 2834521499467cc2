"""Pausing Python's cyclic garbage collector around bulk reads.

Reading experience builds hundreds of thousands of small objects (decoded JSON bodies, records,
samples) and none of them forms a reference cycle: reference counting frees them. Yet every
700 allocations the cyclic collector runs, and each time enough objects have survived it walks
the whole heap; on a 100k-record read those passes cost as much as the read itself (measured by
bench/materialize.py). Within `paused()` the collector does not run; it resumes as before when
the last concurrent pause ends. Thread-safe and nestable: `gc.disable` is process-wide, so a
count of open pauses decides when it is enabled again.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_open = 0
_was_enabled = False


@contextmanager
def paused() -> Iterator[None]:
    """No cyclic garbage collection in this block (nor anywhere in the process meanwhile)."""
    global _open, _was_enabled
    with _lock:
        if _open == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _open += 1
    try:
        yield
    finally:
        with _lock:
            _open -= 1
            if _open == 0 and _was_enabled:
                gc.enable()
