"""Shared test fixtures: throwaway PostgreSQL databases, and a migrated store on each backend."""

from __future__ import annotations

import os
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


@pytest.fixture(scope="session")
def make_postgres_database() -> Iterator[Callable[[], str]]:
    """A factory: each call creates a fresh database and returns its SQLAlchemy URL.

    Every database it made is dropped at the end of the session.
    """
    try:
        admin = psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as e:
        pytest.skip(f"PostgreSQL is not reachable at {POSTGRES_ADMIN_URL}: {e}")
    made: list[str] = []

    def make() -> str:
        name = f"reef_test_{uuid.uuid4().hex[:12]}"
        admin.execute(f'CREATE DATABASE "{name}"')
        made.append(name)
        url = make_url(POSTGRES_ADMIN_URL).set(drivername="postgresql+psycopg", database=name)
        return url.render_as_string(hide_password=False)

    try:
        yield make
    finally:
        for name in made:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture(scope="session")
def postgres_url(make_postgres_database: Callable[[], str]) -> str:
    """One database for the session (tests that share it clean up after themselves)."""
    return make_postgres_database()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database: a fresh SQLite file, or a fresh Postgres database (dropped at the
    end of the session). Tests taking it run once per backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state' / 'reef.db'}"
    make: Callable[[], str] = request.getfixturevalue("make_postgres_database")
    return make()


@pytest.fixture
def store(database_url: str) -> Iterator[SQLStore]:
    """A migrated store on `database_url`."""
    s = open_store(database_url)
    s.migrate()
    try:
        yield s
    finally:
        s.close()
