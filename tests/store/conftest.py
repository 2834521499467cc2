"""Store fixtures: every contract test runs once on SQLite and once on Postgres."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

from reef.records import Record, new_id, utcnow
from reef.store.sql import SQLStore, open_store


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database: a fresh SQLite file, or the session's Postgres database wiped after."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'state' / 'reef.db'}"
        return
    url: str = request.getfixturevalue("postgres_url")
    yield url
    plain = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute(
            "DROP TABLE IF EXISTS consumptions, records, reports, releases, scenarios, "
            "alembic_version CASCADE"
        )


@pytest.fixture
def store(database_url: str) -> Iterator[SQLStore]:
    s = open_store(database_url)
    s.migrate()
    try:
        yield s
    finally:
        s.close()


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
