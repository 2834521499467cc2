"""Store fixtures: records to add, and each noun's store (the `store` fixture itself, on SQLite
and on Postgres, is in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from reef.records import Record, new_id, utcnow
from reef.store.chain import ChainStore, SQLChain
from reef.store.engines import EngineStore, SQLEngines
from reef.store.events import EventStore, SQLEvents
from reef.store.jobs import JobStore, SQLJobs
from reef.store.records import RecordStore, SQLRecords
from reef.store.reports import ReportStore, SQLReports
from reef.store.scenarios import ScenarioStore, SQLScenarios
from reef.store.sessions import SessionStore, SQLSessions
from reef.store.shadows import ShadowStore, SQLShadows
from reef.store.sql import SQLStore


@pytest.fixture
def make_record() -> Callable[..., Record]:
    """Builds a realistic record; keyword arguments override any field."""

    def make(scenario: str, release_id: str, **fields: Any) -> Record:
        created_at: datetime = fields.pop("created_at", utcnow())
        values: dict[str, Any] = {
            "id": new_id("rec"),
            "scenario": scenario,
            "created_at": created_at,
            "route": "chat.completions",
            "model": "smollm2",
            "stream": False,
            "request": {
                "model": "smollm2",
                "messages": [{"role": "user", "content": "Say hi in five words."}],
                "max_tokens": 16,
            },
            "response": {
                "id": "chatcmpl-1",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi!"}}],
            },
            "release_id": release_id,
            "prompt_token_ids": [1, 9468, 314, 2],
            "completion_token_ids": [17, 2],
            "logprobs": [-0.25, -1.5],
            "timings": {"queue_s": 0.001, "total_s": 0.125},
            "tags": {"client": "test"},
        }
        values.update(fields)
        return Record(**values)

    return make


# Each noun's SQL store on its own over the `store` fixture's engine: the contract tests of a
# Protocol run against the class that implements it alone (nothing borrowed from the others),
# while `store` (the composition) sets the scene.
@pytest.fixture
def scenario_store(store: SQLStore) -> ScenarioStore:
    return SQLScenarios(store.engine)


@pytest.fixture
def record_store(store: SQLStore) -> RecordStore:
    return SQLRecords(store.engine)


@pytest.fixture
def session_store(store: SQLStore) -> SessionStore:
    return SQLSessions(store.engine)


@pytest.fixture
def report_store(store: SQLStore) -> ReportStore:
    return SQLReports(store.engine)


@pytest.fixture
def chain_store(store: SQLStore) -> ChainStore:
    return SQLChain(store.engine)


@pytest.fixture
def job_store(store: SQLStore) -> JobStore:
    return SQLJobs(store.engine)


@pytest.fixture
def shadow_store(store: SQLStore) -> ShadowStore:
    return SQLShadows(store.engine)


@pytest.fixture
def engine_store(store: SQLStore) -> EngineStore:
    return SQLEngines(store.engine)


@pytest.fixture
def event_store(store: SQLStore) -> EventStore:
    return SQLEvents(store.engine)
