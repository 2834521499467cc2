"""Release chain: how each release was made (operation, content, gate), and candidates.

Revision ID: 0003
Revises: 0002
Create Date: 2025-03-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# Frozen copies of the column types in reef/store/tables.py as they were at this revision.
Key = sa.String().with_variant(sa.String(collation="C"), "postgresql")
Json = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")
Timestamp = sa.DateTime(timezone=True)

_RELEASE_COLUMNS = ("operation", "content_hash", "recipe", "dataset_id", "metrics", "gate")


def upgrade() -> None:
    # NOT NULL columns come with a server default, so existing releases (all made with their
    # scenario) read as a "creation" with no metrics, and SQLite takes a plain ALTER TABLE ADD
    # COLUMN rather than a rebuild of a table that scenarios reference.
    op.add_column(
        "releases", sa.Column("operation", sa.String(), nullable=False, server_default="creation")
    )
    op.add_column("releases", sa.Column("content_hash", sa.String()))
    op.add_column("releases", sa.Column("recipe", sa.String()))
    op.add_column("releases", sa.Column("dataset_id", sa.String()))
    op.add_column(
        "releases", sa.Column("metrics", Json, nullable=False, server_default=sa.text("'{}'"))
    )
    op.add_column(
        "releases", sa.Column("gate", Json, nullable=False, server_default=sa.text("'{}'"))
    )
    op.add_column("releases", sa.Column("model_uri", sa.Text()))
    op.create_table(
        "candidates",
        sa.Column("id", Key, primary_key=True),
        sa.Column("scenario", sa.String(), nullable=False),
        sa.Column("parent_id", Key, nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("uri", sa.Text()),
        sa.Column("content_hash", sa.String()),
        sa.Column("recipe", sa.String()),
        sa.Column("dataset_id", sa.String()),
        sa.Column("metrics", Json, nullable=False),
        sa.Column("gate", Json, nullable=False),
        sa.Column("model_uri", sa.Text()),
        sa.Column("updated_at", Timestamp, nullable=False),
        sa.Column("message", sa.Text()),
        sa.ForeignKeyConstraint(
            ["scenario"], ["scenarios.name"], name="fk_candidates_scenario", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(["parent_id"], ["releases.id"], name="fk_candidates_parent"),
    )
    op.create_index("ix_candidates_scenario_status", "candidates", ["scenario", "status"])


def downgrade() -> None:
    op.drop_index("ix_candidates_scenario_status", table_name="candidates")
    op.drop_table("candidates")
    # A plain ALTER TABLE DROP COLUMN (SQLite 3.35+) rather than a batch rebuild: rebuilding
    # drops the releases table, which scenarios' head foreign key forbids.
    for name in ("model_uri", *reversed(_RELEASE_COLUMNS)):
        op.drop_column("releases", name)
