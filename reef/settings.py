"""Service settings: defaults < YAML file (`reef serve -c`) < REEF_* environment < CLI flags."""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from reef.errors import ConfigError
from reef.recipe import RECIPES, distributed_refusal, recipe_class

_DOTTED = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


_HOST_NAME = re.compile(r"(\*\.)?[a-z0-9_-]+(\.[a-z0-9_-]+)*\.?")


def host_name(text: str) -> str:
    """A host name as a Host header carries it, without a port: lower case, IPv6 addresses in
    brackets; `*` (any host) and `*.example.com` (its subdomains) pass as they are."""
    name = text.strip().lower()
    if name == "*":
        return name
    bare = name.removeprefix("[").removesuffix("]")
    try:
        address = ipaddress.ip_address(bare)
    except ValueError:
        pass
    else:
        return f"[{address}]" if address.version == 6 else str(address)
    if not _HOST_NAME.fullmatch(name):
        raise ValueError(f"'{text}' is not a host name (give names without scheme or port)")
    return name.rstrip(".")


class ServerSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8900, ge=0, le=65535)
    state_dir: Path = Path(".reef")
    default_scenario: str = "default"
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="request body size cap")
    max_tokens_cap: int = Field(4096, ge=1, description="largest max_tokens a request may ask")
    max_n: int = Field(4, ge=1, description="largest n (choices per request) a request may ask")
    max_stop: int = Field(4, ge=0, description="most stop strings (stop, stop_sequences)")
    max_stop_chars: int = Field(256, ge=1, description="longest stop string, in characters")
    max_messages: int = Field(1024, ge=1, description="most messages in one request")
    max_tools: int = Field(128, ge=0, description="most tool definitions in one request")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    allowed_hosts: tuple[str, ...] = Field(
        (),
        description="Host header names answered besides loopback (and the bound host), any "
        "port; '*.example.com' for subdomains, '*' for any; others get 421",
    )
    metrics_token: SecretStr | None = Field(
        None, description="/metrics answers only `Authorization: Bearer <this>` when set"
    )
    metrics_scenario_labels: bool | None = Field(
        None,
        description="label /metrics series by scenario (names are visible to whoever scrapes); "
        "null: only when metrics_token is set",
    )

    @field_validator("state_dir")
    @classmethod
    def _expand_state_dir(cls, v: Path) -> Path:
        return v.expanduser()

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(host_name(h) for h in v)

    @property
    def scenario_labels(self) -> bool:
        """Whether /metrics names scenarios (see metrics_scenario_labels)."""
        if self.metrics_scenario_labels is None:
            return self.metrics_token is not None
        return self.metrics_scenario_labels

    @property
    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


class EngineSettings(_Section):
    kind: Literal["embedded", "upstream", "vllm"] = "embedded"
    model: str = Field("smollm2", description="smollm2, tiny, or a local Hugging Face model dir")
    upstream_url: str | None = Field(None, description="OpenAI base URL ending in /v1")
    upstream_model: str | None = Field(None, description="model name sent to the upstream")
    upstream_api_key: SecretStr | None = None
    upstream_timeout_s: float = Field(600.0, gt=0)
    max_batch_size: int = Field(8, ge=1, description="embedded: requests decoded together")
    default_max_tokens: int = Field(
        256,
        ge=1,
        description="max_tokens when a request names none (every engine; at most "
        "server.max_tokens_cap)",
    )
    passthrough_extensions: tuple[str, ...] = Field(
        (),
        description="vLLM extensions of the OpenAI body (ignore_eos, min_tokens, ...) that "
        "clients may send; any other is refused with 400",
    )
    threads: int | None = Field(None, ge=1, description="embedded: torch threads")
    prefill_chunk_tokens: int = Field(
        128,
        ge=0,
        description="embedded: prompt tokens read per decode round while requests decode, so "
        "that a long prompt does not stall the running batch for its whole prefill; 0: "
        "prompts read whole",
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="embedded: precision of the served weights; bfloat16 (CPUs with "
        "avx512_bf16/AMX) decodes ~1.3x faster than packed float32 here, its greedy tokens may "
        "differ from float32's "
        "(bench/embedded_batching.py --precision measures it); recorded log-probs are then "
        "the bfloat16 model's",
    )
    prefix_cache_mb: int = Field(
        0,
        ge=0,
        description="embedded: memory for the keys and values of prompts' openings (a "
        "scenario's system prompt and harness text), reused by prompts that open the same; "
        "their log-probs then differ from a full read's in the last digits; 0: off",
    )
    packed_linear: bool = Field(
        True,
        description="embedded: Linear layers run through oneDNN with weights packed once "
        "(2-3x faster products on some x86 machines; float32 log-probs agree with plain layers "
        "to ~1e-4; a second copy of the weights in memory), except calls of as few rows as a "
        "timing at load found faster plain",
    )
    fuse_prefill: bool = Field(
        True,
        description="embedded: a prompt chunk read while requests decode goes through the model "
        "in one forward pass with their decode step (fewer passes over the weights: a shorter "
        "gap between their tokens); used where the model passes a self-check at load",
    )
    itl_target_ms: float | None = Field(
        None,
        gt=0,
        description="embedded: the gap between a decoding stream's tokens to keep while prompts "
        "are read: each round reads as much of a prompt longer than prefill_chunk_tokens as "
        "its measured cost leaves room for (at least one token, at most prefill_chunk_tokens), "
        "so a long prompt arriving mid-batch waits longer for its first token instead of "
        "slowing the streams; shorter prompts are read at once, first; unset: chunks of "
        "prefill_chunk_tokens",
    )
    itl_headroom: float | None = Field(
        None,
        gt=0,
        description="embedded: like itl_target_ms, relative to the machine: a round that reads "
        "part of a long prompt is kept within this much longer than a decode round of as many "
        "streams that reads none, by measured round times (0.15: 15 %), whatever the CPU's "
        "speed and the batch's size; with itl_target_ms too, the tighter of the two; unset: no "
        "relative limit",
    )
    itl_max_wait_ms: float = Field(
        10_000,
        ge=0,
        description="embedded, paced (itl_target_ms or itl_headroom): how long a long prompt "
        "waits while not even one of its tokens fits a round, for the streams to end (it is "
        "then read whole) or for room, before it is read a token a round regardless; 0: never "
        "wait",
    )
    model_cache: Path = Field(
        Path.home() / ".cache" / "reef" / "models",
        description="where the tiny model is generated and SmolLM2 is converted (shared by state dirs)",
    )
    upstream_capture_tokens: bool = Field(
        False,
        description="ask the upstream for token ids and log-probs (vLLM's return_token_ids, logprobs)",
    )
    upstream_responses: bool = Field(
        False,
        description="upstream: POST /v1/responses goes unchanged to the upstream's own "
        "/v1/responses (it serves the Responses API), still recorded with receipts",
    )

    vllm_url: str | None = Field(
        None, description="vllm: a running vLLM server's root URL (no /v1); unset: launch one"
    )
    vllm_python: Path = Field(
        Path(".venv-vllm/bin/python"),
        description="vllm: the python of vLLM's own environment (`make vllm-venv` builds it)",
    )
    vllm_args: tuple[str, ...] = Field(
        (), description="vllm: extra `vllm serve` arguments when Reef launches it"
    )
    vllm_start_timeout_s: float = Field(600.0, gt=0, description="vllm: wait for /health")
    vllm_weight_sync: Literal["reload", "nccl"] = Field(
        "reload",
        description="vllm: how full weights move: workers reload the checkpoint (any build), "
        "or NCCL from a sender process (CUDA)",
    )
    vllm_max_loras: int = Field(4, ge=1, description="vllm: adapters in one batch (--max-loras)")
    vllm_max_lora_rank: int = Field(64, ge=1, description="vllm: --max-lora-rank")
    vllm_api_key: SecretStr | None = Field(
        None,
        description="vllm: the API key of the vLLM at vllm_url; a launched vLLM gets this one, "
        "or a random one when unset",
    )
    vllm_host: str = Field(
        "127.0.0.1", description="vllm: the address a launched vLLM binds (--host)"
    )
    sampling_defaults: dict[str, float] | None = Field(
        None,
        description="temperature / top_p given to a request that leaves them out. Unset: "
        "embedded applies the model's generation_config.json (as vLLM does itself), upstream "
        "and vllm send nothing; {} applies none",
    )
    allow_local_paths: bool = Field(
        False,
        description="the admin load routes also take any local directory, not only the "
        "artifact-store files of the named scenario's releases and candidates",
    )
    admin_urls: tuple[str, ...] = Field(
        (),
        description="admin URLs of every engine that serves the scenarios (reef serve "
        "replicas, or vLLM servers behind a Reef): a deploy stages and verifies on all of them "
        "before the head moves; empty: the one at reef.engine_url",
    )
    registry: bool = Field(
        False,
        description="reef serve registers its engine in the database with a heartbeat, and "
        "deploys also reach every registered engine whose heartbeat is fresh",
    )
    advertise_url: str | None = Field(
        None,
        description="registry: the admin URL other processes reach this server at; default: "
        "http://<server.host>:<server.port>",
    )
    registry_allow: tuple[str, ...] = Field(
        (),
        description="registry: host names of registered engines that deploys reach (and send "
        "reef.engine_token to), '*.example.com' for subdomains, '*' for any; off loopback only "
        "https URLs; loopback engines are always reached",
    )
    heartbeat_s: float = Field(10.0, gt=0, description="registry: how often it says it is alive")
    registry_ttl_s: float = Field(
        30.0,
        gt=0,
        description="registry: a registered engine silent this long is left out of deploys "
        "(it loads the head when it starts again)",
    )

    @field_validator("model_cache", "vllm_python")
    @classmethod
    def _expand_cache(cls, v: Path) -> Path:
        return v.expanduser()

    @field_validator("sampling_defaults")
    @classmethod
    def _sampling_ranges(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        unknown = sorted(set(v or ()) - {"temperature", "top_p"})
        if unknown:
            raise ValueError(f"sampling_defaults takes temperature and top_p, not {unknown}")
        if v and not 0 <= v.get("temperature", 0) <= 2:
            raise ValueError("sampling_defaults.temperature must be between 0 and 2")
        if v and not 0 < v.get("top_p", 1) <= 1:
            raise ValueError("sampling_defaults.top_p must be in (0, 1]")
        return v

    @field_validator("vllm_url")
    @classmethod
    def _root_url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://", v):
            raise ValueError("vllm_url must be an http(s) URL (the server's root, without /v1)")
        return v.rstrip("/").removesuffix("/v1") if v else v

    @field_validator("admin_urls")
    @classmethod
    def _admin_urls(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(_server_root(url) for url in v))

    @field_validator("registry_allow")
    @classmethod
    def _registry_names(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(host_name(h) for h in v)

    @field_validator("advertise_url")
    @classmethod
    def _advertise_url(cls, v: str | None) -> str | None:
        return _server_root(v) if v is not None else v

    @field_validator("upstream_url")
    @classmethod
    def _v1_url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://", v):
            raise ValueError("upstream_url must be an http(s) URL ending in /v1")
        return v.rstrip("/") if v else v


def _server_root(url: str) -> str:
    """An engine's admin URL: a server's http(s) root, without a trailing slash."""
    if not re.match(r"^https?://[^/]", url):
        raise ValueError(f"'{url}' is not an http(s) URL (a server's root)")
    return url.rstrip("/")


class StoreSettings(_Section):
    # Secret: a Postgres URL may carry a password (Settings.database_url is the plain value).
    database_url: SecretStr | None = Field(
        None, description="sqlite:///path or postgresql+psycopg://...; default: state_dir/reef.db"
    )
    commit_window_ms: float = Field(
        0.0,
        ge=0,
        description="group commit: extra wait for company before a commit (0: natural batching only)",
    )
    commit_max_batch: int = Field(512, ge=1)
    retention_days: float | None = Field(
        None,
        gt=0,
        description="archive records and reports older than this to parquet in the artifact "
        "store, then delete their rows (reef.retention); None: keep forever",
    )
    retention_batch: int = Field(
        5000, ge=1, description="rows archived and deleted per transaction (short locks)"
    )


class ArtifactSettings(_Section):
    url: str | None = Field(
        None, description="directory or s3://bucket/prefix; default: state_dir/artifacts"
    )
    s3_endpoint_url: str | None = Field(
        None, description="S3-compatible server (MinIO, ...); default: AWS"
    )
    s3_region: str | None = Field(None, description="S3 region; default: boto3's chain")


class TokenSettings(_Section):
    name: str
    sha256: str = Field(description="hex sha256 of the token; `reef token` makes one")
    admin: bool = False
    scenarios: tuple[str, ...] = ()

    @field_validator("sha256")
    @classmethod
    def _hex(cls, v: str) -> str:
        v = v.removeprefix("sha256:").lower()
        if not re.fullmatch(r"[0-9a-f]{64}", v):
            raise ValueError("sha256 must be 64 hex digits (the token's hash, not the token)")
        return v


class AuthSettings(_Section):
    tokens: tuple[TokenSettings, ...] = ()
    secure_cookie: bool | None = Field(
        None,
        description="the dashboard's session cookie is Secure (browsers send it over https "
        "only); null: on when tokens are configured and server.host is not loopback (a TLS "
        "proxy in front), else only for requests that came over https",
    )


class TrainSettings(_Section):
    """How a weights recipe's training runs on the worker host (recipes.distributed)."""

    processes: int = Field(
        1,
        ge=1,
        description="training processes on the worker host; > 1 runs the recipe under "
        "`accelerate launch` with DDP (gloo on CPU, NCCL on GPUs): sft, kto, dpo",
    )
    accelerate_config: Path | None = Field(
        None,
        description="an `accelerate config` YAML (multi-GPU, FSDP, DeepSpeed) on the worker "
        "host, for processes > 1; None: plain DDP over the host's GPUs, or its CPU",
    )


class LoopSettings(_Section):
    """The learning loop's keys (the seed's `reef:` section); used from the experience stream on."""

    recipe: str = "sft"
    batch_size: int = Field(32, ge=1)
    max_staleness: int = Field(0, ge=0, description="releases behind the head a sample may be")
    params: dict[str, Any] = Field(
        default_factory=dict, description="the recipe's hyper-parameters, overriding its defaults"
    )
    auto: bool = Field(
        True, description="start the evolve flow when a scenario has batch_size eligible samples"
    )
    engine_url: str | None = Field(
        None,
        description="admin URL of the serving engine that deploys go to; default: this server",
    )
    engine_token: SecretStr | None = Field(
        None,
        description="admin token deploys send to engine_url / engine.admin_urls, which reef "
        "serve also accepts on its admin routes (unset: it makes one for its worker)",
    )
    schedule_s: float | None = Field(
        None, gt=0, description="also check every scenario for a ready batch this often"
    )
    train_threads: int | None = Field(
        1,
        ge=1,
        description="torch threads for training and evaluation (None: torch's default); "
        "1 leaves the other cores to the serving engine",
    )
    seed: int = 0
    train: TrainSettings = TrainSettings()

    @field_validator("recipe")
    @classmethod
    def _recipe(cls, v: str) -> str:
        if v not in RECIPES and not _DOTTED.fullmatch(v):
            names = ", ".join(sorted(RECIPES))
            raise ValueError(f"recipe must be one of {names} or a dotted path pkg.module:Class")
        return v

    @model_validator(mode="after")
    def _distributed(self) -> LoopSettings:
        """A recipe that cannot train in several processes is refused at start, not when its
        first batch is ready."""
        if self.train.processes > 1:
            refused = distributed_refusal(recipe_class(self.recipe), self.train.processes)
            if refused:
                raise ValueError(refused)
        return self


class GuardSettings(_Section):
    """A fixed task set the candidate must not get significantly worse on (reef.gate)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="named in a rejection")
    dataset: Path = Field(description="JSONL of {messages, answer?, ...} tasks")
    scorer: str = Field(
        "contains",
        description="exact | contains (the task's `answer` column) | pkg.module:function",
    )
    max_drop: float = Field(0.0, ge=0.0, description="mean score drop allowed before it counts")

    @field_validator("scorer")
    @classmethod
    def _scorer(cls, v: str) -> str:
        if v not in ("exact", "contains") and not _DOTTED.fullmatch(v):
            raise ValueError("scorer must be exact, contains or a dotted path pkg.module:func")
        return v


class GateSettings(_Section):
    """When a candidate may replace the head (reef.gate)."""

    policy: Literal["always", "improve", "manual"] = "improve"
    margin: float = Field(0.0, description="improve: least mean improvement per eval sample")
    confidence: float = Field(0.9, gt=0.5, lt=1.0, description="improve: paired test confidence")
    test: Literal["bootstrap", "sign"] = "bootstrap"
    bootstrap_samples: int = Field(2000, ge=100)
    holdout: float = Field(
        0.25, ge=0.0, lt=1.0, description="fraction of a batch held out to evaluate on"
    )
    eval_dataset: Path | None = Field(
        None, description="JSONL of {messages, ...} tasks scored by `scorer` instead of held-out"
    )
    scorer: str | None = Field(
        None, description="pkg.module:function scoring answers to eval_dataset; default: recipe's"
    )
    max_tokens: int = Field(64, ge=1, description="eval_dataset: tokens generated per answer")
    approval_timeout_s: float = Field(
        7 * 24 * 3600.0, gt=0, description="manual: how long a pending candidate waits"
    )
    guards: tuple[GuardSettings, ...] = Field(
        (), description="task sets a candidate must not break, whatever the policy"
    )

    @field_validator("guards")
    @classmethod
    def _unique_guards(cls, v: tuple[GuardSettings, ...]) -> tuple[GuardSettings, ...]:
        names = [g.name for g in v]
        if len(set(names)) != len(names):
            raise ValueError(f"guard names must be unique, got {names}")
        return v


class JudgeSettings(_Section):
    """Who turns next turns and text-only reports into scored reports (reef.judge), in the
    worker. Default judge: the scenario's served head through the engine's admin generate
    route; `url` + `model` name any OpenAI-compatible /v1 instead; `function` a rule judge."""

    enabled: bool | None = Field(
        None, description="judge in the worker; null: when the recipe is openclaw"
    )
    function: str | None = Field(
        None, description="pkg.module:fn(task, exchange, sample) -> the judge's raw answer"
    )
    url: str | None = Field(None, description="an OpenAI-compatible judge's base URL (/v1)")
    model: str | None = Field(None, description="the model name sent to `url`")
    api_key: SecretStr | None = Field(None, description="the key for `url` (REEF_JUDGE__API_KEY)")
    votes: int = Field(3, ge=1, description="m: answers per question, plurality wins")
    temperature: float = Field(0.6, ge=0.0)
    max_tokens: int = Field(512, ge=1)
    timeout_s: float = Field(120.0, gt=0, description="per judged turn (all its answers)")
    concurrency: int = Field(8, ge=1, description="turns judged at once")
    session_ttl_s: float = Field(
        900.0, gt=0, description="a last turn with no next turn after this long is retired"
    )
    poll_s: float = Field(2.0, gt=0, description="how often the worker looks for new turns")

    @field_validator("function")
    @classmethod
    def _dotted(cls, v: str | None) -> str | None:
        if v is not None and not _DOTTED.fullmatch(v):
            raise ValueError("judge.function must be a dotted path pkg.module:function")
        return v


class ShadowSettings(_Section):
    """rollout.mode shadow: the candidate answers copies of a sample of calls, off the request
    path, and the copies are scored against the head's answers (reef.shadow)."""

    sample: float = Field(0.1, gt=0.0, le=1.0, description="share of calls copied to it")
    max_concurrency: int = Field(
        4, ge=1, description="shadow calls in flight per process; a copy beyond it is dropped"
    )
    scorer: str | None = Field(
        None,
        description="pkg.module:fn(completions, prompts=...) -> list[float] in [0, 1] scoring "
        "each answer; default gate.scorer, else the judge (judge.function or judge.url)",
    )

    @field_validator("scorer")
    @classmethod
    def _dotted(cls, v: str | None) -> str | None:
        if v is not None and not _DOTTED.fullmatch(v):
            raise ValueError("shadow.scorer must be a dotted path pkg.module:function")
        return v


class ABSettings(_Section):
    """rollout.mode ab: a fixed, sticky split between two named releases, kept until an
    operator ends it (reef.rollouts)."""

    releases: tuple[str, ...] = Field(
        (), description="[a, b]: the two release ids compared (both on the scenario's chain)"
    )
    share: float = Field(0.5, gt=0.0, lt=1.0, description="share of sessions release b serves")

    @field_validator("releases")
    @classmethod
    def _pair(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if v and (len(v) != 2 or v[0] == v[1]):
            raise ValueError("ab.releases names two different release ids: [a, b]")
        return v


class RolloutSettings(_Section):
    """How an accepted release reaches live traffic (reef.rollouts); `scenarios` overrides any
    key per scenario."""

    mode: Literal["immediate", "canary", "shadow", "ab"] = Field(
        "immediate",
        description="immediate: the head moves at once; canary: a sticky share of sessions "
        "first, promoted or rolled back by a sequential test on their reports; shadow: the "
        "candidate answers copies of calls, scored against the head's, and the same test "
        "decides; ab: a fixed split between ab.releases until an operator ends it",
    )
    shadow: ShadowSettings = ShadowSettings()
    ab: ABSettings = ABSettings()
    share: float = Field(0.1, gt=0.0, lt=1.0, description="canary: share of sessions it serves")
    sticky: str = Field(
        "session",
        pattern=r"^(session|user|tag:[A-Za-z0-9_.-]+)$",
        description="what keeps one arm: session (x-reef-session-id, else the conversation's "
        "first message), user (x-reef-user-id), or tag:<name>",
    )
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="the sequential test's")
    margin: float = Field(0.0, ge=0.0, description="difference in mean score that counts")
    min_samples: int = Field(30, ge=1, description="reports per arm before a decision")
    max_duration_s: float = Field(24 * 3600.0, gt=0, description="then inconclusive")
    on_inconclusive: Literal["promote", "rollback"] = "rollback"
    max_error_rate_increase: float = Field(
        0.05, ge=0.0, description="guardrail: canary error rate above the control's"
    )
    max_p95_ratio: float = Field(2.0, gt=1.0, description="guardrail: canary p95 / control's")
    guard_min_requests: int = Field(20, ge=1, description="guardrail: canary calls to judge")
    check_interval_s: float = Field(5.0, gt=0, description="how often live rollouts are checked")
    scenarios: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="per-scenario overrides of the keys above"
    )

    def for_scenario(self, name: str) -> RolloutSettings:
        """The rollout keys of scenario `name`: the defaults with its overrides."""
        override = self.scenarios.get(name)
        if not override:
            return self
        base = self.model_dump(exclude={"scenarios"})
        merged = {**base, **override}
        for section in ("shadow", "ab"):  # a section's keys override one by one
            if isinstance(override.get(section), dict):
                merged[section] = {**base[section], **override[section]}
        try:
            return RolloutSettings.model_validate(merged)
        except ValidationError as e:
            raise ConfigError(f"rollout.scenarios.{name}: {_describe(e)}") from None


class TrackingSettings(_Section):
    # Secret: a database tracking store's URI may carry a password (Settings.tracking_uri).
    uri: SecretStr | None = Field(
        None, description="MLflow tracking URI; default: sqlite:///<state_dir>/mlflow.db"
    )
    artifact_location: str | None = Field(
        None, description="where MLflow stores run artifacts; default: <artifacts url>/mlflow"
    )


class PrefectSettings(_Section):
    ui_url: str | None = Field(
        None,
        description="the Prefect UI the dashboard links flow runs to; default: PREFECT_UI_URL, "
        "else PREFECT_API_URL without its /api suffix",
    )

    @field_validator("ui_url")
    @classmethod
    def _http(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// address")
        return v


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="REEF_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    server: ServerSettings = ServerSettings()
    engine: EngineSettings = EngineSettings()
    store: StoreSettings = StoreSettings()
    auth: AuthSettings = AuthSettings()
    reef: LoopSettings = LoopSettings()
    gate: GateSettings = GateSettings()
    artifacts: ArtifactSettings = ArtifactSettings()
    tracking: TrackingSettings = TrackingSettings()
    rollout: RolloutSettings = RolloutSettings()
    judge: JudgeSettings = JudgeSettings()
    prefect: PrefectSettings = PrefectSettings()

    @property
    def artifacts_url(self) -> str:
        return self.artifacts.url or str(self.server.state_dir / "artifacts")

    @property
    def tracking_uri(self) -> str:
        if self.tracking.uri:
            return self.tracking.uri.get_secret_value()
        return f"sqlite:///{(self.server.state_dir / 'mlflow.db').resolve()}"

    @property
    def prefect_ui_url(self) -> str | None:
        """The Prefect UI's address, for links to flow runs: `prefect.ui_url`, else Prefect's
        own PREFECT_UI_URL, else PREFECT_API_URL when it is a server's `.../api` (the UI is
        served beside it, as `prefect server start` does); None when none says where."""
        explicit = self.prefect.ui_url or os.environ.get("PREFECT_UI_URL") or ""
        if explicit.startswith(("http://", "https://")):  # never a javascript: link
            return explicit.rstrip("/")
        api = (os.environ.get("PREFECT_API_URL") or "").rstrip("/")
        if api.startswith(("http://", "https://")) and api.endswith("/api"):
            return api.removesuffix("/api")
        return None

    @property
    def mlflow_artifact_location(self) -> str:
        if self.tracking.artifact_location:
            return self.tracking.artifact_location
        base = self.artifacts_url
        if "://" in base:
            return base.rstrip("/") + "/mlflow"
        return (Path(base) / "mlflow").resolve().as_uri()

    @property
    def default_max_tokens(self) -> int:
        """engine.default_max_tokens, held to server.max_tokens_cap."""
        return min(self.engine.default_max_tokens, self.server.max_tokens_cap)

    @property
    def server_url(self) -> str:
        """This server's root URL, as a client on its host reaches it."""
        host = "127.0.0.1" if self.server.host in ("0.0.0.0", "::") else self.server.host
        return f"http://{host}:{self.server.port}"

    @property
    def engine_url(self) -> str:
        if self.reef.engine_url:
            return self.reef.engine_url.rstrip("/")
        return self.server_url

    @property
    def engine_advertise_url(self) -> str:
        """The admin URL this server registers (engine.registry)."""
        return self.engine.advertise_url or self.server_url

    @property
    def database_url(self) -> str:
        if self.store.database_url:
            return self.store.database_url.get_secret_value()
        return f"sqlite:///{self.server.state_dir / 'reef.db'}"


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


def _describe(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            lines.append(f"unknown key '{key}'")
        else:
            lines.append(f"{key}: {e['msg']}")
    return "; ".join(lines)


def load_settings(config: Path | str | None = None, **overrides: Any) -> Settings:
    """Build the settings once at start. `overrides` are CLI flags as nested dicts."""
    file_data = _read_yaml(Path(config)) if config else {}

    class _Layered(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return (init_settings, env_settings, InitSettingsSource(settings_cls, file_data))

    try:
        layered = _Layered(**overrides)
        # Only what was given (flags, env, file): the rest fills in from the defaults, so each
        # section's `model_fields_set` says what the operator chose (a recipe's default gate
        # applies only when no `gate.policy` was given).
        settings = Settings.model_validate(layered.model_dump(exclude_unset=True))
    except ValidationError as e:
        where = f" in {config}" if config else ""
        raise ConfigError(f"invalid settings{where}: {_describe(e)}") from None
    if not settings.server.is_loopback and not settings.auth.tokens:
        raise ConfigError(
            f"binding {settings.server.host} (not loopback) requires auth tokens: "
            "add auth.tokens to the config (`reef token` makes one)"
        )
    if settings.engine.registry_ttl_s <= settings.engine.heartbeat_s:
        raise ConfigError(
            "engine.registry_ttl_s must be longer than engine.heartbeat_s (a few heartbeats), "
            "or live engines drop out of deploys between two heartbeats"
        )
    if settings.engine.kind == "upstream" and not settings.engine.upstream_url:
        raise ConfigError("engine.kind 'upstream' needs engine.upstream_url (--upstream-url)")
    return settings


# Secrets: the settings typed SecretStr (a database URL may carry a password; tokens and API
# keys are secret outright). They never travel as command-line arguments, Prefect parameters or
# logged values: a child process gets them in its environment, a flow called in-process gets
# them as SecretStr (which Prefect's parameter serialization writes as '**********'), and a
# deployment run finds them where it runs (its settings file or REEF_* environment).
def secret_keys() -> frozenset[tuple[str, str]]:
    """(section, key) of every secret setting, e.g. ("store", "database_url")."""
    out = set()
    for section, field in Settings.model_fields.items():
        model = field.annotation
        if isinstance(model, type) and issubclass(model, BaseModel):
            for key, sub in model.model_fields.items():
                if SecretStr in (sub.annotation, *get_args(sub.annotation)):
                    out.add((section, key))
    return frozenset(out)


def split_secrets(overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Nested overrides (`load_settings`' shape) as (the rest, the secret settings)."""
    keys = secret_keys()
    public: dict[str, Any] = {}
    secret: dict[str, Any] = {}
    for section, value in overrides.items():
        if not isinstance(value, dict):
            public[section] = value
            continue
        for key, v in value.items():
            half = secret if (section, key) in keys else public
            half.setdefault(section, {})[key] = v
    return public, secret


def _plain(value: Any) -> str:
    return value.get_secret_value() if isinstance(value, SecretStr) else str(value)


def secret_environment(secret: dict[str, Any]) -> dict[str, str]:
    """The REEF_* environment variables that carry `secret` (split_secrets' second half) to a
    child process: what its settings read at the environment's precedence."""
    return {
        f"REEF_{section.upper()}__{key.upper()}": _plain(v)
        for section, values in secret.items()
        for key, v in values.items()
        if v is not None
    }


def conceal(overrides: dict[str, Any]) -> dict[str, Any]:
    """`overrides` with every secret value wrapped in SecretStr: for a flow called in this
    process, which gets the values, while the run's parameters Prefect stores show
    '**********'."""
    public, secret = split_secrets(overrides)
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in public.items()}
    for section, values in secret.items():
        for key, v in values.items():
            wrapped = v if v is None or isinstance(v, SecretStr) else SecretStr(str(v))
            out.setdefault(section, {})[key] = wrapped
    return out
