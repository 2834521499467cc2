"""Shadow records: a shadow rollout's answers to copies of served calls, with their scores
against the head's answers, kept apart from the records (never listed, never experience).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

# Frozen copies of the column types in reef/store/tables.py as they were at this revision.
Key = sa.String().with_variant(sa.String(collation="C"), "postgresql")
Json = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")
Document = sa.JSON(none_as_null=True)
Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "shadow_records",
        sa.Column("id", Key, nullable=False),
        sa.Column("scenario", sa.String(), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("record_id", Key, nullable=False),
        sa.Column("release_id", Key, nullable=False),
        sa.Column("control_release_id", Key, nullable=False),
        sa.Column("response", Document, nullable=True),
        sa.Column("timings", Json, nullable=False),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("control_score", sa.Float(), nullable=True),
        sa.Column("scored_by", sa.String(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["scenario"], ["scenarios.name"], ondelete="CASCADE", name="fk_shadow_records_scenario"
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_shadow_records_release", "shadow_records", ["scenario", "release_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_shadow_records_release", table_name="shadow_records")
    op.drop_table("shadow_records")
