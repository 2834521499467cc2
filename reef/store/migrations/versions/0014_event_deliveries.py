"""Event deliveries: the outbox of webhook events (reef.events), written in the transaction of
the state change they tell of and sent, retried and marked by the deliverer.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

# Frozen copies of the column types in reef/store/tables.py as they were at this revision.
Timestamp = sa.DateTime(timezone=True)
Key = sa.String().with_variant(sa.String(collation="C"), "postgresql")


def upgrade() -> None:
    op.create_table(
        "event_deliveries",
        sa.Column("id", Key, primary_key=True),
        sa.Column("event_id", Key, nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("scenario", Key, nullable=True),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", Timestamp, nullable=False),
        sa.Column("delivered_at", Timestamp, nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
    )
    op.create_index("ix_event_deliveries_due", "event_deliveries", ["status", "next_attempt_at"])
    op.create_index("ix_event_deliveries_scenario", "event_deliveries", ["scenario", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_event_deliveries_scenario", table_name="event_deliveries")
    op.drop_index("ix_event_deliveries_due", table_name="event_deliveries")
    op.drop_table("event_deliveries")
