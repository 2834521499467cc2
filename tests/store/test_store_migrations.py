"""Migrations: idempotent, safe when processes start at once, and in step with tables.py."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect
from sqlmodel import SQLModel

from reef.store import tables
from reef.store.sql import SQLStore, open_store


def test_migration_creates_exactly_the_tables(store: SQLStore) -> None:
    names = set(inspect(store.engine).get_table_names())
    assert names == {
        "alembic_version",
        "scenarios",
        "releases",
        "records",
        "reports",
        "consumptions",
        "candidates",
        "jobs",
        "scenario_deletions",
        "report_references",
        "ui_sessions",
        "shadow_records",
        "engines",
    }
    for table in (
        tables.scenarios,
        tables.releases,
        tables.records,
        tables.reports,
        tables.consumptions,
        tables.candidates,
    ):
        columns = {c["name"] for c in inspect(store.engine).get_columns(table.name)}
        assert columns == set(table.columns.keys()), table.name


def test_migration_matches_the_declared_tables(store: SQLStore) -> None:
    # What `alembic revision --autogenerate` would emit: nothing, or a migration is missing.
    with store.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), SQLModel.metadata)
    assert diff == []


def test_migrate_is_idempotent(store: SQLStore) -> None:
    store.create_scenario("kept")
    store.migrate()
    store.migrate()
    assert [s.name for s in store.list_scenarios()] == ["kept"]


def _migrate_at_once(url: str, n: int = 4) -> list[BaseException]:
    stores = [open_store(url) for _ in range(n)]
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def migrate(s: SQLStore) -> None:
        barrier.wait()
        try:
            s.migrate()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=migrate, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stores[0].create_scenario("after")
    for s in stores:
        s.close()
    return errors


def test_concurrent_first_migrations_sqlite(tmp_path: Path) -> None:
    assert _migrate_at_once(f"sqlite:///{tmp_path / 'fresh.db'}") == []


@pytest.mark.postgres
def test_concurrent_first_migrations_postgres(make_postgres_database: Callable[[], str]) -> None:
    assert _migrate_at_once(make_postgres_database()) == []
