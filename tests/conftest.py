"""Shared test fixtures: throwaway PostgreSQL databases, and a migrated store on each backend."""

from __future__ import annotations

import gc
import os
import queue
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from reef.store.sql import SQLStore, open_store

# The project machines run PostgreSQL on loopback with trust auth; override for elsewhere.
POSTGRES_ADMIN_URL = os.environ.get(
    "REEF_TEST_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/postgres"
)

# The evolve workers the tests start run at the server's priority: `reef.worker_priority: idle`
# (the default) yields to every other process, and here the other processes are the suite's
# own (two test processes and their servers on two cores), which would starve the worker of the
# loop under test for minutes. tests/cli/test_worker_priority.py sets each priority itself.
os.environ.setdefault("REEF_REEF__WORKER_PRIORITY", "normal")


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collecting imported (torch, transformers, peft, the app) lives as long as the test
    process: move it out of the garbage collector's sight, as `reef serve` does once it has
    loaded (api/app.py). Measured: each full collection scanned it for ~0.3 s."""
    gc.freeze()


class _Databases:
    """Creates throwaway PostgreSQL databases and drops them in a thread of its own: a DROP
    DATABASE waits for a checkpoint (0.1-0.6 s here), time no test needs to wait for."""

    def __init__(self, admin: psycopg.Connection) -> None:
        self.admin = admin
        self.made: list[str] = []
        self.doomed: queue.Queue[str | None] = queue.Queue()
        self.dropper = threading.Thread(target=self._drop, name="drop-databases", daemon=True)
        self.dropper.start()

    def make(self) -> str:
        name = f"reef_test_{uuid.uuid4().hex[:12]}"
        self.admin.execute(f'CREATE DATABASE "{name}"')
        self.made.append(name)
        url = make_url(POSTGRES_ADMIN_URL).set(drivername="postgresql+psycopg", database=name)
        return url.render_as_string(hide_password=False)

    def drop_later(self, url: str) -> None:
        name = make_url(url).database
        if name in self.made:
            self.made.remove(name)
            self.doomed.put(name)

    def _drop(self) -> None:
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
            while (name := self.doomed.get()) is not None:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def close(self) -> None:
        for name in self.made:
            self.doomed.put(name)
        self.doomed.put(None)
        self.dropper.join()
        self.admin.close()


@pytest.fixture(scope="session")
def postgres_databases() -> Iterator[_Databases]:
    try:
        admin = psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as e:
        pytest.skip(f"PostgreSQL is not reachable at {POSTGRES_ADMIN_URL}: {e}")
    databases = _Databases(admin)
    try:
        yield databases
    finally:
        databases.close()


@pytest.fixture(scope="session")
def make_postgres_database(postgres_databases: _Databases) -> Callable[[], str]:
    """A factory: each call creates a fresh database and returns its SQLAlchemy URL.

    Every database it made is dropped by the end of the session.
    """
    return postgres_databases.make


@pytest.fixture(scope="session")
def postgres_url(make_postgres_database: Callable[[], str]) -> str:
    """One database for the session (tests that share it clean up after themselves)."""
    return make_postgres_database()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database: a fresh SQLite file, or a fresh Postgres database (dropped once the
    test is done). Tests taking it run once per backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'state' / 'reef.db'}"
        return
    databases: _Databases = request.getfixturevalue("postgres_databases")
    url = databases.make()
    yield url
    databases.drop_later(url)


@pytest.fixture
def twin_database_url(
    database_url: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[str]:
    """Another empty database on the same backend as `database_url`."""
    if database_url.startswith("sqlite"):
        yield f"sqlite:///{tmp_path / 'twin.db'}"
        return
    databases: _Databases = request.getfixturevalue("postgres_databases")
    url = databases.make()
    yield url
    databases.drop_later(url)


@pytest.fixture
def store(database_url: str) -> Iterator[SQLStore]:
    """A migrated store on `database_url`."""
    s = open_store(database_url)
    s.migrate()
    try:
        yield s
    finally:
        s.close()
