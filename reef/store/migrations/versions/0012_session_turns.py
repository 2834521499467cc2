"""One record per turn of a session: the session index becomes unique, so two replicas that
continue one conversation at the same instant cannot both take its next turn (reef.serving
re-stitches the record that lost: a fork for a continued conversation, the next turn for an
explicit session id).

Records written before this revision by such a race keep their content; each later duplicate
of a (session, turn) moves to a session of its own (`ses_<record id>`), which is what it would
have become had the race been seen: a fork that still names its parent.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_WHERE = "session_id IS NOT NULL"


def upgrade() -> None:
    op.execute(
        sa.text(
            "UPDATE records SET session_id = 'ses_' || id "
            "WHERE session_id IS NOT NULL AND turn IS NOT NULL AND EXISTS ("
            "SELECT 1 FROM records AS earlier WHERE earlier.scenario = records.scenario "
            "AND earlier.session_id = records.session_id AND earlier.turn = records.turn "
            "AND earlier.id < records.id)"
        )
    )
    op.drop_index("ix_records_scenario_session", table_name="records")
    op.create_index(
        "uq_records_scenario_session_turn",
        "records",
        ["scenario", "session_id", "turn"],
        unique=True,
        sqlite_where=sa.text(_WHERE),
        postgresql_where=sa.text(_WHERE),
    )


def downgrade() -> None:
    op.drop_index("uq_records_scenario_session_turn", table_name="records")
    op.create_index("ix_records_scenario_session", "records", ["scenario", "session_id", "turn"])
