"""Experience stream: sessions and idempotency keys on records, consumption receipts.

Revision ID: 0002
Revises: 0001
Create Date: 2025-02-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# Frozen copies of the column types in reef/store/tables.py as they were at this revision.
Key = sa.String().with_variant(sa.String(collation="C"), "postgresql")
Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    # Nullable columns without foreign keys: a plain ALTER TABLE ADD COLUMN on SQLite too
    # (no table rebuild), and existing records keep NULLs.
    op.add_column("records", sa.Column("session_id", Key))
    op.add_column("records", sa.Column("turn", sa.Integer()))
    op.add_column("records", sa.Column("parent_id", Key))
    op.add_column("records", sa.Column("state_hash", sa.String(64)))
    op.add_column("records", sa.Column("idempotency_key", sa.String(255)))
    op.create_index("ix_records_scenario_session", "records", ["scenario", "session_id", "turn"])
    op.create_index("ix_records_scenario_state_hash", "records", ["scenario", "state_hash"])
    op.create_index(
        "ix_records_parent_id",
        "records",
        ["parent_id"],
        sqlite_where=sa.text("parent_id IS NOT NULL"),
        postgresql_where=sa.text("parent_id IS NOT NULL"),
    )
    op.create_index(
        "uq_records_scenario_idempotency_key",
        "records",
        ["scenario", "idempotency_key"],
        unique=True,
        sqlite_where=sa.text("idempotency_key IS NOT NULL"),
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )
    op.create_table(
        "consumptions",
        sa.Column("scenario", sa.String(), nullable=False),
        sa.Column("recipe", sa.String(), nullable=False),
        sa.Column("record_id", Key, nullable=False),
        sa.Column("batch_id", sa.String(), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("scenario", "recipe", "record_id"),
        sa.ForeignKeyConstraint(
            ["scenario"], ["scenarios.name"], name="fk_consumptions_scenario", ondelete="CASCADE"
        ),
    )


def downgrade() -> None:
    op.drop_table("consumptions")
    op.drop_index("uq_records_scenario_idempotency_key", table_name="records")
    op.drop_index("ix_records_parent_id", table_name="records")
    op.drop_index("ix_records_scenario_state_hash", table_name="records")
    op.drop_index("ix_records_scenario_session", table_name="records")
    with op.batch_alter_table("records") as batch:
        for name in ("idempotency_key", "state_hash", "parent_id", "turn", "session_id"):
            batch.drop_column(name)
