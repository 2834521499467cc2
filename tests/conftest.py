"""Shared test fixtures: throwaway PostgreSQL databases for tests that need one."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from sqlalchemy.engine import make_url

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
