"""The worker hands back what a run's thread freed (flows.worker.trim_memory): glibc keeps the
free pages of each thread's malloc arena, which held 1.9 GiB of an idle worker's 3.4 GiB in
the soak run."""

from __future__ import annotations

import sys
import threading

import pytest

from reef.flows.worker import trim_memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_a_threads_freed_heap_goes_back_to_the_system() -> None:
    def run() -> None:  # as a run does: many small allocations in a thread, then freed
        held = [bytearray(1000) for _ in range(300_000)]
        del held

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    rss = trim_memory()
    assert rss is not None
    before, after = rss
    assert before - after > 200 << 20, f"RSS {before >> 20} -> {after >> 20} MiB"
