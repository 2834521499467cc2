"""The store's contract: a few methods every backend (SQLite, Postgres) implements identically."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from reef.records import (
    Candidate,
    Consumption,
    Deletion,
    Job,
    Record,
    Release,
    Report,
    Scenario,
    ShadowRecord,
)
from reef.store.quotas import Quotas


class Store(ABC):
    """Durable home of scenarios, records, reports, release chains and candidates.

    Methods are synchronous and thread-safe; the API calls them from worker threads.
    Every write is committed (durable) before the method returns. Errors are ReefErrors:
    NotFound for a missing scenario/record, Conflict for a clashing id, StoreError when the
    database itself fails.
    """

    @abstractmethod
    def migrate(self) -> None:
        """Bring the schema to the newest Alembic revision (idempotent)."""

    @abstractmethod
    def ping(self) -> bool:
        """True when the database answers a trivial query. No side effects."""

    @abstractmethod
    def close(self) -> None: ...

    @property
    @abstractmethod
    def quotas(self) -> Quotas:
        """Request and token counters per token and scenario, shared by every replica."""

    # scenarios -----------------------------------------------------------------
    @abstractmethod
    def ensure_scenario(self, name: str) -> Scenario:
        """The scenario, created with its base release (seq 0) on first use; race-safe."""

    @abstractmethod
    def create_scenario(self, name: str, description: str | None = None) -> Scenario:
        """Create explicitly; Conflict if it exists."""

    @abstractmethod
    def get_scenario(self, name: str) -> Scenario: ...

    @abstractmethod
    def list_scenarios(self) -> list[Scenario]: ...

    @abstractmethod
    def delete_scenario(self, name: str) -> None:
        """Delete the scenario with all its records, reports, releases and candidates, and leave
        a tombstone (`pending_deletions`) in the same transaction: the commit point of a
        deletion. NotFound when there is no such scenario (deleted already, say)."""

    @abstractmethod
    def pending_deletions(self) -> list[Deletion]:
        """Deleted scenarios whose files and MLflow entries may still exist, oldest first.
        While a name is here, creating a scenario of that name is a Conflict."""

    @abstractmethod
    def finish_deletion(self, name: str) -> None:
        """Drop the tombstone of `name` (its outside state is gone); no-op when there is none."""

    # records -------------------------------------------------------------------
    @abstractmethod
    def add_records(self, records: Sequence[Record]) -> None:
        """Insert all in one transaction (the group commit's unit). A record whose
        Idempotency-Key (scenario, route) or session turn (scenario, session, turn) another
        record holds is refused: IdempotencyKeyReused, SessionTurnTaken; nothing is written."""

    @abstractmethod
    def get_record(self, scenario: str, record_id: str) -> Record: ...

    @abstractmethod
    def list_records(
        self, scenario: str, after: str | None = None, limit: int = 100
    ) -> list[Record]:
        """Records with id > `after`, oldest first."""

    @abstractmethod
    def existing_record_ids(self, scenario: str, ids: Iterable[str]) -> set[str]:
        """Which of `ids` are records of `scenario`."""

    @abstractmethod
    def get_records(self, scenario: str, ids: Iterable[str]) -> list[Record]:
        """The records of `scenario` among `ids`, in id order; ids that are not records of the
        scenario are left out. Looked up by id (in batches), never by scanning the scenario."""

    @abstractmethod
    def count_awaiting_feedback(self, scenario: str, recipe: str) -> int:
        """How many records of `scenario` no report of it quotes and `recipe` has not consumed:
        one aggregate query, no record read into memory."""

    @abstractmethod
    def find_idempotent(self, scenario: str, route: str, key: str) -> Record | None:
        """The record stored under this Idempotency-Key for this route in the scenario, if any
        (a key is unique per scenario and route)."""

    @abstractmethod
    def find_session_parent(self, scenario: str, state_hashes: Sequence[str]) -> Record | None:
        """Of the records whose conversation state (request messages + answer, hashed by
        reef.sessions) is one of `state_hashes`, the one with the longest conversation; among
        equal states, the newest record that has no continuation yet, else the newest. `state_hashes` come longest conversation first, as
        reef.sessions.candidate_hashes returns them: the first hash that matches wins."""

    @abstractmethod
    def session_tail(self, scenario: str, session_id: str) -> Record | None:
        """The record with the highest turn in the session, if the session exists."""

    @abstractmethod
    def session_records(self, scenario: str, session_id: str, limit: int = 1000) -> list[Record]:
        """A session's records, first turn first: the chain of parent links that ends at the
        session's tail (`session_tail`), so a fork starts with the turns it branched from. At
        most the last `limit` of them; empty for an unknown session. One query."""

    @abstractmethod
    def has_children(self, scenario: str, record_id: str) -> bool:
        """Whether any record names `record_id` as its parent (a later one is then a fork)."""

    # retention (reef.retention) -------------------------------------------------
    @abstractmethod
    def quoting_reports(self, scenario: str, record_ids: Iterable[str]) -> dict[str, set[str]]:
        """For each of `record_ids` that some report quotes, the ids of the reports quoting
        it: lookups on the report_references key, nothing scanned."""

    @abstractmethod
    def delete_records(
        self, scenario: str, ids: Sequence[str], known_reports: Mapping[str, Iterable[str]]
    ) -> set[str]:
        """Delete these records in one short transaction, except any that a report not in
        `known_reports[record_id]` now quotes (feedback that arrived after the caller decided
        the record was not needed). Returns the ids deleted. Releases and consumption receipts
        are not touched."""

    @abstractmethod
    def delete_reports(self, scenario: str, reports: Sequence[Report]) -> int:
        """Delete these reports and their report_references rows in one transaction; returns
        how many reports went."""

    # consumption receipts ------------------------------------------------------
    @abstractmethod
    def add_consumptions(self, consumptions: Sequence[Consumption]) -> None:
        """Record that a training batch consumed these records (idempotent per
        (scenario, recipe, record_id): the first receipt wins)."""

    @abstractmethod
    def consumed_record_ids(self, scenario: str, recipe: str) -> set[str]: ...

    # reports -------------------------------------------------------------------
    @abstractmethod
    def add_report(self, report: Report) -> tuple[Report, bool]:
        """Store a report; returns (stored report, created).

        Same id and same content as a stored one of the same scenario: returns the stored
        one, created=False. Same id, different content: Conflict. Ids are unique per
        scenario: another scenario's reports never clash.
        """

    @abstractmethod
    def get_report(self, scenario: str, report_id: str) -> Report: ...

    @abstractmethod
    def list_reports(
        self, scenario: str, after: str | None = None, limit: int = 100
    ) -> list[Report]: ...

    # releases ------------------------------------------------------------------
    @abstractmethod
    def get_release(self, scenario: str, release_id: str) -> Release: ...

    @abstractmethod
    def list_releases(self, scenario: str) -> list[Release]:
        """The chain, oldest (seq 0) first."""

    @abstractmethod
    def head_release(self, scenario: str) -> Release:
        """The release the scenario serves now."""

    @abstractmethod
    def publish_release(self, release: Release) -> Release:
        """Append `release` to its scenario's chain and make it the head, if and only if the
        head is still `release.parent_id` (compare-and-swap, atomic across processes).

        Returns the stored release: its `seq` is the parent's + 1 and its `created_at` the
        time of publishing, whatever the argument said. HeadMoved (nothing written) when the
        head is another release; NotFound for an unknown scenario; BadRequest without a
        parent or with an unknown `operation`; Conflict when the release id is taken.
        """

    # shadow records ------------------------------------------------------------
    @abstractmethod
    def add_shadow_records(self, shadows: Sequence[ShadowRecord]) -> None:
        """Store shadow rollouts' answers (reef.shadow) in one transaction."""

    @abstractmethod
    def list_shadow_records(
        self,
        scenario: str,
        release_id: str | None = None,
        after: str | None = None,
        limit: int = 100,
    ) -> list[ShadowRecord]:
        """The scenario's shadow records (only `release_id`'s, if given), oldest first."""

    @abstractmethod
    def shadow_sums(
        self, scenario: str, release_id: str, low: float, high: float
    ) -> tuple[int, float, float]:
        """Over `release_id`'s shadow records with both scores: how many, the sum of the
        shadow's scores and of the head's, each score clipped to [low, high]."""

    # engines (deploy fan-out) ---------------------------------------------------
    @abstractmethod
    def register_engine(self, url: str, *, started: bool = False) -> None:
        """Say the engine at admin URL `url` is alive now (its heartbeat); `started`: it has
        just started (a new row, or a row of an earlier run taken over)."""

    @abstractmethod
    def live_engines(self, max_age_s: float) -> list[str]:
        """The admin URLs of engines whose heartbeat is at most `max_age_s` old, sorted."""

    @abstractmethod
    def unregister_engine(self, url: str) -> None:
        """The engine at `url` stopped (a clean shutdown); no-op when it is not registered."""

    # candidates ----------------------------------------------------------------
    @abstractmethod
    def add_candidate(self, candidate: Candidate) -> Candidate:
        """Store a new candidate; Conflict if its id exists, NotFound if its scenario or its
        parent release (in that scenario) does not."""

    @abstractmethod
    def get_candidate(self, scenario: str, candidate_id: str) -> Candidate: ...

    @abstractmethod
    def list_candidates(self, scenario: str, status: str | None = None) -> list[Candidate]:
        """The scenario's candidates (only those in `status`, if given), newest first."""

    @abstractmethod
    def set_candidate_status(
        self,
        scenario: str,
        candidate_id: str,
        status: str,
        *,
        expected: str | None = None,
        message: str | None = None,
        model_uri: str | None = None,
        gate: dict[str, Any] | None = None,
    ) -> Candidate:
        """Move a candidate to `status` and stamp `updated_at`; `message`, `model_uri` and
        `gate` replace the stored values when given (None leaves them).

        With `expected`, a compare-and-swap: Conflict (code "candidate_status") unless the
        stored status is `expected`, so two workers cannot both act on one candidate.
        """

    # jobs -----------------------------------------------------------------------
    @abstractmethod
    def add_job(self, job: Job) -> Job:
        """Store a new job; NotFound if its scenario does not exist."""

    @abstractmethod
    def get_job(self, scenario: str, job_id: str) -> Job: ...

    @abstractmethod
    def update_job(
        self,
        scenario: str,
        job_id: str,
        *,
        status: str | None = None,
        step: dict[str, Any] | None = None,
        candidate_id: str | None = None,
        result: dict[str, Any] | None = None,
        message: str | None = None,
    ) -> Job:
        """Set what is given (None leaves it), append `step` to the job's progress steps (with
        the time), and stamp `updated_at`; returns the job as stored."""
