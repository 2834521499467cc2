"""Review items: each scenario's annotation queue (reef.review), the turns people are asked to
review in the dashboard, with the claim a reviewer holds on one.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

# Frozen copies of the column types in reef/store/tables.py as they were at this revision.
Timestamp = sa.DateTime(timezone=True)
Key = sa.String().with_variant(sa.String(collation="C"), "postgresql")


def upgrade() -> None:
    op.create_table(
        "review_items",
        sa.Column("id", Key, primary_key=True),
        sa.Column("scenario", Key, nullable=False),
        sa.Column("record_id", Key, nullable=False),
        sa.Column("reason", sa.String(), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("claimed_by", sa.String(), nullable=True),
        sa.Column("claimed_until", Timestamp, nullable=True),
        sa.Column("done_by", sa.String(), nullable=True),
        sa.Column("done_at", Timestamp, nullable=True),
        sa.Column("report_id", Key, nullable=True),
        sa.UniqueConstraint("scenario", "record_id", name="uq_review_items_record"),
    )
    op.create_index("ix_review_items_queue", "review_items", ["scenario", "status", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_review_items_queue", table_name="review_items")
    op.drop_table("review_items")
