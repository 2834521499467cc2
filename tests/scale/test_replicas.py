"""The proof that Reef scales out by configuration: every piece a separate process on this machine.

Postgres (a throwaway database) holds records, reports, the release chain and the engine
registry; moto_server is S3 (datasets, release files, MLflow artifacts); `mlflow server` on
SQLite is the tracking server; a Prefect server with a process worker of the `reef` pool runs
the evolve; three `reef serve` replicas on the tiny model embed an engine each, register it in
the database (engine.fleet.registry) and share one admin token.

Steps, under a bounded load spread across the replicas (each call reported through another
replica, with a correction, so the sft recipe has a batch):
1. an evolve run is submitted as two replicas' workers would (the second finds the first's
   run in flight) and the pool worker runs it: it trains and deploys to all three replicas, and
   no record is trained on twice;
2. one replica is SIGKILLed mid-load and restarted: it serves the head at once (catch-up);
3. a rollback is issued through another replica: every replica serves it within the bound;
4. two replicas promote the same held candidate concurrently: exactly one wins, the other gets
   409, and every replica serves the winner within the bound.
Then every acknowledged receipt is read back through a replica other than the one that gave it,
and MLflow's champion alias names the head."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import yaml

from reef.testing.fleet import (
    AUTH,
    Fleet,
    Load,
    LoadGenerator,
    MLflowServer,
    fleet_config,
    until_served,
)
from tests.flows.conftest import _PrefectServer
from tests.flows.test_prefect_deployments import POOL, ROOT, _env, _prefect

pytestmark = [pytest.mark.scale, pytest.mark.postgres, pytest.mark.timeout(480)]

S = "fleet"
BATCH = 8
# A head move made through one replica is served by every replica within this bound: the
# deploy tells every registered engine to serve it; one that missed that call sees the new
# head when its scenario cache (2 s) expires. Measured here: docs/scale.md.
BOUND_S = 5.0


@pytest.fixture
def stack(
    tmp_path: Path,
    make_postgres_database: Callable[[], str],
    s3_endpoint: str,
    s3_bucket: str,
    prefect_server: _PrefectServer,
) -> Iterator[dict[str, Any]]:
    """Everything up at once (the starts overlap): MLflow, the pool's deployments, 3 replicas."""
    database_url = make_postgres_database()
    mlflow = MLflowServer(tmp_path / "mlflow")
    home = tmp_path / "prefect-home"
    config = fleet_config(
        {
            "artifacts": {"url": f"s3://{s3_bucket}/reef", "s3_endpoint_url": s3_endpoint},
            "reef": {"recipe": "sft", "batch_size": BATCH, "params": {"epochs": 1}},
            "gate": {"policy": "always"},
        }
    )
    # Secret settings reach every process through its environment, never a run parameter.
    secrets = {"REEF_STORE__DATABASE_URL": database_url, "REEF_TRACKING__URI": mlflow.url}
    fleet = Fleet(tmp_path / "fleet", 3, config, secrets)

    prefect_api = prefect_server.url

    def deploy_pool() -> None:
        prefect_server.wait()
        env = _env(home, prefect_api)
        _prefect(["work-pool", "create", POOL, "--type", "process"], env, cwd=ROOT)
        _prefect(["deploy", "--all", "--no-prompt"], env, cwd=ROOT, timeout=240)

    try:
        with ThreadPoolExecutor(max_workers=3) as pool:
            started = [pool.submit(f) for f in (mlflow.__enter__, fleet.start, deploy_pool)]
            for f in started:
                f.result()
        yield {
            "fleet": fleet,
            "database_url": database_url,
            "tracking": mlflow.url,
            "config": fleet.config_path,
            "worker_env": {**_env(home, prefect_api), **fleet.env, **secrets},
        }
    finally:
        fleet.stop()
        mlflow.__exit__()


def _head(url: str) -> str:
    r = httpx.get(f"{url}/reef/scenarios/{S}/releases", headers=AUTH, timeout=30)
    r.raise_for_status()
    return str(r.json()["data"][0]["release_id"])


def _evolve_on_the_pool(stack: dict[str, Any]) -> str:
    """Submit an evolve run of the scenario as two replicas' workers would when they both see
    the batch ready (the second finds the first's run in flight), then run the pool's process
    worker until it is done; its log."""
    from reef.flows import worker
    from reef.settings import load_settings

    config = str(stack["config"])
    settings = load_settings(config)
    first = worker.run_once(settings, S, config, {})
    assert first["status"] == "submitted", first
    second = worker.run_once(settings, S, config, {})
    assert second == {"status": "in_flight", "flow_run_id": first["flow_run_id"]}
    log = _prefect(
        ["worker", "start", "--pool", POOL, "--run-once"],
        stack["worker_env"],
        cwd=stack["config"].parent,
        timeout=300,
    )
    (stack["config"].parent / "worker.log").write_text(log)
    assert worker.in_flight_run(S) is None, log[-4000:]
    return log


def _post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, headers=AUTH, timeout=120)


def test_three_replicas_one_database(stack: dict[str, Any]) -> None:
    from reef import registry

    fleet: Fleet = stack["fleet"]
    urls = fleet.urls
    timings: dict[str, float] = {}
    loads = []

    # 1. Load with reports, then an evolve on the pool's worker.
    loads.append(LoadGenerator(urls, S, threads=6, requests=3 * BATCH).start().join())
    base = _head(urls[0])
    started = time.monotonic()
    log = _evolve_on_the_pool(stack)
    timings["evolve (worker start to exit)"] = time.monotonic() - started
    trained = _head(urls[1])
    assert trained != base, f"the evolve published nothing:\n{log[-4000:]}"
    timings["evolve head served everywhere"] = until_served(urls, S, trained, BOUND_S)

    # 2. SIGKILL a replica mid-load; restart it; it serves the head as soon as it is ready.
    gen = LoadGenerator(urls, S, threads=6, requests=60).start()
    gen.wait_for(15)
    fleet.replicas[2].kill()
    timings["restart to ready"] = fleet.restart(2)
    loads.append(gen.join())
    timings["restarted replica serves the head"] = until_served(urls[2:], S, trained, BOUND_S)

    # 3. A rollback through another replica, to the release before the evolve's.
    r = _post(urls[1], f"/reef/scenarios/{S}/rollback", {"release_id": base})
    assert r.status_code == 201, r.text
    rolled = r.json()["release_id"]
    timings["rollback served everywhere"] = until_served(urls, S, rolled, BOUND_S)

    # 4. A harness with a script is held for review; two replicas promote it at once.
    won = _promoted_at_once(urls)
    timings["promote served everywhere"] = until_served(urls, S, won, BOUND_S)

    # Every acknowledged receipt is readable, through a replica other than the one that gave it.
    _receipts_read_elsewhere(urls, loads)
    assert sum(len(load.all_receipts) for load in loads) >= 3 * BATCH

    # No record was trained on twice: one training release, every consumption receipt its own.
    chain, batches = _chain_and_batches(stack["database_url"])
    training = [rid for rid, op in chain if op == "training"]
    assert training == [trained], chain
    assert [b[0] for b in batches] == [trained], batches
    assert batches[0][1] == batches[0][2] >= BATCH

    # MLflow's champion is the head.
    champion = registry.champion(stack["tracking"], S)
    assert champion is not None and champion[1] == won == _head(urls[2])
    _print_numbers(timings, loads)


def _promoted_at_once(urls: list[str]) -> str:
    """A harness with a script, held for review, promoted by two replicas at once: exactly one
    wins (201), the other gets 409; the release that won."""
    files = {"AGENTS.md": "Be brief.", "scripts/setup.sh": "#!/bin/sh\necho ready\n"}
    r = _post(urls[0], f"/reef/scenarios/{S}/harness", {"files": files})
    assert r.status_code == 202, r.text
    held = r.json()["release_id"]
    barrier = threading.Barrier(2)

    def promote(url: str) -> httpx.Response:
        barrier.wait()
        return _post(url, f"/reef/scenarios/{S}/promote", {"release_id": held})

    with ThreadPoolExecutor(max_workers=2) as pool:
        answers = list(pool.map(promote, urls[1:]))
    assert sorted(a.status_code for a in answers) == [201, 409], [a.text for a in answers]
    [won] = [a.json() for a in answers if a.status_code == 201]
    return str(won["release_id"])


def _receipts_read_elsewhere(urls: list[str], loads: list[Load]) -> None:
    """No load was refused, and every receipt it got reads back through the next replica."""
    with httpx.Client(headers=AUTH, timeout=30) as http:
        for load in loads:
            assert not load.refused, load.refused[:5]
            for at, receipts in load.receipts.items():
                other = urls[(at + 1) % len(urls)]
                for rid in receipts:
                    got = http.get(f"{other}/reef/scenarios/{S}/records/{rid}")
                    assert got.status_code == 200, (rid, got.text)


def _chain_and_batches(database_url: str) -> tuple[list[Any], list[Any]]:
    """The scenario's releases (id, operation) and its consumption batches (batch id, receipts,
    distinct records), read from the database."""
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            chain = conn.execute(
                sa.text("SELECT id, operation FROM releases WHERE scenario = :s"), {"s": S}
            ).all()
            batches = conn.execute(
                sa.text(
                    "SELECT batch_id, count(*), count(DISTINCT record_id) FROM consumptions "
                    "WHERE scenario = :s GROUP BY batch_id"
                ),
                {"s": S},
            ).all()
    finally:
        engine.dispose()
    return list(chain), list(batches)


def _print_numbers(timings: dict[str, float], loads: list[Load]) -> None:
    print(  # the numbers docs/scale.md quotes (pytest -s)
        yaml.safe_dump(
            {
                "timings_s": {k: round(v, 2) for k, v in timings.items()},
                "loads": [
                    {
                        "acknowledged": len(load.all_receipts),
                        "reported": len(load.reported),
                        "dropped": load.dropped,
                        "seconds": round(load.seconds, 1),
                    }
                    for load in loads
                ],
            },
            sort_keys=False,
        )
    )
