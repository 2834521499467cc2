"""What the store's tests build: reports, releases, candidates and jobs with realistic fields,
row counts, the schema stepped to an older Alembic revision, and a row in every table of
whatever schema a database has (generated from its reflected tables), with a snapshot of them
all to compare."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Engine,
    Float,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    func,
    select,
)
from sqlalchemy.dialects.postgresql import JSONB

from reef.records import Candidate, Job, Release, Report, new_id, utcnow
from reef.store.sql import MIGRATIONS, SQLStore


def count_rows(store: SQLStore, table: Table, scenario: str) -> int:
    with store.engine.connect() as conn:
        query = select(func.count()).select_from(table).where(table.c.scenario == scenario)
        return conn.execute(query).scalar_one()


def new_report(scenario: str, refs: tuple[str, ...], **fields: object) -> Report:
    values: dict[str, object] = {
        "id": new_id("rep"),
        "scenario": scenario,
        "created_at": utcnow(),
        "references": refs,
        "score": 0.75,
        "feedback": {"text": "too long", "labels": ["verbose"]},
        "metadata": {"judge": "human"},
    }
    values.update(fields)
    return Report(**values)  # type: ignore[arg-type]


def new_release(scenario: str, parent_id: str | None, **fields: Any) -> Release:
    values: dict[str, Any] = {
        "id": new_id("rel"),
        "scenario": scenario,
        "seq": 99,  # ignored: the store numbers the chain
        "parent_id": parent_id,
        "kind": "adapter",
        "created_at": utcnow() - timedelta(days=1),  # ignored too: stamped at publishing
        "uri": "s3://reef/support/adapters/1",
        "metadata": {"lora_rank": 16},
        "operation": "training",
        "content_hash": "ab" * 32,
        "recipe": "sft",
        "dataset_id": "ds_1",
        "metrics": {"eval_loss": 0.42, "win_rate": 0.61},
        "gate": {"decision": "accept", "delta": 0.04, "threshold": 0.02},
        "model_uri": "models:/reef-support/3",
    }
    values.update(fields)
    return Release(**values)


def new_candidate(scenario: str, parent_id: str, **fields: Any) -> Candidate:
    now = utcnow()
    values: dict[str, Any] = {
        "id": new_id("rel"),
        "scenario": scenario,
        "parent_id": parent_id,
        "kind": "adapter",
        "created_at": now,
        "status": "pending",
        "uri": "s3://reef/support/candidates/1",
        "content_hash": "cd" * 32,
        "recipe": "sft",
        "dataset_id": "ds_1",
        "metrics": {"eval_loss": 0.5},
        "gate": {},
        "model_uri": None,
        "updated_at": now,
    }
    values.update(fields)
    return Candidate(**values)


def new_job(scenario: str) -> Job:
    now = utcnow()
    return Job(
        id=new_id("job"),
        scenario=scenario,
        kind="instruct",
        status="queued",
        request={"text": "Cite the file you changed."},
        created_at=now,
        updated_at=now,
        steps=[{"at": now.isoformat(), "step": "queued"}],
    )


def alembic_step(store: SQLStore, step: Callable[[Config, str], None], revision: str) -> None:
    """Run one Alembic command (upgrade or downgrade to `revision`) in a write transaction."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with store.engine.connect() as conn:
        conn.execution_options(reef_write=True)
        with conn.begin():
            config.attributes["connection"] = conn
            step(config, revision)


def upgrade_to(store: SQLStore, revision: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


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


def ordered_tables(meta: MetaData) -> list[Table]:
    first = [meta.tables[n] for n in _FIRST if n in meta.tables]
    rest = sorted((t for t in meta.tables.values() if t.name not in _FIRST), key=lambda t: t.name)
    return [t for t in first + rest if t.name != "alembic_version"]


def write_rows(engine: Engine, step: int) -> None:
    """One row in every table the schema has now, in one transaction."""
    meta = MetaData()
    meta.reflect(engine)
    written: dict[str, dict[str, Any]] = {}
    with engine.begin() as conn:
        for table in ordered_tables(meta):
            row = {c.name: _value(table, c, step, written) for c in table.columns}
            if table.name == "scenarios":
                row["head_release_id"] = f"releases-id-{step:02d}"
            conn.execute(table.insert().values(row))
            written[table.name] = row


Snapshot = dict[str, tuple[list[str], list[dict[str, Any]]]]


def snapshot(engine: Engine) -> Snapshot:
    """Every row of every table, with the table's primary key columns."""
    meta = MetaData()
    meta.reflect(engine)
    rows: Snapshot = {}
    with engine.connect() as conn:
        for table in ordered_tables(meta):
            key = [c.name for c in table.primary_key.columns] or [c.name for c in table.columns]
            query = select(table).order_by(*(table.c[k] for k in key))
            found = [dict(r) for r in conn.execute(query).mappings().all()]
            rows[table.name] = (key, found)
    return rows


def assert_kept(before: Snapshot, after: Snapshot, where: str) -> None:
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
