"""Postgres restarted, and stopped for DOWN_S, while the evolve worker is in the middle of runs:
the rows of test_postgres_outages.py serve with no worker, so the loop's rules were never
checked across a database outage.

One `reef serve` on a private cluster (tests/faults/postgres.py; the machine's server is shared
and never restarted) with the embedded engine on the tiny model and the SFT recipe, its worker
as a process, `reef.schedule_s` SCHEDULE_S. Two rounds, each with one scenario per stage, run
side by side: the runs are held (REEF_FAULTS_PAUSE, reef.faults) once the gate has decided
(`evaluated`: nothing registered) and right before the head's compare-and-swap (`before_cas`:
the candidate registered, staged and verified in the engine). With both held, the database
is restarted (`pg_ctl restart -m fast`), or stopped, the runs let go, and started again DOWN_S
later. Nobody touches the system; a client calls and reports in another scenario every 0.5 s
all along. Checked: every call or report is answered 200/201, or 503 with Retry-After, within
CALL_BOUND_S (none hangs), and while the database is stopped every call is refused so; every
scenario reaches exactly one release, served as its head, within RECOVERY_S of the database's
return; nothing acknowledged is lost and the chain, the candidates and the consumption receipts
agree (tests/faults/invariants.py), read back from the database."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from reef.store.sql import open_store
from reef.testing.process import ReefServer
from tests.faults.invariants import loop_violations, lost, measured
from tests.faults.postgres import Caller, PrivatePostgres
from tests.faults.test_api_kills import _served_head
from tests.faults.test_postgres_outages import _clean, private_postgres
from tests.faults.test_worker_kills import _ready, _report
from tests.reefserver import wait_for

__all__ = ["private_postgres"]

DOWN_S = 30.0  # how long the database stays stopped
RECOVERY_S = 240  # a cap for a busy machine; the measured times are in docs/reliability.md
SCHEDULE_S = 3.0  # reef.schedule_s: a run that failed is tried again without a new report
STAGES = ("evaluated", "before_cas")


def _config(tmp_path: Path) -> Path:
    cfg = tmp_path / "cfg.yaml"
    loop = {"recipe": "sft", "batch_size": 2, "params": {"epochs": 1}, "schedule_s": SCHEDULE_S}
    cfg.write_text(yaml.safe_dump({"reef": loop, "gate": {"policy": "always", "holdout": 0.0}}))
    return cfg


def _stage(scenario: str) -> str:
    """Where the scenario's run is held: `<stage>@<scenario>` (the scenario `<fault>-<stage>`)."""
    return f"{scenario.split('-', 1)[1]}@{scenario}"


def _served(srv: ReefServer, scenario: str) -> str | None:
    """The scenario's new head, once a call in it is served on it (None while the API still
    refuses)."""
    try:
        return _served_head(srv, scenario)
    except (httpx.HTTPError, KeyError, ValueError):
        return None


def _outage(
    tmp_path: Path, srv: ReefServer, scenarios: list[str], down: Callable[[], dict[str, Any]]
) -> tuple[float, float, dict[str, Any]]:
    """Wait for a run of each scenario held at its stage, then `down()` (which lets the runs
    go on and brings the database back): when the database was back (wall-clock, monotonic),
    and what `down` timed."""
    markers = [tmp_path / f"reef-pause-{_stage(s)}" for s in scenarios]
    for m in markers:
        wait_for(f"the run held at {m.name}", m.exists, srv, RECOVERY_S)
    timed = down()
    return time.time(), time.monotonic(), timed


def _let_go(tmp_path: Path, scenarios: list[str]) -> None:
    for s in scenarios:
        (tmp_path / f"reef-pause-{_stage(s)}.go").touch()


def _recovered(srv: ReefServer, scenario: str, back: float) -> dict[str, float]:
    """Seconds from the database's return until the scenario's release was published, and
    until it was served."""
    head = wait_for(f"{scenario}'s head served", lambda: _served(srv, scenario), srv, RECOVERY_S)
    served = time.time()
    chain = httpx.get(f"{srv.url}/reef/scenarios/{scenario}/releases", timeout=30).json()["data"]
    assert chain[0]["release_id"] == head
    published = datetime.fromisoformat(chain[0]["created_at"]).timestamp()
    return {
        "published_after_back_s": round(published - back, 1),
        "served_after_back_s": round(served - back, 1),
    }


def _count(log: str, what: str, scenario: str) -> int:
    """The worker's log lines of `scenario` that say `what`."""
    return sum(what in line for line in log.splitlines() if f"[scenario={scenario}]" in line)


def _check(
    pg: PrivatePostgres, acked: dict[str, tuple[list[str], list[str]]], caller: Caller
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """From the database: nothing acknowledged lost (asserted), each scenario one release;
    what breaks the loop's rules, and the candidates' statuses, by scenario."""
    store = open_store(pg.url)
    found: dict[str, list[str]] = {}
    statuses: dict[str, list[str]] = {}
    try:
        for scenario, (receipts, reports) in acked.items():
            assert lost(store, scenario, receipts, reports) == [], scenario
            chain = store.list_releases(scenario)
            assert len(chain) == 2, f"{scenario}: not one release: {[r.id for r in chain]}"
            if violations := loop_violations(store, scenario, set(receipts)):
                found[scenario] = violations
            statuses[scenario] = sorted(c.status for c in store.list_candidates(scenario))
        assert lost(store, "steady", caller.acked("call"), caller.acked("report")) == []
    finally:
        store.close()
    return found, statuses


@pytest.mark.faults
@pytest.mark.timeout(900)
def test_postgres_restarted_and_stopped_in_the_middle_of_runs(
    tmp_path: Path, private_postgres: PrivatePostgres
) -> None:
    pg = private_postgres
    rounds = {f: [f"{f}-{stage}" for stage in STAGES] for f in ("restart", "stop")}
    env = {
        "REEF_REEF__AUTO": "true",
        "REEF_FAULTS_PAUSE": ",".join(_stage(s) for r in rounds.values() for s in r),
        "REEF_FAULTS_DIR": str(tmp_path),
    }
    args = ("-c", str(_config(tmp_path)), "--model", "tiny", "--database-url", pg.url)
    acked: dict[str, tuple[list[str], list[str]]] = {}
    numbers: dict[str, Any] = {}

    def restart() -> dict[str, Any]:
        began.append(time.monotonic())
        took = pg.restart()
        _let_go(tmp_path, rounds["restart"])
        return {"pg_ctl_restart_s": round(took, 2)}

    def stop() -> dict[str, Any]:
        took: dict[str, Any] = {"pg_ctl_stop_s": round(pg.stop(), 2)}
        stopped = time.monotonic()
        _let_go(tmp_path, rounds["stop"])
        time.sleep(2)
        r = httpx.get(f"{srv.url}/readyz", timeout=10)
        took["readyz_while_down"] = (r.status_code, r.json()["dependencies"]["store"]["state"])
        time.sleep(max(0.0, DOWN_S - (time.monotonic() - stopped)))
        window.extend([stopped, time.monotonic()])
        return took | {"pg_ctl_start_s": round(pg.start(), 2)}

    window: list[float] = []  # the stop's: from the database stopped until its start
    began: list[float] = []  # when the restart began
    with ReefServer(tmp_path / "state", *args, env=env) as srv:
        _ready(srv, 1)
        with Caller(srv.url, "steady", "tiny", score=0.0, every_s=0.5) as caller:
            wait_for("calls served", lambda: len(caller.acked("report")) >= 3, srv, 60)
            for fault, down in (("restart", restart), ("stop", stop)):
                for scenario in rounds[fault]:
                    acked[scenario] = _report(srv, scenario)
                back, back_at, timed = _outage(tmp_path, srv, rounds[fault], down)
                again = functools.partial(caller.first_ok_after, back_at)
                first = wait_for("a call served", again, srv, 60)
                numbers[fault] = timed | {
                    "first_200_after_back_s": round(first, 3),
                    "until_then": caller.summary(caller.between(began[-1], back_at + first))
                    if fault == "restart"
                    else None,
                    **{s: _recovered(srv, s, back) for s in rounds[fault]},
                }
            time.sleep(1)  # a few more calls and reports on the database that came back
            # The registrations the stop failed left MLflow versions that no candidate names
            # (one a try); the scenario's recover deletes them.
            tracking = f"sqlite:///{tmp_path / 'state' / 'mlflow.db'}"
            for scenario in rounds["stop"]:
                clean = functools.partial(_no_stray_versions, pg, tracking, scenario)
                wait_for(f"no stray MLflow version of {scenario}", clean, srv, 30)
        log = srv.log()
    attempts = list(caller.attempts)
    during = caller.between(*window)
    found, statuses = _check(pg, acked, caller)
    failed = {s: _count(log, "prefect.flow_runs: Finished in state Failed", s) for s in acked}
    numbers |= {
        "during_stop": caller.summary(during),
        "attempts": len(attempts),
        "failed_runs": failed,
        "mlflow_versions": {s: _count(log, f"as models:/reef-{s}/", s) for s in acked},
        "candidates": statuses,
        "found": found,
    }
    measured("postgres restarted and stopped mid-run", numbers)

    assert _clean(attempts) == [], _clean(attempts)[:5]
    calls_down = [a for a in during if a.kind == "call"]
    assert len(calls_down) > 20 and {(a.status, a.retry_after) for a in calls_down} == {(503, "2")}
    assert numbers["stop"]["readyz_while_down"] == (503, "unavailable")
    assert found == {}
    _runs_as_expected(failed, statuses)
    assert len(caller.acked("report")) > 20


def _no_stray_versions(pg: PrivatePostgres, tracking: str, scenario: str) -> bool:
    """Whether every MLflow version of `scenario` names a release or a candidate of its
    chain."""
    from mlflow import MlflowClient

    store = open_store(pg.url)
    try:
        known = {c.id for c in store.list_candidates(scenario)}
        known |= {r.id for r in store.list_releases(scenario)}
    finally:
        store.close()
    found = MlflowClient(tracking).search_model_versions(f"name = 'reef-{scenario}'")
    stray = [v.version for v in found if v.tags.get("reef.release_id") not in known]
    return not stray


def _runs_as_expected(failed: dict[str, int], statuses: dict[str, list[str]]) -> None:
    """A restart passes unnoticed: each run goes on, on new connections (pool_pre_ping). A
    stop fails the held runs (the fault hit) with nothing published and nothing consumed; a
    run on the schedule once the database is back trains the batch again and publishes, and
    the candidate the `before_cas` run registered is marked failed by that run's recover."""
    assert failed["restart-evaluated"] == failed["restart-before_cas"] == 0
    assert statuses["restart-evaluated"] == statuses["restart-before_cas"] == ["published"]
    assert failed["stop-evaluated"] == failed["stop-before_cas"] == 1
    assert statuses["stop-evaluated"] == ["published"]
    assert statuses["stop-before_cas"] == ["failed", "published"]
