"""What the store holds: scenarios, records, reports, releases, candidates (frozen dataclasses)."""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

_CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"


def new_id(prefix: str) -> str:
    """A sortable unique id: 48-bit millisecond time then 80 random bits, Crockford base32.

    Ids of one prefix sort in creation order (to the millisecond), which is what `after=`
    pagination over records relies on.
    """
    n = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10), "big")
    chars = []
    for _ in range(26):
        n, r = divmod(n, 32)
        chars.append(_CROCKFORD[r])
    return f"{prefix}_{''.join(reversed(chars))}"


def id_time(id_: str) -> datetime | None:
    """When `new_id` made this id (to the millisecond); None for an id it did not make."""
    _, sep, body = id_.rpartition("_")
    if not sep or len(body) != 26:
        return None
    n = 0
    for ch in body:
        value = _CROCKFORD.find(ch)
        if value < 0:
            return None
        n = n * 32 + value
    try:
        return datetime.fromtimestamp((n >> 80) / 1000, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def utcnow() -> datetime:
    return datetime.now(UTC)


def content_hash(obj: Any) -> str:
    """sha256 of a JSON value with sorted keys: equal content, equal hash."""
    return hashlib.sha256(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)).hexdigest()


# What made a release: the scenario's creation (seq 0), a training run, a rollback to earlier
# content, or the promotion of a candidate built elsewhere.
RELEASE_OPERATIONS = frozenset({"creation", "training", "rollback", "promote", "harness"})

# A candidate's life: "pending" until the gate decides; "rejected" by the gate, "published"
# once its release heads the chain, "failed" when building or publishing it broke, and
# "superseded" when the head moved on before it could be published.
# canary: serving a share of traffic in a rollout (reef.rollouts); rolled_back: a canary retired.
CANDIDATE_STATUSES = frozenset(
    {"pending", "rejected", "published", "failed", "superseded", "canary", "rolled_back"}
)


@dataclass(frozen=True)
class Release:
    """An accepted artifact on a scenario's append-only chain. Sequence 0 is the base model."""

    id: str
    scenario: str
    seq: int
    parent_id: str | None
    kind: str  # "base" | "adapter" | "checkpoint" | "harness"
    created_at: datetime
    uri: str | None = None  # where the content's files are
    metadata: dict[str, Any] = field(default_factory=dict)
    operation: str = "creation"  # one of RELEASE_OPERATIONS
    content_hash: str | None = None
    recipe: str | None = None
    dataset_id: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    gate: dict[str, Any] = field(default_factory=dict)  # the gate's decision and its numbers
    model_uri: str | None = None  # the MLflow registry's "models:/..." for this content

    @property
    def weights_id(self) -> str:
        """The release whose weights this one serves: itself, or for a release that changed only
        the harness, the release it kept the weights of (so the engine loads them once)."""
        return str(self.metadata.get("weights_release_id") or self.id)


@dataclass(frozen=True)
class Candidate:
    """A trained artifact waiting for the gate. Published, it becomes the release `id` whose
    parent is `parent_id`, the head it was trained against."""

    id: str  # the release id ("rel_...") it takes if published
    scenario: str
    parent_id: str
    kind: str
    created_at: datetime
    status: str  # one of CANDIDATE_STATUSES
    uri: str | None
    content_hash: str | None
    recipe: str | None
    dataset_id: str | None
    metrics: dict[str, Any]
    gate: dict[str, Any]
    model_uri: str | None
    updated_at: datetime
    message: str | None = None  # why it failed or was rejected
    operation: str = "training"  # the release operation it publishes as: training | harness
    # What its release's metadata will hold beyond the files: for a harness candidate, the
    # harness reference and the parent weights it keeps (reef.harness.harness_release).
    metadata: dict[str, Any] = field(default_factory=dict)

    def release(self, operation: str | None = None) -> Release:
        """The release it becomes, published on the head it was made against (the store
        assigns seq and created_at). A harness candidate's metadata is its release's (the
        harness, the weights it keeps); a trained one names its files' artifact key."""
        metadata = dict(self.metadata)
        if self.operation != "harness":
            metadata = {"artifact_key": f"releases/{self.scenario}/{self.content_hash}", **metadata}
        return Release(
            id=self.id,
            scenario=self.scenario,
            seq=0,
            parent_id=self.parent_id,
            kind=self.kind,
            created_at=utcnow(),
            uri=self.uri,
            metadata=metadata,
            operation=operation or self.operation,
            content_hash=self.content_hash,
            recipe=self.recipe,
            dataset_id=self.dataset_id,
            metrics=self.metrics,
            gate=self.gate,
            model_uri=self.model_uri,
        )


# An asynchronous job a user started and polls (POST /reef/train): "queued" until a worker takes
# it, "running" with progress steps, then "done" (its candidate waits for review, or was
# released) or "failed" with the reason.
JOB_STATUSES = frozenset({"queued", "running", "done", "failed"})


@dataclass(frozen=True)
class Job:
    """A unit of work a worker runs for a user, with the progress steps it logged so far."""

    id: str  # "job_..."
    scenario: str
    kind: str  # "instruct": a plain-language ask turned into a harness candidate
    status: str  # one of JOB_STATUSES
    request: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    steps: list[dict[str, Any]] = field(default_factory=list)  # {"at", "step", "detail"...}
    candidate_id: str | None = None
    result: dict[str, Any] = field(default_factory=dict)
    message: str | None = None  # why it failed


@dataclass(frozen=True)
class Scenario:
    name: str
    created_at: datetime
    head_release_id: str
    description: str | None = None


@dataclass(frozen=True)
class Deletion:
    """A deleted scenario whose files and MLflow entries may still exist (a tombstone): its
    rows left the database at `deleted_at`; `reef.deletion` removes the rest, then this."""

    scenario: str
    deleted_at: datetime


@dataclass(frozen=True)
class SettingsVersion:
    """A version of a scenario's learning settings set at run time: its `reef`, `gate` and
    `judge` keys (over the configuration's `scenarios.<name>`), who set them and when."""

    scenario: str
    version: int
    settings: dict[str, Any]
    changed_by: str
    changed_at: datetime


# The tag an imported record carries (reef.imports), its value the file's format: experience
# like any other, never served traffic.
IMPORTED_TAG = "reef.imported"

# The tags of a guard answer (reef.guard_answers): a candidate's answer to a task of a gate guard
# that the guard's scorer failed, kept for people to review. GUARD_TAG's value is the guard's
# name; the others name the candidate that answered, the task, its score and the answer the
# task expects. Never served traffic: no release's reported scores count a report on it (its
# report_references carry GUARD_RELEASE), nor do the dashboard's calls per hour.
GUARD_TAG = "reef.guard"
GUARD_CANDIDATE_TAG = "reef.guard.candidate"
GUARD_TASK_TAG = "reef.guard.task"
GUARD_SCORE_TAG = "reef.guard.score"
GUARD_EXPECTED_TAG = "reef.guard.expected"
# What report_references.release_id holds for a guard answer, in place of the release it is
# made on: a value no release id takes, so the per-release scores and a rollout's arms skip it.
GUARD_RELEASE = "guard"

# The tag of a streamed exchange cut before its end, its value why: "engine_error" (the engine
# failed mid-stream) or "stream_closed" (the client left, or the server stopped). The record
# holds what was streamed so far, so that the receipt the stream's headers carried names it; it
# is never experience (reef.experience drops it as "incomplete").
INCOMPLETE_TAG = "reef.incomplete"

# The tag naming the end user a call was served to: the x-reef-user-id header's value.
USER_TAG = "reef.user"


@dataclass(frozen=True)
class Record:
    """One stored inference exchange. `request`/`response` are the client's wire bodies for
    `route` ("chat.completions" or "messages"); for a stream, `response` is the assembled answer.
    """

    id: str
    scenario: str
    created_at: datetime
    route: str
    model: str
    stream: bool
    request: dict[str, Any]
    response: dict[str, Any]
    release_id: str
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    timings: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    # Sessions: the conversation this exchange belongs to, its 0-based turn in it, and the
    # record whose request + answer this one's request extends (None for a first turn).
    session_id: str | None = None
    turn: int | None = None
    parent_id: str | None = None
    # Hash of the conversation after this exchange (request messages + answer, normalized by
    # reef.sessions): a later request whose messages start with exactly that continues it.
    state_hash: str | None = None
    # Set by the Idempotency-Key header: a retry with the same key gets this record back.
    idempotency_key: str | None = None
    # The generation-time top-K capture (reef.capture): per completion token the K most likely
    # token ids and their log-probs, {"k": K, "ids": [[...]], "logprobs": [[...]]}; None when
    # the engine recorded none. The openclaw recipe's student set S^q (the OpenClaw-RL paper).
    topk: dict[str, Any] | None = None


@dataclass(frozen=True)
class ShadowRecord:
    """A shadow rollout's answer to a copy of a served call (reef.shadow): never shown to the
    user, never experience, kept apart from the records. `record_id` is the head's record of
    the same request (its request and answer); the scores put both answers on one scorer."""

    id: str  # "shd_..."
    scenario: str
    created_at: datetime
    record_id: str
    release_id: str  # the shadow candidate that answered
    control_release_id: str  # the release that served the user
    response: dict[str, Any] | None  # None when the shadow call failed
    timings: dict[str, float] = field(default_factory=dict)
    score: float | None = None  # the candidate's answer
    control_score: float | None = None  # the head's answer to the same request
    scored_by: str | None = None
    error: str | None = None  # why there is no answer, or no score


@dataclass(frozen=True)
class Consumption:
    """A consumption receipt: `record_id` was trained on by `recipe` in `batch_id`, so late or
    repeated feedback never trains it again for that recipe."""

    scenario: str
    recipe: str
    record_id: str
    batch_id: str
    created_at: datetime


@dataclass(frozen=True)
class Report:
    """Feedback quoting one or more receipts of the same scenario."""

    id: str
    scenario: str
    created_at: datetime
    references: tuple[str, ...]
    score: float | None = None
    feedback: str | dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, bool | float | str] = field(default_factory=dict)  # named metrics

    def value(self, metric: str = "score") -> float | None:
        """What this report gives the metric a recipe learns from (reef.metric): its score, or
        a named boolean (1 or 0) or float metric; None when it gives none."""
        if metric == "score":
            return self.score
        value = self.metrics.get(metric)
        if isinstance(value, bool):
            return 1.0 if value else 0.0
        return float(value) if isinstance(value, (int, float)) else None

    @property
    def content_hash(self) -> str:
        """What makes two reports with the same id 'the same' (idempotent retry) or not (409).
        Metrics count when there are some (a report stored before they existed keeps its hash)."""
        content: dict[str, Any] = {
            "references": list(self.references),
            "score": self.score,
            "feedback": self.feedback,
            "metadata": self.metadata,
        }
        if self.metrics:
            content["metrics"] = self.metrics
        return content_hash(content)


@dataclass(frozen=True)
class Slice:
    """The records a recipe learns from (`reef.select`): each record of a sample must carry
    every one of `tags` with its value, belong to one of `sessions` and have been served to
    one of `users` (its USER_TAG); an empty field keeps every record."""

    tags: dict[str, str] = field(default_factory=dict)
    sessions: tuple[str, ...] = ()
    users: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.tags or self.sessions or self.users)

    def holds(self, record: Record) -> bool:
        """Whether `record` is in the slice."""
        if self.tags and not self.tags.items() <= record.tags.items():
            return False
        if self.sessions and record.session_id not in self.sessions:
            return False
        return not self.users or record.tags.get(USER_TAG) in self.users
