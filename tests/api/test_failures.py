"""Failures are named, fast: /readyz reports each dependency (503 when one needed to serve is
down, 200 "degraded" when one needed only to learn is), and a `reef serve` that cannot start
says why in one line and exits non-zero, never a traceback, never "serving on".

Real components at real addresses: MLflow and S3 at a port nothing listens on, Postgres behind
a TCP relay the test cuts, `reef serve` as a subprocess."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from reef.cli.testing import InProcessReef
from reef.testing.process import REEF, free_port
from tests.reefserver import EchoUpstream, Relay

CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_learning_dependencies_down_degrade_but_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed = free_port()  # nothing listens there
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "reef-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "reef-test")
    with (
        EchoUpstream() as echo,
        InProcessReef(
            tmp_path,
            engine={"kind": "upstream", "upstream": {"url": echo.base_url}},
            tracking={"uri": f"http://127.0.0.1:{closed}"},
            artifacts={
                "url": "s3://reef-bucket/reef",
                "s3_endpoint_url": f"http://127.0.0.1:{closed}",
                "s3_region": "us-east-1",
            },
        ) as server,
    ):
        t0 = time.monotonic()
        r = httpx.get(f"{server.url}/readyz", timeout=10)
        assert time.monotonic() - t0 < 3.0
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == "degraded"
        states = {k: (v["state"], v["needed_to"]) for k, v in body["dependencies"].items()}
        assert states == {
            "store": ("ok", "serve"),
            "engine": ("ok", "serve"),
            "artifact_store": ("unavailable", "learn"),
            "mlflow": ("unavailable", "learn"),
            "worker": ("off", "learn"),
        }
        assert str(closed) not in r.text  # the open route names no internal address
        # still serving and recording
        r = httpx.post(f"{server.base_url}/chat/completions", json=CHAT)
        assert r.status_code == 200 and r.headers["x-reef-agent-record-id"]
        log = server.log()
        assert "readiness: mlflow is unavailable" in log
        assert "readiness: artifact_store is unavailable" in log


@pytest.mark.postgres
def test_store_gone_is_not_ready(tmp_path: Path, make_postgres_database: Callable[[], str]) -> None:
    from sqlalchemy.engine import make_url

    url = make_url(make_postgres_database())
    relay = Relay((url.host or "127.0.0.1", url.port or 5432))
    through = url.set(host="127.0.0.1", port=relay.port).render_as_string(hide_password=False)
    with (
        EchoUpstream() as echo,
        InProcessReef(
            tmp_path,
            engine={"kind": "upstream", "upstream": {"url": echo.base_url}},
            store={"database_url": through},
        ) as server,
    ):
        assert httpx.get(f"{server.url}/readyz").json()["status"] == "ready"
        relay.cut()
        r = httpx.get(f"{server.url}/readyz", timeout=10)
        assert r.status_code == 503
        assert r.json()["status"] == "not_ready"
        assert r.json()["dependencies"]["store"] == {"state": "unavailable", "needed_to": "serve"}
        assert r.json()["dependencies"]["engine"]["state"] == "ok"
        # A call whose record cannot be written is refused, and the refusal names nothing of
        # the database (the driver's message has its host, port, user and database): the
        # server's log has it.
        for body in (CHAT, {**CHAT, "stream": True}):
            r = httpx.post(f"{server.base_url}/chat/completions", json=body)
            assert r.status_code == 503 and r.headers["retry-after"] == "2", r.text
            error = r.json()["error"]
            assert error["code"] == "store_unavailable"
            assert error["message"] == "the record store is unavailable; retry after 2 s"
            for secret in (str(relay.port), url.database, url.username, "127.0.0.1"):
                assert secret and secret not in r.text, (secret, r.text)
        assert f"port {relay.port} failed" in server.log()


def _serve(tmp: Path, *args: str, port: int | None = None) -> subprocess.Popen[str]:
    """`reef serve` without an evolve worker; stdout a pipe, stderr the file tmp/stderr.log
    (read it with `_stderr`)."""
    tmp.mkdir(parents=True, exist_ok=True)
    cmd = [REEF, "serve", "--state-dir", str(tmp), "--port", str(port or free_port()), *args]
    env = {**os.environ, "REEF_REEF__AUTO": "false"}
    with (tmp / "stderr.log").open("w") as err:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)


def _stderr(tmp: Path) -> str:
    return (tmp / "stderr.log").read_text()


def test_failed_starts_are_one_line_and_non_zero(tmp_path: Path) -> None:
    closed = free_port()
    busy = socket.create_server(("127.0.0.1", 0))
    taken = busy.getsockname()[1]
    upstream = ("--engine", "upstream", "--upstream-url", f"http://127.0.0.1:{closed}/v1")
    postgres = f"postgresql+psycopg://reef@127.0.0.1:{closed}/reef"
    cases = {  # what is wrong: (arguments, port, how the one line starts)
        "postgres down": (
            (*upstream, "--database-url", postgres),
            None,
            "reef: cannot start: database error while migrating the schema",
        ),
        "upstream down": (
            upstream,
            None,
            f"reef: cannot start: upstream http://127.0.0.1:{closed}/v1 unreachable",
        ),
        "port taken": (upstream, taken, f"reef: cannot listen on 127.0.0.1:{taken}"),
    }
    try:  # all at once: each is mostly Python importing the app
        procs = {
            what: _serve(tmp_path / what.replace(" ", "-"), *args, port=port)
            for what, (args, port, _) in cases.items()
        }
        for what, proc in procs.items():
            out, _ = proc.communicate(timeout=240)
            err = _stderr(tmp_path / what.replace(" ", "-"))
            assert proc.returncode == 1, (what, out, err)
            assert "Traceback" not in err and "serving" not in out, (what, out, err)
            said = [line for line in err.splitlines() if line.startswith("reef:")]
            assert len(said) == 1 and said[0].startswith(cases[what][2]), (what, err)
            assert err.splitlines()[-1] == said[0]
    finally:
        busy.close()


def test_serving_on_is_said_once_ready(tmp_path: Path) -> None:
    with EchoUpstream() as echo:
        proc = _serve(tmp_path, "--engine", "upstream", "--upstream-url", echo.base_url)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.startswith("reef: serving upstream engine on http://127.0.0.1:"), line
            url = line.split(" on ", 1)[1].split("/v1", 1)[0]
            # the moment it says so, it answers and is ready
            assert httpx.get(f"{url}/readyz").status_code == 200
        finally:
            proc.terminate()
            # uvicorn shuts down, then raises the signal again (its exit status is SIGTERM's)
            assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
            log = _stderr(tmp_path)
            assert "reef ready" in log and "reef stopped" in log, log
