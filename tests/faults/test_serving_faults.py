"""Faults under the serving path, each injected into running processes while a client (the
official openai SDK) calls: the upstream engine answering 500, too slow, dropping a stream,
gone and back; Postgres unreachable for a replica (a TCP relay in front of the machine's
server, cut and restored: the server itself is shared and never touched); the API process
SIGKILLed in the middle of a stream and started again. Each checks what the user sees (a
clean, fast error: never a hang), that every acknowledged call has its record, and how long
the system takes to serve again on its own. The measured numbers are printed (JSON) for
docs/reliability.md."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy.engine import make_url

from reef.store.sql import open_store
from reef.testing.process import ReefServer, free_port
from tests.faults.invariants import measured as report
from tests.reefserver import EchoUpstream, Relay, wait_for

HI = [{"role": "user", "content": "hi there"}]


def _client(srv: ReefServer, timeout: float = 10.0) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0, timeout=timeout)


def _call(client: openai.OpenAI, **extra: Any) -> tuple[int, float, str | None, Any]:
    """One chat call: its status, seconds, receipt (on 200) and the response or error."""
    started = time.monotonic()
    try:
        raw = client.chat.completions.with_raw_response.create(
            model="echo", messages=HI, max_tokens=4, **extra
        )
        return 200, time.monotonic() - started, raw.headers["x-reef-agent-record-id"], raw
    except openai.APIStatusError as e:
        return e.status_code, time.monotonic() - started, None, e
    except openai.APIConnectionError as e:
        return 0, time.monotonic() - started, None, e


def _stored(url: str, scenario: str = "default") -> set[str]:
    store = open_store(url)
    try:
        return {r.id for r in store.list_records(scenario, limit=100_000)}
    finally:
        store.close()


def _until_served(client: openai.OpenAI, limit_s: float) -> tuple[float, str]:
    """Seconds until a call is answered 200 again, and its receipt."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        status, _, receipt, _ = _call(client)
        if status == 200 and receipt:
            return time.monotonic() - started, receipt
        time.sleep(0.1)
    raise AssertionError(f"not served again within {limit_s} s")


@pytest.mark.faults
def test_upstream_failing_slow_dropping_and_gone(tmp_path: Path) -> None:
    port = free_port()
    env = {"REEF_ENGINE__UPSTREAM__TIMEOUT_S": "2"}
    measured: dict[str, Any] = {}
    receipts: list[str] = []
    echo = EchoUpstream("--port", str(port)).__enter__()
    try:
        args = ("--engine", "upstream", "--upstream-url", echo.base_url)
        with ReefServer(tmp_path / "state", *args, env=env) as srv:
            client = _client(srv)
            cases = {
                "500": {"status": 500, "message": "the GPU fell over"},
                "slow": {"delay_s": 5},
            }
            for name, steer in cases.items():
                status, seconds, _, err = _call(client, extra_body={"echo_upstream": steer})
                measured[name] = {"status": status, "seconds": round(seconds, 2)}
                assert status == 502, err
                assert seconds < {"500": 1.0, "slow": 4.0}[name], seconds
                status, _, receipt, _ = _call(client)  # the next call is served
                assert status == 200 and receipt
                receipts.append(receipt)

            # a stream the upstream drops after two chunks: the client's stream ends in an
            # error event or a cut, never a hang; the call is not recorded as an answer
            started, error = time.monotonic(), None
            got: list[str | None] = []
            try:
                stream = client.chat.completions.create(
                    model="echo",
                    messages=[{"role": "user", "content": "one two three four five six"}],
                    stream=True,
                    extra_body={"echo_upstream": {"die_after": 2, "chunk_delay_s": 0.05}},
                )
                for c in stream:
                    got += [c.choices[0].delta.content] if c.choices else []
            except (openai.APIError, httpx.HTTPError) as e:
                error = type(e).__name__
            measured["stream dropped"] = {
                "chunks": len(got),
                "error": error,
                "seconds": round(time.monotonic() - started, 2),
            }
            assert error is not None and time.monotonic() - started < 5

            # the upstream process gone, then back on its port
            echo.__exit__()
            status, seconds, _, err = _call(client)
            measured["upstream down"] = {"status": status, "seconds": round(seconds, 2)}
            assert status == 502 and seconds < 2, err
            ready = httpx.get(f"{srv.url}/readyz", timeout=10)
            assert ready.status_code == 503, ready.text
            echo = EchoUpstream("--port", str(port)).__enter__()
            back, receipt = _until_served(client, 30)
            receipts.append(receipt)
            measured["upstream back: first 200 after s"] = round(back, 2)
            url = f"sqlite:///{srv.state_dir / 'reef.db'}"
            assert set(receipts) <= _stored(url)
            assert "the GPU fell over" in srv.log()
    finally:
        echo.__exit__()
    report("upstream", measured)


@pytest.mark.faults
@pytest.mark.postgres
def test_postgres_unreachable_for_a_replica(
    tmp_path: Path, make_postgres_database: Callable[[], str]
) -> None:
    direct = make_url(make_postgres_database())
    relay = Relay((direct.host or "127.0.0.1", direct.port or 5432))
    through = direct.set(host="127.0.0.1", port=relay.port).render_as_string(hide_password=False)
    measured: dict[str, Any] = {}
    with (
        EchoUpstream() as echo,
        ReefServer(
            tmp_path / "state",
            *("--engine", "upstream", "--upstream-url", echo.base_url),
            *("--database-url", through),
        ) as srv,
    ):
        client = _client(srv)
        acked = [r for s, _, r, _ in (_call(client) for _ in range(5)) if s == 200 and r]
        assert len(acked) == 5
        relay.cut()
        during = [_call(client) for _ in range(10)]
        statuses = {s for s, *_ in during}
        slowest = max(sec for _, sec, *_ in during)
        retry_after = {e.response.headers.get("retry-after") for s, _, _, e in during if s == 503}
        measured["down"] = {
            "statuses": sorted(statuses),
            "slowest_s": round(slowest, 3),
            "retry_after": sorted(retry_after),
        }
        assert statuses == {503} and slowest < 5 and retry_after == {"2"}
        ready = httpx.get(f"{srv.url}/readyz", timeout=10)
        assert ready.status_code == 503 and ready.json()["dependencies"]["store"]["state"] == (
            "unavailable"
        )
        relay.restore()
        back, receipt = _until_served(client, 30)
        acked.append(receipt)
        measured["back: first 200 after s"] = round(back, 3)
        wait_for(
            "ready again",
            lambda: httpx.get(f"{srv.url}/readyz", timeout=10).status_code == 200,
            srv,
            30,
        )
    missing = set(acked) - _stored(direct.render_as_string(hide_password=False))
    assert missing == set()
    report("postgres cut", measured)


@pytest.mark.faults
def test_api_killed_during_a_stream(tmp_path: Path) -> None:
    measured: dict[str, Any] = {}
    words = " ".join(f"w{i}" for i in range(40))
    with EchoUpstream() as echo:
        args = ("--engine", "upstream", "--upstream-url", echo.base_url)
        srv = ReefServer(tmp_path / "state", *args).start()
        try:
            client = _client(srv, timeout=30)
            acked = [r for s, _, r, _ in (_call(client) for _ in range(5)) if s == 200 and r]
            raw = client.chat.completions.with_raw_response.create(
                model="echo",
                messages=[{"role": "user", "content": words}],
                stream=True,
                extra_body={"echo_upstream": {"chunk_delay_s": 0.1}},
            )
            cut_receipt = raw.headers["x-reef-agent-record-id"]
            got, error, started = 0, None, time.monotonic()
            try:
                for _chunk in raw.parse():
                    got += 1
                    if got == 3:
                        killed = time.monotonic()
                        srv.kill()
            except (openai.APIError, httpx.HTTPError) as e:
                error = type(e).__name__
            measured["client"] = {
                "chunks": got,
                "error": error,
                "ended_after_kill_s": round(time.monotonic() - killed, 3),
            }
            assert got >= 3 and error is not None
            assert time.monotonic() - started < 10
        finally:
            srv.kill()
        restarted = ReefServer(tmp_path / "state", *args, port=srv.port)
        t = time.monotonic()
        with restarted:
            measured["restart_to_ready_s"] = round(time.monotonic() - t, 2)
            status, _, receipt, _ = _call(_client(restarted))
            assert status == 200 and receipt
            stored = _stored(f"sqlite:///{restarted.state_dir / 'reef.db'}")
    assert set(acked) <= stored
    measured["cut stream's receipt stored"] = cut_receipt in stored
    report("api killed mid-stream", measured)
