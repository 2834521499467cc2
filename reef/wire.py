"""Wire models at the HTTP edge: what the OpenAI, Anthropic and Reef routes accept.

These validate types and ranges only. Chat bodies are forwarded as the client sent them
(unknown fields pass through to an upstream), so the models allow extra fields; Reef's own
bodies forbid them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

# Whole-string patterns. Python code checks them with `fullmatch` (with `match`, `$` also matches
# before a trailing newline); pydantic's `pattern` runs them with Rust's regex, where the anchors
# mean the whole string.
SCENARIO_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"


def _whole(value: Any) -> Any:
    """6.0 as 6: JSON has one number type, and JSON Schema's `integer` is any number with no
    fraction. Strings, booleans and fractions stay errors."""
    if type(value) is float and value.is_integer():
        return int(value)
    return value


# On an integer field of a wire model, after its constraints (before them, pydantic would write
# them into the JSON schema under their own names): strict mode alone would refuse 6.0.
WHOLE = BeforeValidator(_whole)


class _Open(BaseModel):
    # strict: a string where a number belongs is an error, not a silent coercion
    model_config = ConfigDict(extra="allow", strict=True)


def _examples(*examples: dict[str, Any]) -> ConfigDict:
    """An open model's config with request examples for the spec (Swagger's "Try it out"
    starts from them)."""
    return ConfigDict(extra="allow", strict=True, json_schema_extra={"examples": list(examples)})


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

    model_config = _examples(
        {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16},
        {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "stream": True},
    )

    model: str
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    stream: bool = False
    max_tokens: Annotated[int, Field(ge=1), WHOLE] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1), WHOLE] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    n: Annotated[int, Field(ge=1), WHOLE] | None = None
    stop: str | list[str] | None = None
    seed: Annotated[int, WHOLE] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20), WHOLE] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = Field(
        None,
        description='structured output: {"type": "json_object"} or {"type": "json_schema", '
        '"json_schema": {"name", "schema"}}, enforced while decoding by the embedded engine '
        "(400 when it cannot be); passed on by the vllm and upstream engines",
    )
    stream_options: dict[str, Any] | None = None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class AnthropicMessage(_Open):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class AnthropicMessagesRequest(_Open):
    """Anthropic `POST /v1/messages` body."""

    model_config = _examples(
        {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16}
    )

    model: str
    messages: Annotated[list[AnthropicMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1), WHOLE]
    system: str | list[dict[str, Any]] | None = None
    stream: bool = False
    temperature: Annotated[float, Field(ge=0, le=1)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=1), WHOLE] | None = None
    stop_sequences: list[str] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None


class ResponsesRequest(_Open):
    """OpenAI `POST /v1/responses` body (fields the engines cannot use are accepted)."""

    model_config = _examples({"model": "smollm2", "input": "Hi", "max_output_tokens": 16})

    model: str
    input: str | list[Any] | None = None
    instructions: str | list[Any] | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    max_output_tokens: Annotated[int, Field(ge=1), WHOLE] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20), WHOLE] | None = None
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

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        # what _says_something checks, for the spec
        json_schema_extra={
            "anyOf": [
                {"required": ["score"], "properties": {"score": {"type": "number"}}},
                {"required": ["feedback"], "properties": {"feedback": {"not": {"type": "null"}}}},
                {"required": ["metrics"], "properties": {"metrics": {"minProperties": 1}}},
            ]
        },
    )

    report_id: Annotated[str, Field(pattern=ID_PATTERN)] | None = Field(
        None, description="idempotency key: same id and content → same answer; else 409"
    )
    score: Annotated[float, Field(allow_inf_nan=False)] | None = None
    feedback: str | dict[str, Any] | None = None
    metrics: dict[str, bool | Annotated[float, Field(allow_inf_nan=False)] | str] = Field(
        default_factory=dict,
        description="named metrics the scenario declares (metrics.<name> in its settings): "
        "boolean, a number in the metric's range, or one of a categorical metric's values",
    )
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
        if self.score is None and self.feedback is None and not self.metrics:
            raise ValueError("a report needs a score, feedback or metrics")
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

    model_config = ConfigDict(
        extra="forbid",
        # one of the two, not both (the route checks it)
        json_schema_extra={
            "oneOf": [
                {"required": ["files"], "properties": {"files": {"type": "object"}}},
                {"required": ["edits"], "properties": {"edits": {"type": "array"}}},
            ]
        },
    )
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
    metrics: dict[str, bool | float | str] = Field(default_factory=dict)
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


# --- errors and the answers of the inference routes (the OpenAPI spec's response schemas) ----


class ErrorDetail(BaseModel):
    message: str
    type: str = Field(
        description="invalid_request_error | authentication_error | permission_error | "
        "not_found_error | conflict_error | rate_limit_error (or requests | tokens: the quota "
        "at its limit) | server_error | upstream_error"
    )
    code: str | None = Field(None, description="a short machine-readable reason")
    param: str | None = Field(None, description="the offending field, when one is")


class ErrorOut(BaseModel):
    """Every failure's body, in OpenAI's error shape. On /v1/messages it also carries
    `"type": "error"`, which makes the same body parse as an Anthropic error."""

    type: Literal["error"] | None = Field(None, description="/v1/messages only")
    error: ErrorDetail


class _Answer(BaseModel):
    # What an engine or an upstream adds beyond these fields passes through to the client.
    model_config = ConfigDict(extra="allow")


class ChatChoice(_Answer):
    index: int
    message: dict[str, Any] = Field(
        description="the assistant's message: role, content, tool_calls"
    )
    finish_reason: str | None


class ChatCompletionOut(_Answer):
    """OpenAI's `chat.completion`; with `stream: true` the answer is instead an SSE stream of
    `chat.completion.chunk` objects ending with `data: [DONE]`."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: dict[str, Any] | None = None


class AnthropicMessageOut(_Answer):
    """Anthropic's Messages response; with `stream: true` the answer is instead its SSE event
    stream (message_start … message_stop)."""

    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[dict[str, Any]] = Field(description="text and tool_use blocks")
    stop_reason: str | None
    stop_sequence: str | None
    usage: dict[str, Any]


class ResponseObject(_Answer):
    """OpenAI's Responses `response` object; with `stream: true` the answer is instead an SSE
    stream of `response.*` events ending with `response.completed` (or `.incomplete`)."""

    id: str
    object: Literal["response"]
    created_at: float
    status: str = Field(description="completed | incomplete | in_progress | failed")
    model: str
    output: list[dict[str, Any]] = Field(description="message and function_call items")
    usage: dict[str, Any] | None = None


class ModelOut(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelOut]


# --- answers of Reef's other routes ----------------------------------------------------------


class ScenarioList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ScenarioOut]


class ScenarioDeletion(BaseModel):
    """A deleted scenario whose files or MLflow entries are still to remove (`reef gc`)."""

    object: Literal["scenario.deletion"] = "scenario.deletion"
    scenario: str
    status: Literal["pending"] = "pending"
    message: str


class HarnessOut(BaseModel):
    """The harness a release (or a candidate) carries: its manifest and, unless
    `content=false`, its files' text."""

    object: Literal["harness"] = "harness"
    scenario: str
    release_id: str
    parent_release_id: str | None
    current: bool
    content_hash: str | None
    inject: bool = Field(description="whether serving puts it into the requests")
    files: list[dict[str, Any]] = Field(description="path, sha256, bytes (and content)")
    skills: list[dict[str, Any]] = Field(description="name, description, path of its SKILL.md")
    executable: list[str] = Field(description="files that run code: released only on review")
    evaluation: dict[str, Any] = Field(description="the release's gate and metrics")
    candidate: dict[str, Any] | None = Field(
        None, description="a candidate's status and message (when release_id names one)"
    )


class VariantLoaded(_Answer):
    name: str
    loaded: bool = Field(description="false: a variant of that name was loaded already")
    seconds: float | None = None


class VariantUnloaded(BaseModel):
    name: str
    unloaded: bool


class VariantVerified(_Answer):
    """A smoke generation's result (the engine adds what it measured)."""

    name: str
    verified: bool


class ScenarioRefreshed(BaseModel):
    scenario: str
    refreshed: bool


class GenerationOut(BaseModel):
    object: Literal["reef.generation"] = "reef.generation"
    release_id: str
    model: str
    text: str
    finish_reason: str | None
    usage: dict[str, Any] | None


class VariantList(BaseModel):
    object: Literal["list"] = "list"
    data: list[str]


class Liveness(BaseModel):
    status: Literal["ok"] = "ok"


class DependencyState(BaseModel):
    """One dependency's state in /readyz."""

    state: Literal["ok", "busy", "unavailable", "off", "unchecked"] = Field(
        description="busy (the engine): serving, its line of waiting calls full or nearly, "
        "calls beyond engine.max_queue answered 429; off: not configured; unchecked: a kind "
        "of it that is not checked"
    )
    needed_to: Literal["serve", "learn"] = Field(
        description="serve: the process is not ready without it; learn: only degraded"
    )
    reason: str | None = Field(default=None, description="why it is unavailable")


class Readiness(_Answer):
    """Whether this process can serve now, and the state of what it depends on."""

    status: Literal["ready", "degraded", "not_ready"] = Field(
        description="not_ready (503): the store or the engine is down; degraded (200): the "
        "engine is busy (still serving), or the artifact store, MLflow or the evolve worker is "
        "down"
    )
    dependencies: dict[str, DependencyState] = Field(
        default_factory=dict,
        description="store, engine, artifact_store, mlflow, worker: each one's state",
    )
