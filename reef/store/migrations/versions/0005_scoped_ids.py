"""Scoped ids: a report_id is unique in its scenario (another scenario's ids neither block nor
reveal anything), and an Idempotency-Key in its scenario and route (the same key on
/v1/chat/completions and on /v1/messages names two requests).

Revision ID: 0005
Revises: 0004
Create Date: 2025-05-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# Frozen copies of the column types in reef/store/tables.py as they were at this revision.
Key = sa.String().with_variant(sa.String(collation="C"), "postgresql")
Json = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")
Timestamp = sa.DateTime(timezone=True)

_KEYED = sa.text("idempotency_key IS NOT NULL")


def _reports(primary_key: tuple[str, ...], name: str) -> sa.Table:
    """The reports table as it is after (or before) this revision, keyed by `primary_key`:
    what SQLite rebuilds it from (it cannot change a primary key in place)."""
    meta = sa.MetaData()
    sa.Table("scenarios", meta, sa.Column("name", sa.String(), primary_key=True))
    return sa.Table(
        "reports",
        meta,
        sa.Column("id", Key, nullable=False),
        sa.Column("scenario", sa.String(), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("references", Json, nullable=False),
        sa.Column("score", sa.Float()),
        sa.Column("feedback", Json),
        sa.Column("metadata", Json, nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.ForeignKeyConstraint(
            ["scenario"], ["scenarios.name"], name="fk_reports_scenario", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint(*primary_key, name=name),
    )


def _rekey_reports(primary_key: tuple[str, ...], old: str, new: str) -> None:
    if op.get_bind().dialect.name == "sqlite":
        with op.batch_alter_table(
            "reports", copy_from=_reports(primary_key, new), recreate="always"
        ):
            pass
    else:
        op.drop_constraint(old, "reports", type_="primary")
        op.create_primary_key(new, "reports", list(primary_key))


def upgrade() -> None:
    op.drop_index("uq_records_scenario_idempotency_key", table_name="records")
    op.create_index(
        "uq_records_scenario_route_idempotency_key",
        "records",
        ["scenario", "route", "idempotency_key"],
        unique=True,
        sqlite_where=_KEYED,
        postgresql_where=_KEYED,
    )
    # The primary key (scenario, id) serves what the (scenario, id) index did.
    op.drop_index("ix_reports_scenario_id", table_name="reports")
    _rekey_reports(("scenario", "id"), "reports_pkey", "pk_reports")


def downgrade() -> None:
    # Fails where two scenarios share a report_id, or two routes an Idempotency-Key.
    _rekey_reports(("id",), "pk_reports", "reports_pkey")
    op.create_index("ix_reports_scenario_id", "reports", ["scenario", "id"])
    op.drop_index("uq_records_scenario_route_idempotency_key", table_name="records")
    op.create_index(
        "uq_records_scenario_idempotency_key",
        "records",
        ["scenario", "idempotency_key"],
        unique=True,
        sqlite_where=_KEYED,
        postgresql_where=_KEYED,
    )
