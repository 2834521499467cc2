"""One log format (reef.logs): `reef serve --log-format json` writes every stderr line as a JSON
object, uvicorn's and Reef's alike, with the scenario, record and request of the call a line was
logged for; no progress bar and no migration chatter in the log of a fresh server; the text
format names the same context."""

from __future__ import annotations

import contextvars
import io
import json
import logging
import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from reef import logs
from reef.store.sql import open_store
from reef.testing.process import REEF, free_port


def test_json_lines_from_every_logger_with_the_calls_context(tmp_path: Path) -> None:
    port = free_port()
    cmd = [REEF, "serve", "--state-dir", str(tmp_path), "--port", str(port), "--model", "tiny"]
    cmd += ["--log-format", "json", "--access-log"]
    env = {**os.environ, "REEF_REEF__AUTO": "false"}
    for name in ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS"):
        env.pop(name, None)  # reef serve decides: stderr here is a file
    with (tmp_path / "stderr.log").open("w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("reef: serving"), (
            tmp_path / "stderr.log"
        ).read_text()
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2,
            },
            headers={"x-reef-scenario": "logs-s", "x-request-id": "req-4711"},
            timeout=60,
        )
        assert r.status_code == 200, r.text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    text = (tmp_path / "stderr.log").read_text()
    assert "\r" not in text  # no progress bar (the model's "Loading weights" draws one)
    lines = [json.loads(line) for line in text.splitlines()]  # every line is JSON
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    assert all(line["time"].endswith("Z") for line in lines)
    loggers = {line["logger"] for line in lines}
    assert {"reef.api", "uvicorn.error", "uvicorn.access"} <= loggers, loggers
    assert not any(name.startswith("alembic") for name in loggers)  # a fresh database: DEBUG
    (access,) = [x for x in lines if "POST /v1/chat/completions" in x["message"]]
    assert access["logger"] == "uvicorn.access" and access["level"] == "INFO"
    assert access["scenario"] == "logs-s"
    assert access["record_id"] == r.headers["x-reef-agent-record-id"]
    assert access["request_id"] == "req-4711"
    started = [x for x in lines if x["message"].startswith("reef ready")]
    assert len(started) == 1 and "scenario" not in started[0] and "request_id" not in started[0]


def test_text_lines_name_the_context_where_known() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.TextFormatter())
    log = logging.getLogger("reef.test-logs")
    log.addHandler(handler)
    log.propagate = False
    try:

        def in_a_call() -> None:
            logs.REQUEST.set({"headers": []})
            logs.for_call("shop", "rec_1")
            log.warning("answered")

        contextvars.copy_context().run(in_a_call)
        log.warning("outside")  # the call's context did not leak here
    finally:
        log.removeHandler(handler)
    inside, outside = out.getvalue().splitlines()
    assert " WARNING reef.test-logs: answered [scenario=shop record_id=rec_1 request_id=" in inside
    assert len(inside.rsplit("request_id=", 1)[1].rstrip("]")) == 16  # made, as none was sent
    assert outside.endswith(" WARNING reef.test-logs: outside")


def test_migrations_log_at_debug(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Other tests in this process may have run a library's own Alembic migrations (MLflow's),
    # whose logging setup leaves alembic's loggers with a level or disabled: start from plain.
    for logger_name in ("alembic", "alembic.runtime.migration", "alembic.runtime.plugins"):
        logger = logging.getLogger(logger_name)
        monkeypatch.setattr(logger, "disabled", False)
        monkeypatch.setattr(logger, "level", logging.NOTSET)
    for level, name in ((logging.INFO, "a"), (logging.DEBUG, "b")):
        caplog.clear()
        with caplog.at_level(level):
            store = open_store(f"sqlite:///{tmp_path / name}.db")
            store.migrate()
            store.close()
        migrations = [r for r in caplog.records if r.name.startswith("alembic")]
        if level == logging.INFO:
            assert migrations == []
        else:
            assert len(migrations) > 10 and {r.levelname for r in migrations} == {"DEBUG"}
            assert any("Running upgrade" in r.getMessage() for r in migrations)


def test_progress_bars_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("sys.stderr", io.StringIO())  # not a terminal
    logs.quiet_progress_bars()
    assert os.environ["TQDM_DISABLE"] == "1" and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
