"""Report references: one row per receipt a report quotes (with its score and the release that
served the record), so the dashboard finds a record's reports, filters by feedback and score,
and averages scores per release through an index instead of scanning the reports' JSON lists.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# Frozen copy of tables.Key as it was at this revision.
Key = sa.String().with_variant(sa.String(collation="C"), "postgresql")


def upgrade() -> None:
    op.create_table(
        "report_references",
        sa.Column("scenario", sa.String(), nullable=False),
        sa.Column("record_id", Key, nullable=False),
        sa.Column("report_id", Key, nullable=False),
        sa.Column("release_id", Key, nullable=False),
        sa.Column("score", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["scenario"],
            ["scenarios.name"],
            ondelete="CASCADE",
            name="fk_report_references_scenario",
        ),
        sa.PrimaryKeyConstraint("scenario", "record_id", "report_id", name="pk_report_references"),
    )
    op.create_index(
        "ix_report_references_release",
        "report_references",
        ["scenario", "release_id", "score"],
    )
    # Reports stored before this revision: expand their JSON lists once, here.
    if op.get_bind().dialect.name == "sqlite":
        expand = 'json_each(p."references") AS ref'
        quoted = "ref.value"
    else:
        expand = 'LATERAL jsonb_array_elements_text(p."references") AS ref(value)'
        quoted = 'ref.value COLLATE "C"'
    op.execute(
        "INSERT INTO report_references (scenario, record_id, report_id, release_id, score) "
        "SELECT DISTINCT p.scenario, r.id, p.id, r.release_id, p.score "
        f"FROM reports p CROSS JOIN {expand} "
        f"JOIN records r ON r.scenario = p.scenario AND r.id = {quoted}"
    )


def downgrade() -> None:
    op.drop_index("ix_report_references_release", table_name="report_references")
    op.drop_table("report_references")
