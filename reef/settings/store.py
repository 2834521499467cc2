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
    deadline_s: float = Field(
        10.0,
        gt=0,
        description="PostgreSQL: how long the serving path's store work (a call's lookups and its "
        "record's commit, a report's write, /readyz's check) may wait for the database; past it "
        "the call is answered 503 store_unavailable and the connection that waited is closed "
        "(a server that accepts connections and never answers, e.g. frozen, is bounded by "
        "nothing else). Not applied on SQLite, nor to the evolve worker's work",
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
