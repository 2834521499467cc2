"""Secrets stay secret: with a password-bearing Postgres URL (given as `--database-url`) and an
upstream API key configured, neither the password nor the key shows in the evolve worker's
argv, the Prefect flow runs' parameters (a local run and a submitted deployment run), the
database's rows, the MLflow runs' params and tags (and the registered version's), or the log
output of a whole evolve run on the tiny model."""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from sqlalchemy.engine import make_url

from reef.api.evolver import Evolver
from reef.cli.main import main as reef_cli
from reef.cli.testing import InProcessReef
from reef.flows.worker import run_once
from reef.settings import load_settings
from reef.testing.traffic import traffic
from tests.conftest import POSTGRES_ADMIN_URL

pytestmark = [pytest.mark.loop, pytest.mark.postgres, pytest.mark.timeout(600)]

PASSWORD = f"pw{uuid.uuid4().hex}"
KEY = f"sk-upstream-{uuid.uuid4().hex}"
S = "secrets"


@pytest.fixture
def secret_url(make_postgres_database: Any) -> Iterator[str]:
    """A fresh database owned by a role that logs in with a password (trust auth on loopback
    lets it in anyway: what matters is that the URL carries the password)."""
    role = f"reef_secret_{uuid.uuid4().hex[:8]}"
    db = make_url(make_postgres_database()).database
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{PASSWORD}'")
        admin.execute(f'ALTER DATABASE "{db}" OWNER TO {role}')
    try:
        yield f"postgresql+psycopg://{role}:{PASSWORD}@127.0.0.1:5432/{db}"
    finally:
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            admin.execute(f"DROP ROLE IF EXISTS {role}")


def _leaks(where: str, text: str) -> list[str]:
    return [f"{what} in {where}" for what, s in (("password", PASSWORD), ("key", KEY)) if s in text]


def _worker_argv(url: str, state: Path) -> tuple[str, str]:
    """The argv and environment of the worker `reef serve --database-url URL` starts."""
    evolver = Evolver(None, {"store": {"database_url": url}}, state_dir=state)
    evolver.start()
    proc = evolver._proc
    assert proc is not None
    try:
        argv, deadline = "", time.monotonic() + 30
        while not argv and time.monotonic() < deadline:  # empty until the exec has happened
            argv = Path(f"/proc/{proc.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            time.sleep(0.05)
        env = Path(f"/proc/{proc.pid}/environ").read_bytes().decode(errors="replace")
    finally:
        evolver.stop(timeout_s=60)
    assert "reef.cli.worker" in argv
    return argv, env


def _flow_runs_parameters() -> list[dict[str, Any]]:
    from prefect import get_client

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs()
    return [r.parameters for r in runs if r.parameters.get("scenario") == S]


def _submitted_parameters(settings: Any, url: str) -> dict[str, Any]:
    """Submit a deployment run as the worker does with a Prefect server (no worker runs it)."""
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_deployment_by_name("evolve/evolve")
        except ObjectNotFound:
            flow_id = client.create_flow_from_name("evolve")
            client.create_deployment(
                flow_id=flow_id, name="evolve", entrypoint="flows/evolve.py:evolve"
            )
        result = run_once(settings, S, None, {"store": {"database_url": url}})
        run = client.read_flow_run(result["flow_run_id"])
        client.delete_flow_run(run.id)  # nobody is to run it
    return dict(run.parameters)


def _rows(url: str) -> str:
    admin = make_url(POSTGRES_ADMIN_URL).set(database=make_url(url).database)
    with psycopg.connect(admin.render_as_string(hide_password=False)) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            ).fetchall()
        ]
        return "\n".join(
            str(row[0])
            for t in tables
            for row in conn.execute(f'SELECT row_to_json(t)::text FROM "{t}" t').fetchall()
        )


def _mlflow(tracking_uri: str) -> str:
    from mlflow import MlflowClient
    from mlflow.entities import ViewType

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(f"reef/{S}")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id], run_view_type=ViewType.ALL)
    assert runs and any(r.data.params.get("recipe") == "sft" for r in runs)
    seen: list[Any] = [[r.data.params, r.data.tags] for r in runs]
    seen += [[v.tags, v.description] for v in client.search_model_versions(f"name='reef-{S}'")]
    seen += [[m.params, m.tags] for m in client.search_logged_models([exp.experiment_id])]
    return json.dumps(seen, default=str)


def test_no_secret_leaves_the_settings(
    secret_url: str,
    tmp_path: Path,
    prefect_server: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    from prefect.settings import PREFECT_API_URL

    caplog.set_level(logging.INFO)
    monkeypatch.setenv("REEF_ENGINE__UPSTREAM__API_KEY", KEY)
    # the worker below talks to the session's Prefect server (no temporary one to start)
    monkeypatch.setenv("PREFECT_API_URL", str(PREFECT_API_URL.value()))
    state = tmp_path / "state"
    config = tmp_path / "cfg.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "engine": {"model": "tiny"},
                "reef": {"recipe": "sft", "batch_size": 4, "params": {"epochs": 1}},
                "gate": {"policy": "always"},
            }
        )
    )
    leaks: list[str] = []

    argv, env = _worker_argv(secret_url, state)
    leaks += _leaks("the worker's argv", argv)

    with InProcessReef(state, config=config, store={"database_url": secret_url}) as srv:
        assert srv.settings.engine.upstream.api_key.get_secret_value() == KEY
        traffic(srv, S, 4, prompt="q{i}", report=lambda i, rid: {"score": 1.0}, max_tokens=3)
        common = ["-c", str(config), "--state-dir", str(state), "--port", str(srv.port)]
        # `reef evolve --database-url ... --force`: the flow runs in this process
        assert (
            reef_cli(["evolve", *common, "--database-url", secret_url, "--scenario", S, "--force"])
            == 0
        )
        settings = load_settings(config, server={"state_dir": str(state)})
        submitted = _submitted_parameters(settings, secret_url)
        srv_log = srv.log()

    params = _flow_runs_parameters()
    leaks += _leaks("Prefect flow-run parameters", json.dumps([*params, submitted]))
    leaks += _leaks("the database", _rows(secret_url))
    leaks += _leaks("MLflow", _mlflow(f"sqlite:///{state / 'mlflow.db'}"))
    out, err = capfd.readouterr()
    leaks += _leaks("the log output", "\n".join([caplog.text, srv_log, out, err]))
    assert leaks == []

    # ... and yet they reached where they are used: the worker by its environment, the local
    # flow run (which trained and published) as values Prefect shows masked
    assert f"REEF_STORE__DATABASE_URL={secret_url}" in env
    assert '"status": "published"' in out
    assert params and all(p["overrides"]["store"]["database_url"] == "**********" for p in params)
    assert submitted["overrides"] == {} and submitted["scenario"] == S
    assert os.environ.get("REEF_STORE__DATABASE_URL") is None
