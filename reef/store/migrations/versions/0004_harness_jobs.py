"""Harness evolution: what a candidate publishes as (operation, release metadata), and jobs a
user starts and polls (an instruction turned into a harness candidate).

Revision ID: 0004
Revises: 0003
Create Date: 2025-04-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# Frozen copies of the column types in reef/store/tables.py as they were at this revision.
Key = sa.String().with_variant(sa.String(collation="C"), "postgresql")
Json = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")
Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    # Server defaults: candidates from before read as trained ones with no extra metadata, and
    # SQLite takes a plain ALTER TABLE ADD COLUMN.
    op.add_column(
        "candidates",
        sa.Column("operation", sa.String(), nullable=False, server_default="training"),
    )
    op.add_column(
        "candidates",
        sa.Column("metadata", Json, nullable=False, server_default=sa.text("'{}'")),
    )
    op.create_table(
        "jobs",
        sa.Column("id", Key, primary_key=True),
        sa.Column("scenario", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("request", Json, nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("updated_at", Timestamp, nullable=False),
        sa.Column("steps", Json, nullable=False),
        sa.Column("candidate_id", Key),
        sa.Column("result", Json, nullable=False),
        sa.Column("message", sa.Text()),
        sa.ForeignKeyConstraint(
            ["scenario"], ["scenarios.name"], name="fk_jobs_scenario", ondelete="CASCADE"
        ),
    )
    op.create_index("ix_jobs_scenario_created", "jobs", ["scenario", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_jobs_scenario_created", table_name="jobs")
    op.drop_table("jobs")
    op.drop_column("candidates", "metadata")
    op.drop_column("candidates", "operation")
