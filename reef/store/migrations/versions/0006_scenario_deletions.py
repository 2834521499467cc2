"""Scenario deletions: a tombstone per deleted scenario whose files (artifact store) and MLflow
entries are still to be removed, by the deleting call or by `reef gc`.

Revision ID: 0006
Revises: 0005
Create Date: 2025-05-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# Frozen copy of the column type in reef/store/tables.py as it was at this revision.
Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "scenario_deletions",
        sa.Column("name", sa.String(), primary_key=True),
        sa.Column("deleted_at", Timestamp, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("scenario_deletions")
