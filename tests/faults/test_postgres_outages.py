"""Postgres itself going away under traffic, where the serving rows (test_serving_faults.py)
only cut the way to it: a private cluster of the test's own (tests/faults/postgres.py; the
machine's server is shared and never restarted) restarted, then stopped for DOWN_S and started
again, while a client calls and reports every 0.1 s through a real `reef serve` (upstream mode,
the echo upstream). Checks what the client sees (200, or 503 `store_unavailable` with
Retry-After in bounded time: no hang, nothing else), what /readyz says while the database is
down, how long after it is back calls succeed, and, from the database afterwards, that every
call answered 200 has its record and every report answered 201 is stored. The measured
numbers are printed (JSON) for docs/reliability.md."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import URL, make_url

from reef.store.sql import open_store
from reef.testing.process import ReefServer
from tests.faults.invariants import lost
from tests.faults.invariants import measured as report
from tests.faults.postgres import Attempt, Caller, PrivatePostgres
from tests.reefserver import EchoUpstream, Relay, wait_for

DOWN_S = 30.0  # how long the database stays stopped
CALL_BOUND_S = 5.0  # no call or report takes longer, whatever the database is doing
BACK_BOUND_S = 30.0  # a cap for a busy machine: the measured times are in docs/reliability.md


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    pg = PrivatePostgres()
    try:
        yield pg.init()
    finally:
        pg.close()


def _served_again(srv: ReefServer, caller: Caller, since: float) -> float:
    """Seconds from `since` until a call started after it was answered 200."""
    got: float = wait_for(
        "a call answered 200 again", lambda: caller.first_ok_after(since), srv, BACK_BOUND_S
    )
    return got


def _clean(attempts: list[Attempt]) -> list[Attempt]:
    """The attempts that were neither served nor refused cleanly (503 with Retry-After), or
    took longer than the bound."""
    return [
        a
        for a in attempts
        if a.seconds > CALL_BOUND_S
        or (a.status not in (200, 201) and not (a.status == 503 and a.retry_after))
    ]


def _store_state(srv: ReefServer) -> tuple[int, str, float]:
    started = time.monotonic()
    r = httpx.get(f"{srv.url}/readyz", timeout=10)
    return r.status_code, r.json()["dependencies"]["store"]["state"], time.monotonic() - started


@pytest.mark.faults
@pytest.mark.timeout(300)
def test_postgres_restarted_then_stopped_under_traffic(
    tmp_path: Path, private_postgres: PrivatePostgres
) -> None:
    pg = private_postgres
    numbers: dict[str, Any] = {}
    with (
        EchoUpstream() as echo,
        ReefServer(
            tmp_path / "state",
            *("--engine", "upstream", "--upstream-url", echo.base_url),
            *("--database-url", pg.url),
        ) as srv,
        Caller(srv.url) as caller,
    ):
        wait_for("calls served", lambda: len(caller.acked("report")) >= 10, srv, 60)

        # (a) a fast restart: sessions ended, the server down and up again
        t0 = time.monotonic()
        numbers["restart"] = {"pg_ctl_restart_s": round(pg.restart(), 2)}
        t1 = time.monotonic()
        back = _served_again(srv, caller, t1)
        numbers["restart"] |= {
            "first_200_after_restart_s": round(back, 3),
            **caller.summary(caller.between(t0, t1 + back)),
        }

        # (b) stopped for DOWN_S, then started again
        wait_for("calls served", lambda: caller.first_ok_after(time.monotonic() - 1), srv, 30)
        t2 = time.monotonic()
        stop_s = pg.stop()
        t3 = time.monotonic()
        time.sleep(2)
        ready = _store_state(srv)
        acked = caller.acked("call")[0]
        refused = httpx.post(
            f"{srv.url}/reef/report", json={"references": [acked], "score": 1.0}, timeout=10
        )
        time.sleep(max(0.0, DOWN_S - (time.monotonic() - t2)))
        t4 = time.monotonic()
        start_s = pg.start()
        t5 = time.monotonic()
        back = _served_again(srv, caller, t5)
        wait_for("ready", lambda: _store_state(srv)[0] == 200, srv, BACK_BOUND_S)
        time.sleep(1)  # a few more calls and reports on the database that came back
        during = caller.between(t3, t4)
        numbers["stop"] = {
            "pg_ctl_stop_s": round(stop_s, 2),
            "down_s": round(t5 - t2, 1),
            "pg_ctl_start_s": round(start_s, 2),
            "first_200_after_start_s": round(back, 3),
            "readyz_while_down": ready[:2],
            "readyz_s": round(ready[2], 3),
            "during": caller.summary(during),
        }
    attempts = list(caller.attempts)
    numbers["attempts"] = len(attempts)
    report("postgres restarted and stopped", numbers)

    assert _clean(attempts) == [], _clean(attempts)[:5]
    # while it was down every call was refused cleanly, the report too
    calls_down = [a for a in during if a.kind == "call"]
    assert len(calls_down) > 20 and {a.status for a in calls_down} == {503}
    assert {a.retry_after for a in calls_down} == {"2"}
    assert refused.status_code == 503 and refused.headers.get("retry-after") == "2", refused.text
    assert refused.json()["error"]["code"] == "store_unavailable"
    assert ready[0] == 503 and ready[1] == "unavailable" and ready[2] < CALL_BOUND_S
    # nothing acknowledged lost
    store = open_store(pg.url)
    try:
        assert lost(store, "default", caller.acked("call"), caller.acked("report")) == []
    finally:
        store.close()
    assert len(caller.acked("report")) > 20


CUT_S = 10.0  # how long the partitioned replica stays cut off


@pytest.mark.faults
@pytest.mark.postgres
@pytest.mark.timeout(300)
def test_a_replica_partitioned_from_the_database_while_another_serves(
    tmp_path: Path, make_postgres_database: Callable[[], str]
) -> None:
    """Two replicas on one database (the machine's Postgres, a fresh database): `near` direct,
    `far` through a relay that is cut for CUT_S and restored, a client calling and reporting
    through each all along."""
    direct = make_url(make_postgres_database())
    relay = Relay((direct.host or "127.0.0.1", direct.port or 5432))
    through = direct.set(host="127.0.0.1", port=relay.port)
    numbers: dict[str, Any] = {}
    with EchoUpstream() as echo:
        upstream = ("--engine", "upstream", "--upstream-url", echo.base_url)

        def replica(name: str, url: URL) -> ReefServer:
            database = ("--database-url", url.render_as_string(hide_password=False))
            return ReefServer(tmp_path / name, *upstream, *database)

        with (
            replica("near", direct) as near,
            replica("far", through) as far,
            Caller(near.url) as near_caller,
            Caller(far.url) as far_caller,
        ):
            for srv, c in ((near, near_caller), (far, far_caller)):
                wait_for("calls served", lambda c=c: len(c.acked("report")) >= 10, srv, 60)
            t0 = time.monotonic()
            relay.cut()
            time.sleep(2)
            ready = {"near": _store_state(near), "far": _store_state(far)}
            time.sleep(max(0.0, CUT_S - (time.monotonic() - t0)))
            t1 = time.monotonic()
            relay.restore()
            back = _served_again(far, far_caller, t1)
            wait_for("far ready", lambda: _store_state(far)[0] == 200, far, BACK_BOUND_S)
            time.sleep(1)  # a few more calls and reports through both
        numbers = {
            "cut_s": round(t1 - t0, 1),
            "readyz while cut": {k: [*v[:2], round(v[2], 3)] for k, v in ready.items()},
            "far while cut": far_caller.summary(far_caller.between(t0 + 0.5, t1)),
            "near while cut": near_caller.summary(near_caller.between(t0, t1)),
            "far: first 200 after restore_s": round(back, 3),
        }
    report("replica partitioned", numbers)

    for c in (near_caller, far_caller):
        assert _clean(list(c.attempts)) == [], _clean(list(c.attempts))[:5]
    # the partitioned replica refused cleanly, the other served every call all along
    far_cut = [a for a in far_caller.between(t0 + 0.5, t1) if a.kind == "call"]
    assert len(far_cut) > 20 and {(a.status, a.retry_after) for a in far_cut} == {(503, "2")}
    near_all = list(near_caller.attempts)
    assert {a.status for a in near_all} == {200, 201}, near_caller.summary(near_all)
    assert len([a for a in near_caller.between(t0, t1) if a.status == 200]) > 20
    assert ready["far"][:2] == (503, "unavailable") and ready["near"][:2] == (200, "ok")
    # both serve again, and nothing either acknowledged is lost
    assert far_caller.first_ok_after(t1) is not None
    store = open_store(direct.render_as_string(hide_password=False))
    try:
        for c in (near_caller, far_caller):
            assert lost(store, "default", c.acked("call"), c.acked("report")) == []
    finally:
        store.close()
