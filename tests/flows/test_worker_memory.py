"""The worker hands back what a run's thread freed (flows.worker.trim_memory): glibc keeps the
free pages of each thread's malloc arena, which held 1.9 GiB of an idle worker's 3.4 GiB in
the soak run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# In a process of its own, as the worker is: a test process's heap (its earlier tests' threads
# and arenas) decides by itself how much of a new thread's memory glibc already gave back.
RUN = """
import json, threading
from reef.flows.worker import trim_memory

kept = []

def run():  # as a run does: many small allocations in a thread of its own, then freed, but
    # for a few that live on (caches, results): they pin the arena's pages around them, so
    # free() alone cannot shrink it
    held = [bytearray(1000) for _ in range(300_000)]
    kept.extend(held[::256])
    del held

worker = threading.Thread(target=run)
worker.start()
worker.join()
print(json.dumps(trim_memory()))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_a_threads_freed_heap_goes_back_to_the_system() -> None:
    out = subprocess.run([sys.executable, "-c", RUN], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rss = json.loads(out.stdout.strip().splitlines()[-1])
    assert rss is not None
    before, after = rss
    assert before - after > 200 << 20, f"RSS {before >> 20} -> {after >> 20} MiB"
