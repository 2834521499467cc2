"""The database tables (SQLModel): the only place Reef's schema is declared."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Column,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Field, SQLModel


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every backend.

    Postgres keeps the zone (timestamptz); SQLite stores naive text, so values are written
    as naive UTC and given their UTC zone back on read.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        # A naive timestamp is taken as UTC (what utcnow() would have given), never local time.
        utc = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        return utc.replace(tzinfo=None) if dialect.name == "sqlite" else utc

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# Ids compare bytewise on Postgres whatever the database's locale: `after=` pagination relies
# on the database ordering ids exactly as Python's sorted() does.
Key = String().with_variant(String(collation="C"), "postgresql")

# Small structured values (tags, timings, metadata, references): JSONB on Postgres so they
# can be queried and indexed later.
Json = JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")

# Wire bodies and token data: JSON text kept verbatim on every backend. A request's key
# order is what a chat template renders tool schemas in, and JSONB would reorder it; plain
# JSON is also cheaper to write on the hot path.
Document = JSON(none_as_null=True)


def _scenario_fk(name: str) -> Any:
    return Field(
        sa_column=Column(
            "scenario",
            String,
            ForeignKey("scenarios.name", ondelete="CASCADE", name=name),
            nullable=False,
        )
    )


class ScenarioRow(SQLModel, table=True):
    __tablename__ = "scenarios"

    name: str = Field(sa_column=Column("name", String, primary_key=True))
    description: str | None = Field(default=None, sa_column=Column("description", Text))
    created_at: datetime = Field(sa_column=Column("created_at", UTCDateTime, nullable=False))
    # Deferred so the scenario and its base release go in one transaction, in either order;
    # `use_alter` because scenarios and releases reference each other.
    head_release_id: str = Field(
        sa_column=Column(
            "head_release_id",
            Key,
            ForeignKey(
                "releases.id",
                name="fk_scenarios_head_release_id",
                deferrable=True,
                initially="DEFERRED",
                use_alter=True,
            ),
            nullable=False,
        )
    )


class ReleaseRow(SQLModel, table=True):
    __tablename__ = "releases"
    __table_args__ = (UniqueConstraint("scenario", "seq", name="uq_releases_scenario_seq"),)

    id: str = Field(sa_column=Column("id", Key, primary_key=True))
    scenario: str = _scenario_fk("fk_releases_scenario")
    seq: int = Field(nullable=False)
    parent_id: str | None = Field(
        default=None,
        sa_column=Column("parent_id", Key, ForeignKey("releases.id", name="fk_releases_parent")),
    )
    kind: str = Field(sa_column=Column("kind", String, nullable=False))
    created_at: datetime = Field(sa_column=Column("created_at", UTCDateTime, nullable=False))
    uri: str | None = Field(default=None, sa_column=Column("uri", Text))
    # `metadata` is taken by SQLAlchemy's declarative base; the column keeps the real name.
    meta: dict[str, Any] = Field(
        default_factory=dict, sa_column=Column("metadata", Json, nullable=False)
    )
    # Server defaults: what rows from before these columns read as, and what an insert by a
    # Reef that predates them (a replica not yet upgraded) writes.
    operation: str = Field(
        sa_column=Column("operation", String, nullable=False, server_default="creation")
    )
    content_hash: str | None = Field(default=None, sa_column=Column("content_hash", String))
    recipe: str | None = Field(default=None, sa_column=Column("recipe", String))
    dataset_id: str | None = Field(default=None, sa_column=Column("dataset_id", String))
    metrics: dict[str, Any] = Field(
        default_factory=dict,
        sa_column=Column("metrics", Json, nullable=False, server_default=text("'{}'")),
    )
    gate: dict[str, Any] = Field(
        default_factory=dict,
        sa_column=Column("gate", Json, nullable=False, server_default=text("'{}'")),
    )
    model_uri: str | None = Field(default=None, sa_column=Column("model_uri", Text))


class CandidateRow(SQLModel, table=True):
    """A trained artifact awaiting (or past) the gate; its id is the release id it takes."""

    __tablename__ = "candidates"
    __table_args__ = (Index("ix_candidates_scenario_status", "scenario", "status"),)

    id: str = Field(sa_column=Column("id", Key, primary_key=True))
    scenario: str = _scenario_fk("fk_candidates_scenario")
    parent_id: str = Field(
        sa_column=Column(
            "parent_id",
            Key,
            ForeignKey("releases.id", name="fk_candidates_parent"),
            nullable=False,
        )
    )
    kind: str = Field(sa_column=Column("kind", String, nullable=False))
    created_at: datetime = Field(sa_column=Column("created_at", UTCDateTime, nullable=False))
    status: str = Field(sa_column=Column("status", String, nullable=False))
    uri: str | None = Field(default=None, sa_column=Column("uri", Text))
    content_hash: str | None = Field(default=None, sa_column=Column("content_hash", String))
    recipe: str | None = Field(default=None, sa_column=Column("recipe", String))
    dataset_id: str | None = Field(default=None, sa_column=Column("dataset_id", String))
    metrics: dict[str, Any] = Field(
        default_factory=dict, sa_column=Column("metrics", Json, nullable=False)
    )
    gate: dict[str, Any] = Field(
        default_factory=dict, sa_column=Column("gate", Json, nullable=False)
    )
    model_uri: str | None = Field(default=None, sa_column=Column("model_uri", Text))
    updated_at: datetime = Field(sa_column=Column("updated_at", UTCDateTime, nullable=False))
    message: str | None = Field(default=None, sa_column=Column("message", Text))
    operation: str = Field(
        sa_column=Column("operation", String, nullable=False, server_default="training")
    )
    meta: dict[str, Any] = Field(
        default_factory=dict,
        sa_column=Column("metadata", Json, nullable=False, server_default=text("'{}'")),
    )


class JobRow(SQLModel, table=True):
    """Work a user started and polls (an instruction turned into a harness candidate)."""

    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_scenario_created", "scenario", "created_at"),)

    id: str = Field(sa_column=Column("id", Key, primary_key=True))
    scenario: str = _scenario_fk("fk_jobs_scenario")
    kind: str = Field(sa_column=Column("kind", String, nullable=False))
    status: str = Field(sa_column=Column("status", String, nullable=False))
    request: dict[str, Any] = Field(
        default_factory=dict, sa_column=Column("request", Json, nullable=False)
    )
    created_at: datetime = Field(sa_column=Column("created_at", UTCDateTime, nullable=False))
    updated_at: datetime = Field(sa_column=Column("updated_at", UTCDateTime, nullable=False))
    steps: list[Any] = Field(default_factory=list, sa_column=Column("steps", Json, nullable=False))
    candidate_id: str | None = Field(default=None, sa_column=Column("candidate_id", Key))
    result: dict[str, Any] = Field(
        default_factory=dict, sa_column=Column("result", Json, nullable=False)
    )
    message: str | None = Field(default=None, sa_column=Column("message", Text))


class RecordRow(SQLModel, table=True):
    __tablename__ = "records"
    # (scenario, id) serves both scenario lookups and `after=` pagination; a separate index on
    # scenario alone would only slow the hot insert path. release_id has no foreign key for
    # the same reason: releases are append-only and leave only together with their records.
    __table_args__ = (
        Index("ix_records_scenario_id", "scenario", "id"),
        # Session stitching: a session's tail, a state's record, a record's children.
        # One record per turn of a session: two replicas continuing one conversation at the
        # same instant cannot both take its next turn (reef.serving re-stitches the loser).
        # Partial: records of no session never collide (NULLs don't either, on both backends).
        Index(
            "uq_records_scenario_session_turn",
            "scenario",
            "session_id",
            "turn",
            unique=True,
            sqlite_where=text("session_id IS NOT NULL"),
            postgresql_where=text("session_id IS NOT NULL"),
        ),
        Index("ix_records_scenario_state_hash", "scenario", "state_hash"),
        # Partial: first turns (most records) have no parent and cost this index nothing.
        Index(
            "ix_records_parent_id",
            "parent_id",
            sqlite_where=text("parent_id IS NOT NULL"),
            postgresql_where=text("parent_id IS NOT NULL"),
        ),
        # One record per Idempotency-Key and route in a scenario (the same key on two routes
        # names two requests). Partial: most records have no key, and NULLs never collide anyway
        # (on SQLite and Postgres alike).
        Index(
            "uq_records_scenario_route_idempotency_key",
            "scenario",
            "route",
            "idempotency_key",
            unique=True,
            sqlite_where=text("idempotency_key IS NOT NULL"),
            postgresql_where=text("idempotency_key IS NOT NULL"),
        ),
    )

    id: str = Field(sa_column=Column("id", Key, primary_key=True))
    scenario: str = _scenario_fk("fk_records_scenario")
    created_at: datetime = Field(sa_column=Column("created_at", UTCDateTime, nullable=False))
    route: str = Field(sa_column=Column("route", String, nullable=False))
    model: str = Field(sa_column=Column("model", String, nullable=False))
    stream: bool = Field(nullable=False)
    request: dict[str, Any] = Field(sa_column=Column("request", Document, nullable=False))
    response: dict[str, Any] = Field(sa_column=Column("response", Document, nullable=False))
    release_id: str = Field(sa_column=Column("release_id", Key, nullable=False))
    prompt_token_ids: list[int] | None = Field(
        default=None, sa_column=Column("prompt_token_ids", Document)
    )
    completion_token_ids: list[int] | None = Field(
        default=None, sa_column=Column("completion_token_ids", Document)
    )
    logprobs: list[float] | None = Field(default=None, sa_column=Column("logprobs", Document))
    timings: dict[str, float] = Field(
        default_factory=dict, sa_column=Column("timings", Json, nullable=False)
    )
    tags: dict[str, str] = Field(
        default_factory=dict, sa_column=Column("tags", Json, nullable=False)
    )
    # No foreign key on parent_id, as for release_id: it would cost the hot insert a lookup,
    # and a parent leaves only with its whole scenario.
    session_id: str | None = Field(default=None, sa_column=Column("session_id", Key))
    turn: int | None = Field(default=None, sa_column=Column("turn", Integer))
    parent_id: str | None = Field(default=None, sa_column=Column("parent_id", Key))
    state_hash: str | None = Field(default=None, sa_column=Column("state_hash", String(64)))
    idempotency_key: str | None = Field(
        default=None, sa_column=Column("idempotency_key", String(255))
    )
    topk: dict[str, Any] | None = Field(default=None, sa_column=Column("topk", Document))


class ConsumptionRow(SQLModel, table=True):
    """A consumption receipt: the first (scenario, recipe, record) receipt wins."""

    __tablename__ = "consumptions"

    scenario: str = Field(
        sa_column=Column(
            "scenario",
            String,
            ForeignKey("scenarios.name", ondelete="CASCADE", name="fk_consumptions_scenario"),
            primary_key=True,
        )
    )
    recipe: str = Field(sa_column=Column("recipe", String, primary_key=True))
    record_id: str = Field(sa_column=Column("record_id", Key, primary_key=True))
    batch_id: str = Field(sa_column=Column("batch_id", String, nullable=False))
    created_at: datetime = Field(sa_column=Column("created_at", UTCDateTime, nullable=False))


class ReportRow(SQLModel, table=True):
    __tablename__ = "reports"
    # A report_id is the client's idempotency key: unique in its scenario only, so another
    # scenario's ids neither block nor reveal anything. The key's index also serves scenario
    # lookups and `after=` pagination.
    __table_args__ = (PrimaryKeyConstraint("scenario", "id", name="pk_reports"),)

    id: str = Field(sa_column=Column("id", Key, nullable=False))
    scenario: str = _scenario_fk("fk_reports_scenario")
    created_at: datetime = Field(sa_column=Column("created_at", UTCDateTime, nullable=False))
    references: list[str] = Field(sa_column=Column("references", Json, nullable=False))
    score: float | None = Field(default=None, sa_column=Column("score", Float))
    feedback: Any = Field(default=None, sa_column=Column("feedback", Json))
    # named metrics (metrics.<name> of the scenario's settings), {} for a report without any
    metrics: dict[str, Any] = Field(
        default_factory=dict,
        sa_column=Column("metrics", Json, nullable=False, server_default=text("'{}'")),
    )
    meta: dict[str, Any] = Field(
        default_factory=dict, sa_column=Column("metadata", Json, nullable=False)
    )
    # sha256 of the report's content: what an idempotent retry is compared by.
    content_hash: str = Field(sa_column=Column("content_hash", String(64), nullable=False))


class ReportReferenceRow(SQLModel, table=True):
    """One receipt a report quotes, with the report's score and the release that served the
    record: the index behind "which reports quote this record", the has-feedback and score
    filters, and the mean score per release, none of which may scan the reports' JSON lists.
    Written in the report's own transaction."""

    __tablename__ = "report_references"
    __table_args__ = (
        PrimaryKeyConstraint("scenario", "record_id", "report_id", name="pk_report_references"),
        # the learning curve: a covering scan of one scenario's scores grouped by release
        Index("ix_report_references_release", "scenario", "release_id", "score"),
    )

    scenario: str = _scenario_fk("fk_report_references_scenario")
    record_id: str = Field(sa_column=Column("record_id", Key, nullable=False))
    report_id: str = Field(sa_column=Column("report_id", Key, nullable=False))
    release_id: str = Field(sa_column=Column("release_id", Key, nullable=False))
    score: float | None = Field(default=None, sa_column=Column("score", Float))


class ShadowRecordRow(SQLModel, table=True):
    """A shadow rollout's answer to a copy of a call (reef.records.ShadowRecord): apart from
    the records, so no listing, session lookup, readiness count or experience ever sees it."""

    __tablename__ = "shadow_records"
    # the sequential test's sums over one candidate's scored copies, and their listing
    __table_args__ = (Index("ix_shadow_records_release", "scenario", "release_id", "id"),)

    id: str = Field(sa_column=Column("id", Key, primary_key=True))
    scenario: str = _scenario_fk("fk_shadow_records_scenario")
    created_at: datetime = Field(sa_column=Column("created_at", UTCDateTime, nullable=False))
    record_id: str = Field(sa_column=Column("record_id", Key, nullable=False))
    release_id: str = Field(sa_column=Column("release_id", Key, nullable=False))
    control_release_id: str = Field(sa_column=Column("control_release_id", Key, nullable=False))
    response: dict[str, Any] | None = Field(default=None, sa_column=Column("response", Document))
    timings: dict[str, float] = Field(
        default_factory=dict, sa_column=Column("timings", Json, nullable=False)
    )
    score: float | None = Field(default=None, sa_column=Column("score", Float))
    control_score: float | None = Field(default=None, sa_column=Column("control_score", Float))
    scored_by: str | None = Field(default=None, sa_column=Column("scored_by", String))
    error: str | None = Field(default=None, sa_column=Column("error", Text))


class ScenarioDeletionRow(SQLModel, table=True):
    """A tombstone: a deleted scenario whose artifact-store keys and MLflow entries are still
    to be removed (reef.deletion). Written in the transaction that deletes the scenario's rows;
    while it exists the name cannot be used again. No foreign key: the scenario is gone."""

    __tablename__ = "scenario_deletions"

    name: str = Field(sa_column=Column("name", String, primary_key=True))
    deleted_at: datetime = Field(sa_column=Column("deleted_at", UTCDateTime, nullable=False))


class ScenarioSettingsRow(SQLModel, table=True):
    """A version of a scenario's learning settings set at run time (PUT /reef/scenarios/{s}/
    settings): its reef, gate and judge keys over the configuration's. Append-only: each
    change is a new version; the newest applies. Who changed it and when stay with it."""

    __tablename__ = "scenario_settings"
    __table_args__ = (PrimaryKeyConstraint("scenario", "version", name="pk_scenario_settings"),)

    scenario: str = _scenario_fk("fk_scenario_settings_scenario")
    version: int = Field(sa_column=Column("version", Integer, nullable=False))
    settings: dict[str, Any] = Field(sa_column=Column("settings", Json, nullable=False))
    changed_by: str = Field(sa_column=Column("changed_by", String, nullable=False))
    changed_at: datetime = Field(sa_column=Column("changed_at", UTCDateTime, nullable=False))


class UISessionRow(SQLModel, table=True):
    """A dashboard sign-in (api.ui.signin): shared by every replica on the database, so a
    session opened on one is known to all and signing out anywhere ends it. The cookie's id
    is stored only as its sha256 (a copy of the table signs nobody in); the token as its
    sha256 too, resolved against the tokens configured now on every request."""

    __tablename__ = "ui_sessions"
    __table_args__ = (Index("ix_ui_sessions_expires", "expires_at"),)

    id_sha256: str = Field(sa_column=Column("id_sha256", String(64), primary_key=True))
    token_sha256: str = Field(sa_column=Column("token_sha256", String(64), nullable=False))
    csrf: str = Field(sa_column=Column("csrf", String, nullable=False))
    created_at: datetime = Field(sa_column=Column("created_at", UTCDateTime, nullable=False))
    expires_at: datetime = Field(sa_column=Column("expires_at", UTCDateTime, nullable=False))


class EngineRow(SQLModel, table=True):
    """A serving process's engine that registered itself for deploys to reach
    (engine.fleet.registry, deploy.engine.Fleet): its admin URL and when it last said it was
    alive. Deploys ignore a row whose heartbeat is older than engine.fleet.registry_ttl_s (a replica that is down)."""

    __tablename__ = "engines"

    url: str = Field(sa_column=Column("url", String, primary_key=True))
    started_at: datetime = Field(sa_column=Column("started_at", UTCDateTime, nullable=False))
    heartbeat_at: datetime = Field(sa_column=Column("heartbeat_at", UTCDateTime, nullable=False))


class EventDeliveryRow(SQLModel, table=True):
    """The outbox of webhook events (reef.events): one row per event and webhook, written in
    the transaction of the state change it tells of, sent by the deliverer and marked
    delivered (or, after its tries, failed). `body` is the exact JSON sent and signed on
    every try; `event_id` is shared by the event's rows for every webhook and by every try."""

    __tablename__ = "event_deliveries"
    __table_args__ = (
        Index("ix_event_deliveries_due", "status", "next_attempt_at"),
        Index("ix_event_deliveries_scenario", "scenario", "created_at"),
    )

    id: str = Field(sa_column=Column("id", Key, primary_key=True))
    event_id: str = Field(sa_column=Column("event_id", Key, nullable=False))
    kind: str = Field(sa_column=Column("kind", String, nullable=False))
    scenario: str | None = Field(default=None, sa_column=Column("scenario", Key, nullable=True))
    url: str = Field(sa_column=Column("url", Text, nullable=False))
    body: str = Field(sa_column=Column("body", Text, nullable=False))
    created_at: datetime = Field(sa_column=Column("created_at", UTCDateTime, nullable=False))
    status: str = Field(sa_column=Column("status", String, nullable=False))
    attempts: int = Field(sa_column=Column("attempts", Integer, nullable=False))
    next_attempt_at: datetime = Field(
        sa_column=Column("next_attempt_at", UTCDateTime, nullable=False)
    )
    delivered_at: datetime | None = Field(
        default=None, sa_column=Column("delivered_at", UTCDateTime, nullable=True)
    )
    last_error: str | None = Field(
        default=None, sa_column=Column("last_error", Text, nullable=True)
    )


class ReviewItemRow(SQLModel, table=True):
    """The annotation queue (reef.review): one turn a person is asked to review, added once
    by the first policy that picked it (`reason`). A reviewer takes it by a conditional
    update (`claimed_by`, until `claimed_until`), then finishes it (`done`, with the report
    their review stored) or skips it (`skipped`)."""

    __tablename__ = "review_items"
    __table_args__ = (
        UniqueConstraint("scenario", "record_id", name="uq_review_items_record"),
        Index("ix_review_items_queue", "scenario", "status", "created_at"),
    )

    id: str = Field(sa_column=Column("id", Key, primary_key=True))
    scenario: str = Field(sa_column=Column("scenario", Key, nullable=False))
    record_id: str = Field(sa_column=Column("record_id", Key, nullable=False))
    reason: str = Field(sa_column=Column("reason", String, nullable=False))
    created_at: datetime = Field(sa_column=Column("created_at", UTCDateTime, nullable=False))
    status: str = Field(sa_column=Column("status", String, nullable=False))
    claimed_by: str | None = Field(
        default=None, sa_column=Column("claimed_by", String, nullable=True)
    )
    claimed_until: datetime | None = Field(
        default=None, sa_column=Column("claimed_until", UTCDateTime, nullable=True)
    )
    done_by: str | None = Field(default=None, sa_column=Column("done_by", String, nullable=True))
    done_at: datetime | None = Field(
        default=None, sa_column=Column("done_at", UTCDateTime, nullable=True)
    )
    report_id: str | None = Field(default=None, sa_column=Column("report_id", Key, nullable=True))


# Core handles on the tables: the store writes and reads through these (no ORM objects on
# the hot path).
scenarios: Table = SQLModel.metadata.tables["scenarios"]
releases: Table = SQLModel.metadata.tables["releases"]
records: Table = SQLModel.metadata.tables["records"]
reports: Table = SQLModel.metadata.tables["reports"]
report_references: Table = SQLModel.metadata.tables["report_references"]
consumptions: Table = SQLModel.metadata.tables["consumptions"]
candidates: Table = SQLModel.metadata.tables["candidates"]
shadow_records: Table = SQLModel.metadata.tables["shadow_records"]
jobs: Table = SQLModel.metadata.tables["jobs"]
scenario_deletions: Table = SQLModel.metadata.tables["scenario_deletions"]
scenario_settings: Table = SQLModel.metadata.tables["scenario_settings"]
ui_sessions: Table = SQLModel.metadata.tables["ui_sessions"]
engines: Table = SQLModel.metadata.tables["engines"]
event_deliveries: Table = SQLModel.metadata.tables["event_deliveries"]
review_items: Table = SQLModel.metadata.tables["review_items"]
