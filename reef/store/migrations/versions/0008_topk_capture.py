"""Top-K capture: the records' generation-time top-K token ids and log-probs per completion
token (reef.capture), the student set of the openclaw recipe's distillation term.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# Frozen copy of tables.Document as it was at this revision.
Document = sa.JSON(none_as_null=True)


def upgrade() -> None:
    op.add_column("records", sa.Column("topk", Document, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("records") as batch:
        batch.drop_column("topk")
