"""Engines: serving processes that register their admin URL with a heartbeat, so a deploy
reaches every live replica's engine (engine.registry, deploy.engine.Fleet).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

# Frozen copy of the column type in reef/store/tables.py as it was at this revision.
Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "engines",
        sa.Column("url", sa.String(), primary_key=True),
        sa.Column("started_at", Timestamp, nullable=False),
        sa.Column("heartbeat_at", Timestamp, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("engines")
