"""The artifact store's disk full while a run registers its candidate, then space freed, while a
client keeps sending calls and reports.

One `reef serve` (tiny model, SFT, its worker as a process, `reef.schedule_s` 3 s) whose
artifact store is a directory on a small tmpfs of its own (the database stays in the state
directory, on another filesystem: the fault is the artifact disk's, as when a volume fills).
The run is held once the gate has decided (REEF_FAULTS_PAUSE), the tmpfs is filled to its last
byte, the run goes on and cannot write the candidate's files; OUTAGE_S later the filler is
deleted. Nobody touches the system: the scenario must reach exactly one release, with nothing
acknowledged lost and the chain, the candidates and the consumption receipts in agreement
(tests/faults/invariants.py).

Needs root (to mount the tmpfs), as CI runs; skipped otherwise."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reef.store.sql import open_store
from reef.testing.process import ReefServer
from tests.faults.invariants import loop_violations, lost, measured
from tests.faults.test_store_outages import (
    OUTAGE_S,
    RECOVERY_S,
    _config,
    _env,
    _published_at,
)
from tests.faults.test_worker_kills import Steady, _ready, _release, _report
from tests.reefserver import wait_for

pytestmark = [pytest.mark.faults, pytest.mark.timeout(900)]

DISK_MB = 32
SCENARIO = "disk-register"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of DISK_MB mounted for the test (root only)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    where = tmp_path / "disk"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(disk: Path) -> Path:
    """Write a file until the disk refuses the next byte; returns it."""
    filler = disk / "filler"
    chunk = b"\0" * (1 << 20)
    with filler.open("wb", buffering=0) as f:
        with contextlib.suppress(OSError):  # ENOSPC: full
            while True:
                f.write(chunk)
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)
    assert os.statvfs(disk).f_bavail == 0, "the disk is not full"
    return filler


def test_artifact_disk_full_during_register(tmp_path: Path, small_disk: Path) -> None:
    """Held once the gate has decided, the artifact disk filled: the candidate's files cannot be
    written (ENOSPC), the run fails with nothing published and its batch unconsumed; runs
    meanwhile fail materializing their snapshot; once space is freed, a run on the schedule
    trains the batch again and publishes it. Serving never notices."""
    artifacts = small_disk / "artifacts"
    cfg = _config(tmp_path, {"artifacts": {"url": str(artifacts)}})
    stage = f"evaluated@{SCENARIO}"
    env = _env(tmp_path, [stage])
    state = tmp_path / "state"
    with ReefServer(state, "-c", str(cfg), "--model", "tiny", env=env) as srv:
        _ready(srv, 1)
        steady = Steady(srv)
        steady.thread.start()
        try:
            acked = _report(srv, SCENARIO)
            marker = tmp_path / f"reef-pause-{stage}"
            wait_for(f"the run held at {stage}", marker.exists, srv, RECOVERY_S)
            filler = _fill(small_disk)
            marker.with_name(marker.name + ".go").touch()
            wait_for(
                "the run's failure", lambda: f"{SCENARIO}: evolve failed" in srv.log(), srv, 120
            )
            time.sleep(OUTAGE_S)
            filler.unlink()
            back = time.time()
            release = wait_for(
                f"{SCENARIO}'s release", lambda: _release(srv, SCENARIO), srv, RECOVERY_S
            )
        finally:
            steady.stop.set()
            steady.thread.join(30)
        log = srv.log()
    store = open_store(f"sqlite:///{state / 'reef.db'}")
    try:
        missing = lost(store, SCENARIO, *acked) + lost(
            store, "steady", steady.receipts, steady.reports
        )
        chain = store.list_releases(SCENARIO)
        violations = loop_violations(store, SCENARIO, set(acked[0]))
    finally:
        store.close()
    failure = next(line for line in log.splitlines() if f"{SCENARIO}: evolve failed" in line)
    measured(
        "artifact disk full",
        {
            "published_after_space_s": round(_published_at(release) - back, 1),
            "failure": failure[-300:],
            "violations": violations,
        },
    )
    assert "No space left on device" in log, "the run did not fail for want of space"
    assert missing == [] and violations == []
    assert len(chain) == 2, "not exactly one release"
    assert steady.errors == [] and len(steady.receipts) > 20
