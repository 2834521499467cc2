"""Scenario settings: each scenario's learning settings set at run time, one row per version
(append-only; the newest applies), with who changed them and when.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

# Frozen copies of the column types in reef/store/tables.py as they were at this revision.
Timestamp = sa.DateTime(timezone=True)
Json = sa.JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")


def upgrade() -> None:
    op.create_table(
        "scenario_settings",
        sa.Column(
            "scenario",
            sa.String(),
            sa.ForeignKey(
                "scenarios.name", name="fk_scenario_settings_scenario", ondelete="CASCADE"
            ),
            nullable=False,
        ),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("settings", Json, nullable=False),
        sa.Column("changed_by", sa.String(), nullable=False),
        sa.Column("changed_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("scenario", "version", name="pk_scenario_settings"),
    )


def downgrade() -> None:
    op.drop_table("scenario_settings")
