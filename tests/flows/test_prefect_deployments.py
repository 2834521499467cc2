"""prefect.yaml against a real Prefect server: `prefect work-pool create` + `prefect deploy --all`
from the repository root create the four deployments, `flows.worker.run_once` submits a run of
evolve/evolve with its parameters when PREFECT_API_URL is set, and a process worker of the pool
runs it from the recorded checkout.

The server is the session's Prefect test server, a subprocess with a loopback URL: the `prefect`
CLI and the worker are separate processes that reach it by that URL. Everything Prefect keeps
lives under a temporary PREFECT_HOME; ~/.prefect is never read."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PREFECT = Path(sys.executable).with_name("prefect")
POOL = "reef"
SCENARIO = "deployed"

pytestmark = pytest.mark.timeout(240)


def _env(home: Path, api_url: str | None = None) -> dict[str, str]:
    """The environment of a `prefect` subprocess: no inherited PREFECT_* / REEF_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "REEF_"))}
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_UI_ENABLED="false",
        PYTHONUNBUFFERED="1",
    )
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


def _prefect(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 120) -> str:
    """Run the `prefect` CLI; fail the test with its output when it fails."""
    p = subprocess.run(
        [str(PREFECT), *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"prefect {' '.join(args)} exited {p.returncode}:\n{out[-4000:]}"
    return out


@pytest.fixture(scope="module")
def server(prefect_server: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The session's Prefect server (tests/flows/conftest.py), reached by its URL; the `prefect`
    CLI and the worker keep what they write under their own temporary PREFECT_HOME."""
    from prefect.settings import PREFECT_API_URL

    tmp = tmp_path_factory.mktemp("prefect-deploy")
    return {"url": PREFECT_API_URL.value(), "home": tmp / "home", "tmp": tmp}


@pytest.fixture(scope="module")
def api(server: dict[str, Any]) -> str:
    """The API this process's Prefect client talks to: the same server."""
    return str(server["url"])


@pytest.fixture(scope="module")
def deployed(server: dict[str, Any]) -> str:
    """The README's steps, by the CLI, from the repository root."""
    env = _env(server["home"], server["url"])
    _prefect(["work-pool", "create", POOL, "--type", "process"], env, cwd=ROOT)
    return _prefect(["deploy", "--all", "--no-prompt"], env, cwd=ROOT)


def _read(coro_fn: Any) -> Any:
    """Run `coro_fn(client)` against the configured API with a fresh client."""
    from prefect.client.orchestration import get_client

    async def main() -> Any:
        async with get_client() as client:
            return await coro_fn(client)

    return asyncio.run(main())


def test_prefect_yaml_declares_the_deployments() -> None:
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    names = {d["name"]: d for d in spec["deployments"]}
    assert set(names) == {"evolve", "evolve-hourly", "materialize-experience", "instruct"}
    assert all(d["work_pool"]["name"] == POOL for d in names.values())
    assert names["evolve"]["entrypoint"] == names["evolve-hourly"]["entrypoint"]


# The two below start a `prefect deploy --all` and a pool worker process (~1-2 min together):
# they run with the learning loops (make test-loop), the static check above in the fast suite.
@pytest.mark.loop
def test_deploy_all_creates_the_deployments(deployed: str, api: str) -> None:
    async def read(client: Any) -> dict[str, Any]:
        return {
            name: await client.read_deployment_by_name(name)
            for name in (
                "evolve/evolve",
                "evolve/evolve-hourly",
                "materialize-experience/materialize-experience",
                "instruct/instruct",
            )
        }

    deps = _read(read)
    for name, d in deps.items():
        assert d.work_pool_name == POOL, name
        # no pull steps in prefect.yaml: `prefect deploy` records the directory it ran in
        assert d.pull_steps == [
            {"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}
        ], name
        assert (ROOT / d.entrypoint.split(":")[0]).is_file(), name
    evolve, hourly = deps["evolve/evolve"], deps["evolve/evolve-hourly"]
    assert evolve.entrypoint == hourly.entrypoint == "flows/evolve.py:evolve"
    assert evolve.parameters == {"scenario": "default"}
    assert evolve.schedules == []
    [schedule] = hourly.schedules
    assert schedule.active is False
    assert schedule.schedule.interval.total_seconds() == 3600
    assert deps["materialize-experience/materialize-experience"].entrypoint == (
        "flows/experience.py:materialize_experience"
    )
    assert deps["instruct/instruct"].entrypoint == "flows/instruct.py:instruct"


@pytest.mark.loop
def test_run_once_submits_and_a_pool_worker_runs_it(
    deployed: str, api: str, server: dict[str, Any]
) -> None:
    from prefect.client.schemas.objects import StateType

    from reef.flows import worker
    from reef.settings import load_settings
    from reef.store.sql import open_store

    tmp: Path = server["tmp"]
    model = tmp / "model"  # the flow only resolves the base model before "not_ready"
    model.mkdir()
    (model / "config.json").write_text("{}")
    config = tmp / "reef.yaml"
    config.write_text(
        yaml.safe_dump(
            {"server": {"state_dir": str(tmp / "state")}, "engine": {"model": str(model)}}
        )
    )
    overrides = {"reef": {"batch_size": 7}}
    settings = load_settings(config, **overrides)
    store = open_store(settings.database_url)
    store.migrate()
    store.close()

    assert worker.prefect_server() == api
    out = worker.run_once(settings, SCENARIO, str(config), overrides)

    assert out["status"] == "submitted"
    # Another replica's worker that sees the same batch ready finds the run in flight.
    again = worker.run_once(settings, SCENARIO, str(config), overrides)
    assert again == {"status": "in_flight", "flow_run_id": out["flow_run_id"]}

    async def read_run(client: Any) -> tuple[Any, str]:
        run = await client.read_flow_run(out["flow_run_id"])
        dep = await client.read_deployment(run.deployment_id)
        flow = await client.read_flow(dep.flow_id)
        return run, f"{flow.name}/{dep.name}"

    run, deployment = _read(read_run)
    assert deployment == worker.DEPLOYMENT == "evolve/evolve"
    assert run.parameters == {"scenario": SCENARIO, "config": str(config), "overrides": overrides}
    assert run.work_pool_name == POOL
    assert run.state.type == StateType.SCHEDULED

    # A process worker of the pool, started elsewhere, finds flows/evolve.py through the
    # deployment's working directory and runs the flow with those parameters.
    elsewhere = tmp / "worker-cwd"
    elsewhere.mkdir()
    logs = _prefect(
        ["worker", "start", "--pool", POOL, "--run-once"],
        _env(server["home"], server["url"]),
        cwd=elsewhere,
    )
    run, _ = _read(read_run)
    assert run.state.type == StateType.COMPLETED, f"{run.state}\n{logs[-4000:]}"
    assert f"{SCENARIO}: 0 eligible samples of 7 needed" in logs
    assert worker.in_flight_run(SCENARIO) is None  # done: the next ready batch gets a run
