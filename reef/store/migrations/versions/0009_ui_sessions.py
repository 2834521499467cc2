"""Dashboard sign-in sessions in the database: every replica behind a load balancer knows a
session another one opened, and signing out on one ends it on all.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# Frozen copy of the column type in reef/store/tables.py as it was at this revision.
Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "ui_sessions",
        sa.Column("id_sha256", sa.String(64), primary_key=True),
        sa.Column("token_sha256", sa.String(64), nullable=False),
        sa.Column("csrf", sa.String(), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("expires_at", Timestamp, nullable=False),
    )
    op.create_index("ix_ui_sessions_expires", "ui_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_ui_sessions_expires", table_name="ui_sessions")
    op.drop_table("ui_sessions")
