"""One Reef app on the tiny model, served in-process over real HTTP, for the API tests; each
test uses its own scenario."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from reef.cli.testing import InProcessReef
from reef.store.sql import open_store
from reef.testing.process import ReefServer


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The schemathesis run (marker contract) builds a test per operation of the spec when it is
    collected (~4 s): not in runs that deselect it anyway (the default suite)."""
    if collection_path.name == "test_conformance.py" and "not contract" in config.option.markexpr:
        return True
    return None


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    state = tmp_path_factory.mktemp("reef-api")
    config = state / "serve.yaml"
    config.write_text(
        "server:\n  max_body_bytes: 65536\n  max_tokens_cap: 512\n  metrics_scenario_labels: true\n"
        "engine:\n  default_max_tokens: 16\n"
    )
    with InProcessReef(state, config=config) as srv:
        yield srv


@pytest.fixture
def scenario() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def headers(scenario: str) -> dict[str, str]:
    return {"x-reef-scenario": scenario}


def records_of(server: InProcessReef | ReefServer, scenario: str) -> list[dict]:
    import httpx

    r = httpx.get(f"{server.url}/reef/scenarios/{scenario}/records", params={"limit": 1000})
    if r.status_code == 404:
        return []
    r.raise_for_status()
    return r.json()["data"]


@pytest.fixture
def state_dir(server: InProcessReef) -> Path:
    return server.state_dir


def wait_cleaned(server: InProcessReef, scenario: str, timeout_s: float = 120.0) -> None:
    """Until a deleted scenario's background clean-up is done: its tombstone is dropped."""
    store = open_store(server.settings.database_url)
    try:
        deadline = time.monotonic() + timeout_s
        while any(d.scenario == scenario for d in store.pending_deletions()):
            assert time.monotonic() < deadline, (
                f"{scenario} not cleaned up:\n{server.log()[-3000:]}"
            )
            time.sleep(0.05)
    finally:
        store.close()
