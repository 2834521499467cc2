"""What the store's tests build: reports, releases, candidates and jobs with realistic fields,
row counts, and the schema stepped to an older Alembic revision."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Table, func, select

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
