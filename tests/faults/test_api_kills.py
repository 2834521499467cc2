"""The API process SIGKILLed while a run deploys its candidate into it: one `reef serve` (tiny
model, SFT, its evolve worker as a process) and one scenario per point, killed where
REEF_FAULTS says (reef.faults API_POINTS): `staged` (the candidate's variant loaded into the
serving engine, the load not yet answered) or `verifying` (the deploy's smoke generation asked
for, not yet run). The kill is of the API process alone: its worker, mid-deploy, lives on
(its stdin has ended, so it finishes its run and exits). Then the server is started again on
the same state and port, as a supervisor would, and nobody else touches the system; a client
calls and reports in another scenario every half second throughout. The scenario must reach
exactly one release, served as its head, with nothing acknowledged lost and the chain, the
candidates and the consumption receipts in agreement (tests/faults/invariants.py)."""

from __future__ import annotations

import functools
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml

from reef.faults import API_POINTS
from reef.store.sql import open_store
from reef.testing.process import ReefServer
from tests.faults.invariants import loop_violations, lost, measured
from tests.faults.test_worker_kills import RECOVERY_S, Steady, _release, _report
from tests.reefserver import wait_for


def _worker(srv: ReefServer) -> psutil.Process:
    assert srv.proc is not None
    found = [
        p
        for p in psutil.Process(srv.proc.pid).children(recursive=True)
        if "reef.cli.worker" in " ".join(p.cmdline())
    ]
    assert len(found) == 1, found
    return found[0]


def _served_head(srv: ReefServer, scenario: str) -> str | None:
    """The head, once a call in the scenario is served on it."""
    release = _release(srv, scenario)
    if release is None:
        return None
    r = httpx.post(
        f"{srv.url}/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        headers={"x-reef-scenario": scenario},
        timeout=30,
    )
    served = r.headers.get("x-reef-release-id") if r.status_code == 200 else None
    return served if served == release["release_id"] else None


def _ended(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _from_the_database(
    state: Path, scenario: str, acked: dict[str, tuple[list[str], list[str]]]
) -> tuple[list[Any], list[str], dict[str, str]]:
    """Nothing acknowledged lost (asserted); the scenario's chain, what breaks the loop's
    rules, and its candidates' statuses."""
    store = open_store(f"sqlite:///{state / 'reef.db'}")
    try:
        for name, (receipts, reports) in acked.items():
            assert lost(store, name, receipts, reports) == [], name
        chain = store.list_releases(scenario)
        violations = loop_violations(store, scenario, set(acked[scenario][0]))
        candidates = {c.id: c.status for c in store.list_candidates(scenario)}
    finally:
        store.close()
    return chain, violations, candidates


@pytest.mark.faults
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("point", "late"), [(API_POINTS[0], False), (API_POINTS[1], True)])
def test_the_api_killed_during_a_deploy_recovers(tmp_path: Path, point: str, late: bool) -> None:
    """`late`: started again only once the dead API's worker has given up its deploy (tried
    DEPLOY_ATTEMPTS times, 5 s apart) and exited, as after a slow restart; else at once, and
    the worker's next attempt deploys into the new process."""
    scenario = f"api-{point}"
    cfg = tmp_path / "cfg.yaml"
    loop = {"recipe": "sft", "batch_size": 2, "params": {"epochs": 1}}
    cfg.write_text(yaml.safe_dump({"reef": loop, "gate": {"policy": "always", "holdout": 0.0}}))
    env = {
        "REEF_REEF__AUTO": "true",
        "REEF_FAULTS": f"{point}@{scenario}",
        "REEF_FAULTS_DIR": str(tmp_path),
    }
    state, args = tmp_path / "state", ("-c", str(cfg), "--model", "tiny")
    numbers: dict[str, Any] = {}
    srv = ReefServer(state, *args, env=env).start()
    steady = Steady(srv)  # the same port all along: it calls the restarted server too
    old_worker = None
    try:
        wait_for("the worker ready", lambda: "evolve worker ready" in srv.log(), srv, 300)
        steady.thread.start()
        old_worker = _worker(srv)
        receipts, reports = _report(srv, scenario)
        assert srv.proc is not None
        proc = srv.proc
        wait_for(f"the API killed at {point}", lambda: proc.poll() is not None, srv, RECOVERY_S)
        marker = tmp_path / f"reef-fault-{point}@{scenario}"
        assert marker.exists(), f"the API was not killed at {point}: {proc.returncode}"
        killed = marker.stat().st_mtime
        if late:
            wait_for("the old worker gone", lambda: _ended(old_worker), srv, RECOVERY_S)
            numbers["old_worker_exited_after_kill_s"] = round(time.time() - killed, 1)
        # started again on the same state and port (a supervisor's restart)
        numbers["restarted_after_kill_s"] = round(time.time() - killed, 1)
        started = time.monotonic()
        srv = ReefServer(state, *args, port=srv.port, env=env).start()
        numbers["restart_to_ready_s"] = round(time.monotonic() - started, 1)
        head = wait_for(
            "the head served", functools.partial(_served_head, srv, scenario), srv, RECOVERY_S
        )
        numbers["head_served_after_kill_s"] = round(time.time() - killed, 1)
        release = _release(srv, scenario)
        assert release is not None and release["release_id"] == head
        published = datetime.fromisoformat(release["created_at"]).timestamp()
        numbers["published_after_kill_s"] = round(published - killed, 1)
        if not late:
            wait_for("the old worker gone", lambda: _ended(old_worker), srv, RECOVERY_S)
            numbers["old_worker_exited_after_kill_s"] = round(time.time() - killed, 1)
        deploy_failures = srv.log().count(f"{scenario}: evolve failed")
        time.sleep(2)  # a few more steady calls on the restarted server
    finally:
        steady.stop.set()
        if steady.thread.is_alive():
            steady.thread.join(30)
        srv.kill()
        if old_worker is not None and not _ended(old_worker):
            old_worker.kill()
    log = srv.log()
    acked = {scenario: (receipts, reports), "steady": (steady.receipts, steady.reports)}
    chain, violations, candidates = _from_the_database(state, scenario, acked)
    numbers |= {
        "candidates": sorted(candidates.values()),
        "failed_runs": deploy_failures,
        "steady_errors": len(steady.errors),
        "steady_acked": len(steady.receipts),
        "violations": violations,
    }
    measured(f"api killed at {point}", numbers)
    assert log.count("fault injected: SIGKILL") == 1
    assert len(chain) == 2, [r.id for r in chain]  # the base and exactly one training release
    assert violations == []
    if late:  # the dead API's run gave up (its candidate failed); the new worker's own published
        assert sorted(candidates.values()) == ["failed", "published"], candidates
        assert deploy_failures == 1
    assert len(steady.receipts) > 10
