"""Wire models at the HTTP edge: what the OpenAI, Anthropic and Reef routes accept.

These validate types and ranges only. Chat bodies are forwarded as the client sent them
(unknown fields pass through to an upstream), so the models allow extra fields; Reef's own
bodies forbid them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Whole-string patterns. Python code checks them with `fullmatch` (with `match`, `$` also matches
# before a trailing newline); pydantic's `pattern` runs them with Rust's regex, where the anchors
# mean the whole string.
SCENARIO_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"


class _Open(BaseModel):
    # strict: a string where a number belongs is an error, not a silent coercion
    model_config = ConfigDict(extra="allow", strict=True)


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(_Open):
    """OpenAI `POST /v1/chat/completions` body."""

    model: str
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    stream: bool = False
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    n: Annotated[int, Field(ge=1)] | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    stream_options: dict[str, Any] | None = None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class AnthropicMessage(_Open):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class AnthropicMessagesRequest(_Open):
    """Anthropic `POST /v1/messages` body."""

    model: str
    messages: Annotated[list[AnthropicMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)]
    system: str | list[dict[str, Any]] | None = None
    stream: bool = False
    temperature: Annotated[float, Field(ge=0, le=1)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=1)] | None = None
    stop_sequences: list[str] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None


class ResponsesRequest(_Open):
    """OpenAI `POST /v1/responses` body (fields the engines cannot use are accepted)."""

    model: str
    input: str | list[Any] | None = None
    instructions: str | list[Any] | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    reasoning: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    truncation: str | None = None
    user: str | None = None


# What only Reef writes, refused from clients: record tags under this prefix (the rollout arm,
# the injected harness), report `metadata.source` values of Reef's own reports (a judgment's,
# reef.judge.SOURCE), and report ids the judging worker takes (`judge_<record or report>`).
RESERVED_TAG_PREFIX = "reef."
RESERVED_SOURCES = frozenset({"judge"})
RESERVED_REPORT_ID_PREFIXES = ("judge_",)


class ReportIn(_Closed):
    """`POST /reef/report`: feedback on one or more receipts of the caller's scenario."""

    report_id: Annotated[str, Field(pattern=ID_PATTERN)] | None = Field(
        None, description="idempotency key: same id and content → same answer; else 409"
    )
    score: Annotated[float, Field(allow_inf_nan=False)] | None = None
    feedback: str | dict[str, Any] | None = None
    references: Annotated[list[str], Field(min_length=1, max_length=10_000)]
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("references")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("references must be unique receipts")
        return v

    @model_validator(mode="after")
    def _says_something(self) -> ReportIn:
        if self.score is None and self.feedback is None:
            raise ValueError("a report needs a score, feedback, or both")
        return self


class ScenarioIn(_Closed):
    name: Annotated[str, Field(pattern=SCENARIO_PATTERN)]
    description: Annotated[str, Field(max_length=2000)] | None = None


# --- answers of Reef's own routes (documented in the OpenAPI spec) ---------------------------


class ReleaseOut(BaseModel):
    """A release on a scenario's chain; `current` marks the head."""

    release_id: str
    parent_release_id: str | None
    seq: int
    current: bool
    kind: str = Field(description="base | adapter | checkpoint | harness")
    operation: str = Field(description="creation | training | rollback | promote")
    created_at: datetime
    model_uri: str | None = Field(None, description="the MLflow model version: models:/...")
    uri: str | None = Field(None, description="where the release's files are")
    content_hash: str | None = None
    recipe: str | None = None
    dataset_id: str | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    gate: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)


class CandidateOut(BaseModel):
    """A trained candidate: pending review, rejected by the gate, published, or failed."""

    release_id: str = Field(description="the id it takes on the chain when published")
    parent_release_id: str
    status: str = Field(
        description="pending | rejected | published | failed | superseded | canary | rolled_back"
    )
    kind: str
    created_at: datetime
    updated_at: datetime
    model_uri: str | None = None
    content_hash: str | None = None
    recipe: str | None = None
    dataset_id: str | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    gate: dict[str, Any] = Field(default_factory=dict)
    message: str | None = None
    operation: str = Field("training", description="training | harness: what it publishes as")
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="its release's metadata (a harness candidate's harness)"
    )


class ReleaseList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ReleaseOut]


class CandidateList(BaseModel):
    object: Literal["list"] = "list"
    data: list[CandidateOut]


class ReleaseRef(BaseModel):
    """Names a release (rollback) or a pending candidate (promote)."""

    model_config = ConfigDict(extra="forbid")
    release_id: str = Field(min_length=1, max_length=64)


class HarnessIn(BaseModel):
    """A new harness for a scenario: all of its files, or edits to the head's harness."""

    model_config = ConfigDict(extra="forbid")
    files: dict[str, str] | None = Field(
        None, description="path -> text: the whole harness (replaces the head's)"
    )
    edits: list[dict[str, Any]] | None = Field(
        None,
        description='edits of the head\'s harness: {"op": "create"|"update"|"remove", "path", '
        '"content"}',
    )


class TrainIn(BaseModel):
    """A plain-language ask that becomes a candidate harness change, held for review."""

    model_config = ConfigDict(extra="forbid")
    text: str = Field(
        min_length=1,
        max_length=4000,
        description="what the agent should do from now on, e.g. 'when I ask you to fix a bug, "
        "reproduce it with a failing test first'",
    )


class JobOut(BaseModel):
    """A job's state as it runs: poll `url` until `status` is done or failed."""

    id: str
    object: Literal["reef.job"] = "reef.job"
    scenario: str
    kind: str
    status: str = Field(description="queued | running | done | failed")
    request: dict[str, Any]
    steps: list[dict[str, Any]] = Field(description="progress so far, oldest first")
    candidate_id: str | None = Field(
        None, description="the candidate it made (promote it to release it)"
    )
    result: dict[str, Any] = Field(default_factory=dict)
    message: str | None = None
    created_at: datetime
    updated_at: datetime
    url: str


class LoadAdapterIn(BaseModel):
    """vLLM's /v1/load_lora_adapter body."""

    lora_name: str = Field(min_length=1, max_length=200)
    lora_path: str = Field(min_length=1, description="a directory or an artifact-store uri")


class UnloadAdapterIn(BaseModel):
    lora_name: str = Field(min_length=1, max_length=200)


class LoadWeightsIn(BaseModel):
    name: str = Field(min_length=1, max_length=200)
    path: str = Field(min_length=1, description="a checkpoint directory or artifact-store uri")


class VariantIn(BaseModel):
    name: str = Field(min_length=1, max_length=200)


class EngineGenerateIn(BaseModel):
    """One generation on a release's weights, outside any traffic: not recorded, no harness
    injected (the caller puts the harness it evaluates in `messages`)."""

    scenario: str = Field(pattern=SCENARIO_PATTERN)
    release_id: str | None = Field(None, description="whose weights answer; default: the head")
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int = Field(64, ge=1)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    seed: int | None = None


class RefreshIn(BaseModel):
    scenario: str = Field(pattern=SCENARIO_PATTERN)


class ScenarioOut(BaseModel):
    name: str
    description: str | None
    created_at: datetime
    head_release_id: str


class RecordOut(BaseModel):
    id: str
    scenario: str
    created_at: datetime
    route: str
    model: str
    stream: bool
    request: dict[str, Any]
    response: dict[str, Any]
    release_id: str
    prompt_token_ids: list[int] | None
    completion_token_ids: list[int] | None
    logprobs: list[float] | None
    topk: dict[str, Any] | None = Field(
        None,
        description="the engine's generation-time top-K per completion token, when it captured "
        "them: {k, ids, logprobs} (what the openclaw recipe's distillation term reads)",
    )
    timings: dict[str, float]
    tags: dict[str, str]
    session_id: str | None = Field(None, description="the conversation this exchange belongs to")
    turn: int | None = Field(None, description="0-based position in the session")
    parent_id: str | None = Field(
        None, description="the record whose request + answer this one's request continues"
    )


class RecordList(BaseModel):
    object: Literal["list"] = "list"
    data: list[RecordOut]
    has_more: bool
    last_id: str | None


class ReportOut(BaseModel):
    id: str
    scenario: str
    created_at: datetime
    references: list[str]
    score: float | None
    feedback: str | dict[str, Any] | None
    metadata: dict[str, Any]
    created: bool = Field(True, description="false when this answers a retry of a stored report")


class ReportList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ReportOut]
    has_more: bool
    last_id: str | None


class RolloutAbort(BaseModel):
    """Why an operator ends a canary early (recorded on the rollback release)."""

    model_config = ConfigDict(extra="forbid")
    reason: str = Field("aborted by an operator", min_length=1, max_length=2000)


class ShadowRecordOut(BaseModel):
    """A shadow rollout's answer to a copy of record `record_id`'s request (never shown to its
    user), with both answers' scores on one scorer."""

    id: str
    scenario: str
    created_at: datetime
    record_id: str
    release_id: str
    control_release_id: str
    response: dict[str, Any] | None
    timings: dict[str, float]
    score: float | None
    control_score: float | None
    scored_by: str | None
    error: str | None


class ShadowRecordList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ShadowRecordOut]
    has_more: bool
    last_id: str | None


class RolloutPromote(BaseModel):
    """Which release an operator keeps when ending an A/B split (default: b)."""

    model_config = ConfigDict(extra="forbid")
    release_id: str | None = Field(None, description="ab: a or b's release id; canary: unused")


class RolloutOut(BaseModel):
    """A live rollout: its arms, the sequential test's verdict now, and the guardrail's word.
    For an A/B split, canary_release_id is b and control_release_id is a, `arms` holds each
    one's numbers and the verdict is never acted on (outcome "running")."""

    scenario: str
    mode: str = Field("canary", description="canary | shadow | ab")
    canary_release_id: str
    control_release_id: str
    share: float
    sticky: str
    started_at: str
    verdict: dict[str, Any] = Field(
        description="outcome (continue | promote | rollback | inconclusive; ab: running), "
        "action, reason, per-arm counts and means, the difference's anytime-valid interval"
    )
    arms: dict[str, Any] | None = Field(
        None, description="ab: per arm (a, b) its release, n, mean and anytime-valid interval"
    )
    abort: str | None = Field(None, description="why the guardrail would abort it now")
    health: dict[str, Any] | None = None
