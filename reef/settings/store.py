"""store: the database of records, reports and releases, its group commit and retention."""

from __future__ import annotations

from pydantic import Field, SecretStr

from reef.settings.section import Section


class StoreSettings(Section):
    """store: the database of records, reports and releases (SQLite or PostgreSQL), its group
    commit and retention."""

    # Secret: a Postgres URL may carry a password (Settings.database_url is the plain value).
    database_url: SecretStr | None = Field(
        None, description="sqlite:///path or postgresql+psycopg://...; default: state_dir/reef.db"
    )
    commit_window_ms: float = Field(
        0.0,
        ge=0,
        description="group commit: extra wait for company before a commit (0: natural batching only)",
    )
    commit_max_batch: int = Field(
        512, ge=1, description="group commit: most records written in one transaction"
    )
    retention_days: float | None = Field(
        None,
        gt=0,
        description="archive records and reports older than this to parquet in the artifact "
        "store, then delete their rows (reef.retention); None: keep forever",
    )
    retention_batch: int = Field(
        5000, ge=1, description="rows archived and deleted per transaction (short locks)"
    )
