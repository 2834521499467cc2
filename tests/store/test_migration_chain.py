"""Every migration applies on top of a database written by the revision before it, with data in
every table: the schema is stepped through each Alembic revision in order; at each one a row
is written into every table that exists there (generated from the reflected schema: its column
types, its foreign keys), then the next revision is applied and every row written so far must
still be there, unchanged in every column both revisions have. At head, the schema is the one
`alembic upgrade head` makes from empty. Then back down, one revision at a time: each
downgrade keeps the rows of the tables it keeps, and the way up again ends at the same schema.
On SQLite and on Postgres."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import (
    JSON,
    Boolean,
    Connection,
    DateTime,
    Engine,
    Float,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    inspect,
    select,
)
from sqlalchemy.dialects.postgresql import JSONB

from reef.store.sql import MIGRATIONS, open_store
from tests.store.builders import alembic_step

# Revisions in the order they apply: 0001, 0002, ..., head.
_SCRIPTS = ScriptDirectory(str(MIGRATIONS))
REVISIONS = [s.revision for s in reversed(list(_SCRIPTS.walk_revisions()))]

# Tables whose rows the others point at come first (scenarios and releases point at each other:
# scenarios.head_release_id is deferred to the end of the transaction).
_FIRST = ("scenarios", "releases", "records", "reports")

# What a column means where its type alone would make a row no Reef wrote (a migration reads
# these: 0007 expands reports.references into report_references by joining records).
_JSON_HINTS: dict[tuple[str, str], Any] = {
    ("reports", "references"): "record-ids",
    ("jobs", "steps"): [{"at": "2026-01-01T00:00:00+00:00", "step": "queued"}],
    ("records", "request"): {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    ("records", "prompt_token_ids"): [1, 2, 3],
    ("records", "completion_token_ids"): [4, 5],
    ("records", "logprobs"): [-0.5, -1.25],
}


def _value(table: Table, column: Any, step: int, written: dict[str, dict[str, Any]]) -> Any:
    """A value for `column` of `table` in the rows of `step` (`written`: this step's rows so
    far, by table), from its type and its foreign key."""
    for fk in column.foreign_keys:
        target = fk.column.table.name
        if target == table.name or target not in written:
            return None  # a row's own parent (none: the first of its chain)
        return written[target][fk.column.name]
    name, kind = column.name, column.type
    if isinstance(kind, (JSON, JSONB)):
        hint = _JSON_HINTS.get((table.name, name), {"step": step, "column": name})
        return [written["records"]["id"]] if hint == "record-ids" else hint
    if isinstance(kind, DateTime):
        return datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=step)
    if isinstance(kind, Boolean):
        return step % 2 == 0
    if isinstance(kind, Integer):
        return step
    if isinstance(kind, Float):
        return 0.5 + step
    if isinstance(kind, LargeBinary):
        return f"bytes-{step}".encode()
    if isinstance(kind, String):
        text = f"{table.name}-{name}-{step:02d}"
        length = getattr(kind, "length", None)
        return (text * 8)[:length] if length else text
    raise AssertionError(f"no value for {table.name}.{name} of type {kind!r}")


def _ordered(meta: MetaData) -> list[Table]:
    first = [meta.tables[n] for n in _FIRST if n in meta.tables]
    rest = sorted((t for t in meta.tables.values() if t.name not in _FIRST), key=lambda t: t.name)
    return [t for t in first + rest if t.name != "alembic_version"]


def _write_step(engine: Engine, step: int) -> None:
    """One row in every table the schema has now, in one transaction."""
    meta = MetaData()
    meta.reflect(engine)
    written: dict[str, dict[str, Any]] = {}
    with engine.begin() as conn:
        for table in _ordered(meta):
            row = {c.name: _value(table, c, step, written) for c in table.columns}
            if table.name == "scenarios":
                row["head_release_id"] = f"releases-id-{step:02d}"
            conn.execute(table.insert().values(row))
            written[table.name] = row


Snapshot = dict[str, tuple[list[str], list[dict[str, Any]]]]


def _snapshot(engine: Engine) -> Snapshot:
    """Every row of every table, with the table's primary key columns."""
    meta = MetaData()
    meta.reflect(engine)
    rows: Snapshot = {}
    with engine.connect() as conn:
        for table in _ordered(meta):
            key = [c.name for c in table.primary_key.columns] or [c.name for c in table.columns]
            found = [dict(r) for r in conn.execute(select(table)).mappings().all()]
            rows[table.name] = (key, found)
    return rows


def _assert_kept(before: Snapshot, after: Snapshot, where: str) -> None:
    """Every row of `before` is in `after` (found by its primary key as it was before: 0005
    changes the reports' key), equal in every column both have; and no row came from nowhere."""
    for name, (key, old_rows) in before.items():
        if name not in after:
            continue  # a downgrade dropped this table, and its rows with it
        new_rows = {tuple(r[k] for k in key): r for r in after[name][1]}
        assert len(after[name][1]) == len(old_rows), f"{where}: the count of {name} changed"
        for old in old_rows:
            new = new_rows.get(tuple(old[k] for k in key))
            assert new is not None, f"{where}: a row of {name} is gone: {old}"
            changed = {c for c in set(old) & set(new) if old[c] != new[c]}
            assert not changed, f"{where}: {name}: {changed} changed in {old}"


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


@pytest.fixture
def twin_url(database_url: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Another empty database on the same backend as `database_url`."""
    if database_url.startswith("sqlite"):
        yield f"sqlite:///{tmp_path / 'twin.db'}"
        return
    databases = request.getfixturevalue("postgres_databases")
    url = databases.make()
    yield url
    databases.drop_later(url)


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
    database_url: str, twin_url: str
) -> None:
    assert REVISIONS[0] == "0001" and len(REVISIONS) >= 14, REVISIONS
    store = open_store(database_url)
    try:
        before: Snapshot = {}
        for step, revision in enumerate(REVISIONS):
            alembic_step(store, command.upgrade, revision)
            if step:
                _assert_kept(before, _snapshot(store.engine), f"upgrade to {revision}")
            _write_step(store.engine, step)
            before = _snapshot(store.engine)
        assert all(len(rows) >= 1 for _, rows in before.values()), "a table without rows"
        assert len(before["records"][1]) == len(REVISIONS)  # one per revision, all kept
        with store.engine.connect() as conn:
            assert _schema(conn) == _head_schema(twin_url)
        # The store reads what every revision wrote.
        assert len(store.list_scenarios()) == len(REVISIONS)
        assert len(store.list_records("scenarios-name-00")) == 1

        # Down again, one revision at a time: each keeps the rows of the tables it keeps.
        for revision in [*reversed(REVISIONS[:-1]), "base"]:
            alembic_step(store, command.downgrade, revision)
            after = _snapshot(store.engine)
            _assert_kept(before, after, f"downgrade to {revision}")
            before = after
        assert inspect(store.engine).get_table_names() == ["alembic_version"]
        # The last step back up is done with rows in it too: written at 0001, upgraded to head.
        alembic_step(store, command.upgrade, "0001")
        _write_step(store.engine, 0)
        before = _snapshot(store.engine)
        store.migrate()
        _assert_kept(before, _snapshot(store.engine), "upgrade from 0001 to head")
        with store.engine.connect() as conn:
            assert _schema(conn) == _head_schema(twin_url)
    finally:
        store.close()
