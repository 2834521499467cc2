"""Every migration applies on top of a database written by the revision before it, with data in
every table: the schema is stepped through each Alembic revision in order; at each one a row
is written into every table that exists there (generated from the reflected schema: its column
types, its foreign keys), then the next revision is applied and every row written so far must
still be there, unchanged in every column both revisions have. At head, the schema is the one
`alembic upgrade head` makes from empty. Then back down, one revision at a time: each
downgrade keeps the rows of the tables it keeps, and the way up again ends at the same schema.
On SQLite and on Postgres."""

from __future__ import annotations

from typing import Any

from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, inspect

from reef.store.sql import MIGRATIONS, open_store
from tests.store.builders import Snapshot, alembic_step, assert_kept, snapshot, write_rows

# Revisions in the order they apply: 0001, 0002, ..., head.
_SCRIPTS = ScriptDirectory(str(MIGRATIONS))
REVISIONS = [s.revision for s in reversed(list(_SCRIPTS.walk_revisions()))]


def _schema(conn: Connection) -> dict[str, Any]:
    """What the database says its schema is: per table its columns (name, type, nullable),
    primary key, foreign keys, indexes and unique constraints."""
    insp = inspect(conn)
    described: dict[str, Any] = {}
    for name in sorted(insp.get_table_names()):
        described[name] = {
            "columns": [(c["name"], str(c["type"]), c["nullable"]) for c in insp.get_columns(name)],
            "pk": insp.get_pk_constraint(name)["constrained_columns"],
            "fks": sorted(
                (tuple(f["constrained_columns"]), f["referred_table"], tuple(f["referred_columns"]))
                for f in insp.get_foreign_keys(name)
            ),
            "indexes": sorted(
                (i["name"], tuple(i["column_names"]), bool(i["unique"]))
                for i in insp.get_indexes(name)
            ),
            "unique": sorted(tuple(u["column_names"]) for u in insp.get_unique_constraints(name)),
        }
    return described


def _head_schema(url: str) -> dict[str, Any]:
    """The schema `alembic upgrade head` makes from empty (what `reef serve` runs at start)."""
    fresh = open_store(url)
    try:
        fresh.migrate()
        with fresh.engine.connect() as conn:
            return _schema(conn)
    finally:
        fresh.close()


def test_each_migration_keeps_the_data_of_the_revision_before(
    database_url: str, twin_database_url: str
) -> None:
    assert REVISIONS[0] == "0001" and len(REVISIONS) >= 14, REVISIONS
    store = open_store(database_url)
    try:
        before: Snapshot = {}
        for step, revision in enumerate(REVISIONS):
            alembic_step(store, command.upgrade, revision)
            if step:
                assert_kept(before, snapshot(store.engine), f"upgrade to {revision}")
            write_rows(store.engine, step)
            before = snapshot(store.engine)
        assert all(len(rows) >= 1 for _, rows in before.values()), "a table without rows"
        assert len(before["records"][1]) == len(REVISIONS)  # one per revision, all kept
        with store.engine.connect() as conn:
            assert _schema(conn) == _head_schema(twin_database_url)
        # The store reads what every revision wrote.
        assert len(store.list_scenarios()) == len(REVISIONS)
        assert len(store.list_records("scenarios-name-00")) == 1

        # Down again, one revision at a time: each keeps the rows of the tables it keeps.
        for revision in [*reversed(REVISIONS[:-1]), "base"]:
            alembic_step(store, command.downgrade, revision)
            after = snapshot(store.engine)
            assert_kept(before, after, f"downgrade to {revision}")
            before = after
        assert inspect(store.engine).get_table_names() == ["alembic_version"]
        # The last step back up is done with rows in it too: written at 0001, upgraded to head.
        alembic_step(store, command.upgrade, "0001")
        write_rows(store.engine, 0)
        before = snapshot(store.engine)
        store.migrate()
        assert_kept(before, snapshot(store.engine), "upgrade from 0001 to head")
        with store.engine.connect() as conn:
            assert _schema(conn) == _head_schema(twin_database_url)
    finally:
        store.close()
