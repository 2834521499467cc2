"""Initial schema: scenarios, releases, records, reports.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# Frozen copies of the column types in reef/store/tables.py as they were at this revision.
Key = sa.String().with_variant(sa.String(collation="C"), "postgresql")
Json = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")
Document = sa.JSON(none_as_null=True)
Timestamp = sa.DateTime(timezone=True)


def _scenario_fk(name: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(["scenario"], ["scenarios.name"], name=name, ondelete="CASCADE")


def upgrade() -> None:
    # scenarios.head_release_id and releases reference each other. SQLite cannot add a foreign
    # key afterwards but accepts one naming a table that does not exist yet; Postgres is the
    # other way round.
    sqlite = op.get_bind().dialect.name == "sqlite"
    head_fk = sa.ForeignKeyConstraint(
        ["head_release_id"],
        ["releases.id"],
        name="fk_scenarios_head_release_id",
        deferrable=True,
        initially="DEFERRED",
    )
    op.create_table(
        "scenarios",
        sa.Column("name", sa.String(), primary_key=True),
        sa.Column("description", sa.Text()),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("head_release_id", Key, nullable=False),
        *([head_fk] if sqlite else []),
    )
    op.create_table(
        "releases",
        sa.Column("id", Key, primary_key=True),
        sa.Column("scenario", sa.String(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("parent_id", Key),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("uri", sa.Text()),
        sa.Column("metadata", Json, nullable=False),
        _scenario_fk("fk_releases_scenario"),
        sa.ForeignKeyConstraint(["parent_id"], ["releases.id"], name="fk_releases_parent"),
        sa.UniqueConstraint("scenario", "seq", name="uq_releases_scenario_seq"),
    )
    if not sqlite:
        op.create_foreign_key(
            referent_table="releases",
            source_table="scenarios",
            local_cols=["head_release_id"],
            remote_cols=["id"],
            constraint_name="fk_scenarios_head_release_id",
            deferrable=True,
            initially="DEFERRED",
        )
    op.create_table(
        "records",
        sa.Column("id", Key, primary_key=True),
        sa.Column("scenario", sa.String(), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("route", sa.String(), nullable=False),
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Column("request", Document, nullable=False),
        sa.Column("response", Document, nullable=False),
        sa.Column("release_id", Key, nullable=False),
        sa.Column("prompt_token_ids", Document),
        sa.Column("completion_token_ids", Document),
        sa.Column("logprobs", Document),
        sa.Column("timings", Json, nullable=False),
        sa.Column("tags", Json, nullable=False),
        _scenario_fk("fk_records_scenario"),
    )
    op.create_index("ix_records_scenario_id", "records", ["scenario", "id"])
    op.create_table(
        "reports",
        sa.Column("id", Key, primary_key=True),
        sa.Column("scenario", sa.String(), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("references", Json, nullable=False),
        sa.Column("score", sa.Float()),
        sa.Column("feedback", Json),
        sa.Column("metadata", Json, nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        _scenario_fk("fk_reports_scenario"),
    )
    op.create_index("ix_reports_scenario_id", "reports", ["scenario", "id"])


def downgrade() -> None:
    op.drop_index("ix_reports_scenario_id", table_name="reports")
    op.drop_table("reports")
    op.drop_index("ix_records_scenario_id", table_name="records")
    op.drop_table("records")
    if op.get_bind().dialect.name != "sqlite":
        op.drop_constraint("fk_scenarios_head_release_id", "scenarios", type_="foreignkey")
    op.drop_table("releases")
    op.drop_table("scenarios")
