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

from reef.errors import SessionTurnTaken
from reef.records import Record
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
        "quota_counters",
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


def test_migration_0012_moves_duplicate_session_turns_to_forks(
    database_url: str, make_record: Callable[..., Record]
) -> None:
    """Two replicas that raced before 0012 left two records at one turn of a session: the
    first keeps it, the later one becomes a fork (a session of its own, its parent kept)."""
    from tests.store.test_store_experience import _alembic_to

    old = open_store(database_url)
    try:
        _alembic_to(old, "0011")
        release = old.create_scenario("raced").head_release_id
        first = make_record("raced", release, session_id="ses_1", turn=0)
        twins = [
            make_record("raced", release, session_id="ses_1", turn=1, parent_id=first.id)
            for _ in range(2)
        ]
        won, lost = sorted(twins, key=lambda r: r.id)  # the earlier id keeps the turn
        old.add_records([first, *twins])
    finally:
        old.close()

    store = open_store(database_url)
    try:
        store.migrate()
        kept = {r.id: r for r in store.list_records("raced")}
        assert (kept[won.id].session_id, kept[won.id].turn) == ("ses_1", 1)
        assert kept[lost.id].session_id == f"ses_{lost.id}"
        assert (kept[lost.id].turn, kept[lost.id].parent_id) == (1, first.id)
        with pytest.raises(SessionTurnTaken):
            store.add_records([make_record("raced", release, session_id="ses_1", turn=1)])
    finally:
        store.close()
