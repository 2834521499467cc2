"""A PostgreSQL server that accepts connections and then never answers: the test's private
cluster (tests/faults/postgres.py; the machine's own server is shared and never signalled)
frozen with SIGSTOP, every process of it, for FROZEN_S, then SIGCONT. Its kernel still completes
connections and acknowledges what is sent, so neither libpq's tcp_user_timeout nor its
keepalives ever fire: only the serving path's deadline (store.deadline_s, DEADLINE_S here;
reef.store.deadline) bounds what a call waits.

A client calls and reports every 0.1 s through a real `reef serve` (upstream mode, the echo
upstream) all along. Checks: while frozen every call is answered 503 `store_unavailable` with
Retry-After within about the deadline (none hangs), and so are a report and /readyz; the
connections that waited were closed by the server at the deadline (its log says so), so no
thread stays blocked; once thawed, calls are served again within seconds, with no restart; and,
read from the database afterwards, every call answered 200 has its record and every report
answered 201 is stored. The measured numbers are printed (JSON) for docs/reliability.md."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from reef.store.sql import open_store
from reef.testing.process import ReefServer
from tests.faults.invariants import lost
from tests.faults.invariants import measured as report
from tests.faults.postgres import Attempt, Caller, PrivatePostgres
from tests.faults.test_postgres_outages import private_postgres
from tests.reefserver import EchoUpstream, wait_for

__all__ = ["private_postgres"]  # the fixture: PrivatePostgres.close thaws the cluster first

DEADLINE_S = 2.0  # store.deadline_s for the server under test (the default is 10 s)
FROZEN_S = 10.0  # how long the cluster stays stopped
CALL_BOUND_S = DEADLINE_S + 2.0  # no call, report or probe takes longer: a cap for a busy machine
BACK_BOUND_S = 15.0  # a cap for a busy machine: the measured times are in docs/reliability.md
CLOSED = "closed a connection to the database: no answer within"  # reef.store.pgconn's warning
HEADERS = {"x-reef-scenario": "default"}


def _timed(fn: Any) -> tuple[float, Any]:
    started = time.monotonic()
    got = fn()
    return time.monotonic() - started, got


def _probe(srv: ReefServer, receipt: str) -> dict[str, Any]:
    """While frozen: /readyz, a report quoting a stored receipt, a call through the openai SDK,
    one after the other; each one's seconds and what it was answered."""
    out: dict[str, Any] = {}
    with httpx.Client(base_url=srv.url, headers=HEADERS, timeout=30) as http:
        s, r = _timed(lambda: http.get("/readyz"))
        out["readyz"] = (s, r.status_code, r.json()["dependencies"]["store"])
        s, r = _timed(
            lambda: http.post("/reef/report", json={"references": [receipt], "score": 1.0})
        )
        out["report"] = (s, r.status_code, r.headers.get("retry-after"), r.json()["error"])
    client = openai.OpenAI(
        base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=30, default_headers=HEADERS
    )
    started = time.monotonic()
    try:
        client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "x"}])
        out["call"] = (time.monotonic() - started, 200, None, None)
    except openai.APIStatusError as e:
        error = e.response.json()["error"]
        out["call"] = (time.monotonic() - started, e.status_code, e.response.headers, error)
    return out


def _threads(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))


def _ready_after(srv: ReefServer, since: float) -> float:
    def ready() -> float | None:
        r = httpx.get(f"{srv.url}/readyz", timeout=10)
        return time.monotonic() - since if r.status_code == 200 else None

    got: float = wait_for("ready again", ready, srv, BACK_BOUND_S)
    return got


def _unclean(attempts: list[Attempt]) -> list[Attempt]:
    """Attempts neither served nor refused cleanly (503 with Retry-After), or over the bound."""
    return [
        a
        for a in attempts
        if a.seconds > CALL_BOUND_S
        or (a.status not in (200, 201) and not (a.status == 503 and a.retry_after == "2"))
    ]


@pytest.mark.faults
@pytest.mark.timeout(240)
def test_frozen_postgres_answers_503_at_the_deadline_and_recovers_on_thaw(
    tmp_path: Path, private_postgres: PrivatePostgres
) -> None:
    pg = private_postgres
    with (
        EchoUpstream() as echo,
        ReefServer(
            tmp_path / "state",
            *("--engine", "upstream", "--upstream-url", echo.base_url),
            *("--database-url", pg.url),
            env={"REEF_STORE__DEADLINE_S": str(DEADLINE_S)},
        ) as srv,
        Caller(srv.url) as caller,
    ):
        wait_for("calls served", lambda: len(caller.acked("report")) >= 10, srv, 60)
        assert srv.proc is not None
        threads = {"before": _threads(srv.proc.pid)}
        t0 = time.monotonic()
        stopped = pg.freeze()
        probes = _probe(srv, caller.acked("call")[0])
        time.sleep(max(0.0, FROZEN_S - (time.monotonic() - t0)))
        threads["frozen"] = _threads(srv.proc.pid)
        t1 = time.monotonic()
        pg.thaw()
        back = wait_for("a 200 again", lambda: caller.first_ok_after(t1), srv, BACK_BOUND_S)
        ready = _ready_after(srv, t1)
        time.sleep(1)  # a few more calls and reports on the database that came back
        threads["after"] = _threads(srv.proc.pid)
        closed = srv.log().count(CLOSED)
    attempts, frozen = list(caller.attempts), caller.between(t0, t1)
    calls_frozen = [a for a in frozen if a.kind == "call"]
    numbers = {
        "processes_stopped": stopped,
        "frozen_s": round(t1 - t0, 1),
        "during": caller.summary(frozen),
        "fastest_503_s": round(min((a.seconds for a in calls_frozen), default=0), 3),
        "probes_s": {k: round(v[0], 3) for k, v in probes.items()},
        "connections_closed_at_the_deadline": closed,
        "first_200_after_thaw_s": round(back, 3),
        "ready_after_thaw_s": round(ready, 3),
        "threads": threads,
        "attempts": len(attempts),
    }
    report("postgres frozen", numbers)

    assert _unclean(attempts) == [], _unclean(attempts)[:5]
    # frozen: every call refused at about the deadline (none hung), a report and /readyz too
    assert len(calls_frozen) >= 3 and {a.status for a in calls_frozen} == {503}
    assert all(a.seconds >= DEADLINE_S - 0.1 for a in calls_frozen), calls_frozen
    seconds, status, headers, error = probes["call"]
    assert status == 503 and headers["retry-after"] == "2" and seconds <= CALL_BOUND_S
    assert error["code"] == "store_unavailable", error
    assert f"did not answer within {DEADLINE_S:g} s" in error["message"], error
    seconds, status, retry, error = probes["report"]
    assert (status, retry, error["code"]) == (
        503,
        "2",
        "store_unavailable",
    ) and seconds <= CALL_BOUND_S
    seconds, status, store = probes["readyz"]
    assert status == 503 and store["state"] == "unavailable" and seconds <= CALL_BOUND_S
    assert store["reason"] == f"no answer within {DEADLINE_S:g} s", store
    # the threads that waited were let go: their connections closed at the deadline
    assert closed >= 1
    # thawed: served again with no restart, and nothing acknowledged lost
    assert len([a for a in attempts if a.at > t1 and a.kind == "report" and a.acked]) >= 3
    store_after = open_store(pg.url)
    try:
        assert lost(store_after, "default", caller.acked("call"), caller.acked("report")) == []
    finally:
        store_after.close()
