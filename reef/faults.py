"""Named points in the evolve run where the fault tests kill the process (tests/faults): off
unless REEF_FAULTS names a point, and then the process dies by SIGKILL there, once.

    REEF_FAULTS=trained@support,before_cas@billing   (point@scenario, comma-separated)
    REEF_FAULTS_DIR=/tmp/x                             (where "once" is remembered)

A kill, not an exception: nothing of the process's own clean-up runs, as when the machine
loses power or the kernel's OOM killer picks it. The points, in a run's order: `materialized`
(the snapshot written, nothing consumed), `trained` (the candidate's files made, nothing
evaluated), `evaluated` (the gate decided, nothing registered), `registered` (the candidate
and its MLflow version stored, not deployed), `before_cas` (staged and verified in the engine,
the head not moved), `after_cas` (the head moved, and in the same transaction the batch's
consumption receipts; the candidate's status and the MLflow alias not yet written),
`published` (all of that written; the run's recover not yet run).

The API process has points of its own, reached in `reef serve` while a deploy drives its
engine (tests/faults/test_api_kills.py: the API killed under a deploy), in API_POINTS:
`staged` (the deploy's variant loaded into the engine, the load not yet answered) and
`verifying` (the deploy's smoke generation asked for, not yet run); the scenario is the
variant's (`scenario@release`). A kill there is of the API process alone: its worker lives on.
(Kills only: a pause there would hold the API's event loop.)

A point can hold the run instead, for a test that takes a dependency away at that stage
(tests/faults/test_store_outages.py: MLflow or S3 down during a run):

    REEF_FAULTS_PAUSE=evaluated@support   (point@scenario, comma-separated)

There the process writes `reef-pause-<point>@<scenario>` in REEF_FAULTS_DIR and waits (at most
PAUSE_MAX_S) until `reef-pause-<point>@<scenario>.go` exists, once."""

from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger("reef.faults")

ENV, DIR_ENV, PAUSE_ENV = "REEF_FAULTS", "REEF_FAULTS_DIR", "REEF_FAULTS_PAUSE"
PAUSE_MAX_S = 600.0
POINTS = ("materialized", "trained", "evaluated", "registered", "before_cas", "after_cas")
API_POINTS = ("staged", "verifying")


def reached(point: str, scenario: str) -> None:
    """SIGKILL this process if REEF_FAULTS names `point@scenario` and it has not yet; hold it
    there if REEF_FAULTS_PAUSE does."""
    paused = os.environ.get(PAUSE_ENV)
    if paused and f"{point}@{scenario}" in paused.split(","):
        _pause(point, scenario)
    spec = os.environ.get(ENV)
    if not spec or f"{point}@{scenario}" not in spec.split(","):
        return
    where = Path(os.environ.get(DIR_ENV) or tempfile.gettempdir())
    try:
        os.close(os.open(where / f"reef-fault-{point}@{scenario}", os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return  # killed here once already: this time the run goes on
    log.warning("fault injected: SIGKILL at %s of %s", point, scenario)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _pause(point: str, scenario: str) -> None:
    """Wait at `point` until the test says go (its `.go` file), once."""
    where = Path(os.environ.get(DIR_ENV) or tempfile.gettempdir())
    marker = where / f"reef-pause-{point}@{scenario}"
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return  # held here once already
    log.warning("fault injected: paused at %s of %s", point, scenario)
    go = marker.with_name(marker.name + ".go")
    deadline = time.monotonic() + PAUSE_MAX_S
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    log.warning("fault injected: going on from %s of %s", point, scenario)
