"""engine: which engine serves the model, one section per kind (embedded, upstream, vllm), and
the fleet of engines a deploy reaches.

Each key is described here once; the engines take their section whole and refer to it. The
keys before the sections (`engine.upstream_url`, `engine.max_batch_size`, ...) still load:
`nest_flat_keys` moves them to their section, and the caller logs the move."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator

from reef.settings.section import Section, server_root
from reef.settings.server import host_name

log = logging.getLogger(__name__)

# The connections Reef opens to an upstream or vLLM server (reef.engines.upstream's pool): the
# calls it runs at once unless engine.max_running says fewer.
UPSTREAM_CONNECTIONS = 512


class EmbeddedSettings(Section):
    """engine.embedded: the transformers engine inside `reef serve` (reef.engines.embedded)."""

    max_batch_size: int = Field(8, ge=1, description="requests decoded together")
    threads: int | None = Field(None, ge=1, description="torch threads; unset: torch's choice")
    prefill_chunk_tokens: int = Field(
        128,
        ge=0,
        description="prompt tokens read per decode round while requests decode, so that a long "
        "prompt does not stall the running batch for its whole prefill; 0: prompts read whole",
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="precision of the served weights (base model, checkpoints); bfloat16 (CPUs "
        "with avx512_bf16/AMX) decodes ~1.3x faster than packed float32 here, its greedy tokens "
        "may differ from float32's (bench/embedded_batching.py --precision measures it); "
        "recorded log-probs are then the bfloat16 model's",
    )
    # Off unless asked for: a prompt read from the cache gives log-probs that differ from a full
    # read's in the last digits (~1e-6), so the same request would no longer repeat them bit for
    # bit.
    prefix_cache_mb: int = Field(
        0,
        ge=0,
        description="memory for the keys and values of prompts' openings (a scenario's system "
        "prompt and harness text), reused by prompts that open the same; their log-probs then "
        "differ from a full read's in the last digits; 0: off",
    )
    packed_linear: bool = Field(
        True,
        description="Linear layers run through oneDNN with weights packed once "
        "(reef.engines.packed: 2-3x faster products on some x86 machines; float32 log-probs "
        "agree with plain layers to ~1e-4; a second copy of the weights in memory), except "
        "calls of as few rows as a timing at load found faster plain",
    )
    fuse_prefill: bool = Field(
        True,
        description="a prompt chunk read while requests decode goes through the model in one "
        "forward pass with their decode step (reef.engines.fused; fewer passes over the "
        "weights: a shorter gap between their tokens); used where the model passes a "
        "self-check at load",
    )
    itl_target_ms: float | None = Field(
        None,
        gt=0,
        description="the gap between a decoding stream's tokens to keep while prompts are read "
        "(reef.engines.pacing): each round reads as much of a prompt longer than "
        "prefill_chunk_tokens as its measured cost leaves room for (at least one token, at "
        "most prefill_chunk_tokens), so a long prompt arriving mid-batch waits longer for its "
        "first token instead of slowing the streams; shorter prompts are read at once, first; "
        "unset: chunks of prefill_chunk_tokens",
    )
    itl_headroom: float | None = Field(
        None,
        gt=0,
        description="like itl_target_ms, relative to the machine: a round that reads part of a "
        "long prompt is kept within this much longer than a decode round of as many streams "
        "that reads none, by measured round times (0.15: 15 %), whatever the CPU's speed and "
        "the batch's size; with itl_target_ms too, the tighter of the two; unset: no relative "
        "limit",
    )
    itl_max_wait_ms: float = Field(
        10_000,
        ge=0,
        description="paced (itl_target_ms or itl_headroom): how long a long prompt waits while "
        "not even one of its tokens fits a round, for the streams to end (it is then read "
        "whole) or for room, before it is read a token a round regardless; 0: never wait",
    )


class UpstreamSettings(Section):
    """engine.upstream: any OpenAI-compatible server Reef forwards to (reef.engines.upstream)."""

    url: str | None = Field(None, description="the upstream's OpenAI base URL, ending in /v1")
    model: str | None = Field(
        None, description="model name sent to the upstream; unset: the one its /models lists"
    )
    api_key: SecretStr | None = Field(None, description="bearer token sent to the upstream")
    timeout_s: float = Field(
        600.0,
        gt=0,
        description="how long one call to the upstream may take (the vllm engine's calls too)",
    )
    capture_tokens: bool = Field(
        False,
        description="ask the upstream for token ids and log-probs (vLLM's return_token_ids, "
        "logprobs)",
    )
    responses: bool = Field(
        False,
        description="POST /v1/responses goes unchanged to the upstream's own /v1/responses "
        "(it serves the Responses API), still recorded with receipts",
    )

    @field_validator("url")
    @classmethod
    def _v1_url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://", v):
            raise ValueError("must be an http(s) URL ending in /v1")
        return v.rstrip("/") if v else v


class VllmSettings(Section):
    """engine.vllm: a vLLM server Reef connects to, or launches (reef.engines.vllm)."""

    url: str | None = Field(
        None, description="a running vLLM server's root URL (no /v1); unset: launch one"
    )
    python: Path = Field(
        Path(".venv-vllm/bin/python"),
        description="the python of vLLM's own environment (`make vllm-venv` builds it)",
    )
    args: tuple[str, ...] = Field(
        (), description="extra `vllm serve` arguments when Reef launches it"
    )
    start_timeout_s: float = Field(
        600.0, gt=0, description="how long a launched vLLM may take to answer /health"
    )
    weight_sync: Literal["reload", "nccl"] = Field(
        "reload",
        description="how full weights move: workers reload the checkpoint (any build), or NCCL "
        "from a sender process (CUDA)",
    )
    max_loras: int = Field(4, ge=1, description="adapters in one batch (--max-loras)")
    max_lora_rank: int = Field(64, ge=1, description="largest adapter rank (--max-lora-rank)")
    api_key: SecretStr | None = Field(
        None,
        description="the API key of the vLLM at url; a launched vLLM gets this one, or a "
        "random one when unset",
    )
    host: str = Field("127.0.0.1", description="the address a launched vLLM binds (--host)")

    @field_validator("python")
    @classmethod
    def _expand(cls, v: Path) -> Path:
        return v.expanduser()

    @field_validator("url")
    @classmethod
    def _root_url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://", v):
            raise ValueError("must be an http(s) URL (the server's root, without /v1)")
        return v.rstrip("/").removesuffix("/v1") if v else v


class FleetSettings(Section):
    """engine.fleet: every engine a deploy stages and verifies on before the head moves
    (deploy.engine): a fixed list, or engines that register themselves."""

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
        "(it loads the head when it starts again); longer than heartbeat_s",
    )

    @field_validator("admin_urls")
    @classmethod
    def _admin_urls(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(server_root(url) for url in v))

    @field_validator("registry_allow")
    @classmethod
    def _registry_names(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(host_name(h) for h in v)

    @field_validator("advertise_url")
    @classmethod
    def _advertise_url(cls, v: str | None) -> str | None:
        return server_root(v) if v is not None else v

    @model_validator(mode="after")
    def _ttl_spans_heartbeats(self) -> FleetSettings:
        if self.registry_ttl_s <= self.heartbeat_s:
            raise ValueError(
                "registry_ttl_s must be longer than heartbeat_s (a few heartbeats), or live "
                "engines drop out of deploys between two heartbeats"
            )
        return self


# The engine's keys before it had sections: flat key -> (section, key). They still load.
FLAT_KEYS: dict[str, tuple[str, str]] = {
    **{
        key: ("embedded", key)
        for key in (
            "max_batch_size",
            "threads",
            "prefill_chunk_tokens",
            "dtype",
            "prefix_cache_mb",
            "packed_linear",
            "fuse_prefill",
            "itl_target_ms",
            "itl_headroom",
            "itl_max_wait_ms",
        )
    },
    **{
        f"upstream_{key}": ("upstream", key)
        for key in ("url", "model", "api_key", "timeout_s", "capture_tokens", "responses")
    },
    **{
        f"vllm_{key}": ("vllm", key)
        for key in (
            "url",
            "python",
            "args",
            "start_timeout_s",
            "weight_sync",
            "max_loras",
            "max_lora_rank",
            "api_key",
            "host",
        )
    },
    **{
        key: ("fleet", key)
        for key in (
            "admin_urls",
            "registry",
            "advertise_url",
            "heartbeat_s",
            "registry_ttl_s",
        )
    },
}


def nest_flat_keys(engine: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The keys of the engine section with each flat key (FLAT_KEYS) moved to its section, and
    the (old, new) dotted names of those moved. A flat key given beside its nested place is an
    error: which one was meant is not clear."""
    moved: list[tuple[str, str]] = []
    out = dict(engine)
    for old in [k for k in engine if k in FLAT_KEYS]:
        section, key = FLAT_KEYS[old]
        inner = out.get(section)
        if isinstance(inner, BaseModel):
            inner = inner.model_dump(exclude_unset=True)
        if inner is not None and not isinstance(inner, dict):
            raise ValueError(f"engine.{section} must be a mapping of its keys")
        inner = dict(inner or {})
        if key in inner:
            raise ValueError(
                f"engine.{old} and engine.{section}.{key} are the same setting; "
                f"give only engine.{section}.{key}"
            )
        inner[key] = out.pop(old)
        out[section] = inner
        moved.append((f"engine.{old}", f"engine.{section}.{key}"))
    return out, moved


def log_moved(moved: list[tuple[str, str]], where: str = "") -> None:
    """One deprecation line per flat key that was moved to its section."""
    for old, new in moved:
        log.warning("settings%s: %s is deprecated, read as %s", where, old, new)


class EngineSettings(Section):
    """engine: the keys every kind shares, then one section per kind; the sections of the kinds
    not chosen are ignored."""

    kind: Literal["embedded", "upstream", "vllm"] = Field(
        "embedded", description="which engine serves: embedded | upstream | vllm"
    )
    model: str = Field(
        "smollm2",
        description="smollm2, tiny, or a local Hugging Face model dir (embedded and vllm serve "
        "it; evolving weights trains on it)",
    )
    model_cache: Path = Field(
        Path.home() / ".cache" / "reef" / "models",
        description="where the tiny model is generated and SmolLM2 is converted (shared by "
        "state dirs)",
    )
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
    max_running: int | None = Field(
        None,
        ge=1,
        description="calls given to the engine at once; the others wait in Reef's line "
        "(reef.admission); unset: embedded.max_batch_size for embedded (what it decodes "
        "together), 512 for upstream and vllm (the connections Reef opens to them)",
    )
    max_queue: int | None = Field(
        256,
        ge=0,
        description="calls that may wait for the engine beyond those it runs; a call that "
        "finds the line full is answered 429 (engine_busy, with Retry-After) at once, nothing "
        "recorded; 0: no call waits; null: no bound",
    )
    max_queue_wait_s: float | None = Field(
        None,
        gt=0,
        description="a call that waited this long in the line before the engine started it "
        "is answered 429 (engine_busy) instead of being run; null: it waits as long as it takes",
    )
    embedded: EmbeddedSettings = EmbeddedSettings()
    upstream: UpstreamSettings = UpstreamSettings()
    vllm: VllmSettings = VllmSettings()
    fleet: FleetSettings = FleetSettings()

    @model_validator(mode="before")
    @classmethod
    def _flat_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data, moved = nest_flat_keys(data)
            log_moved(moved)
        return data

    def running_limit(self) -> int:
        """How many calls the engine is given at once (max_running, or the kind's own)."""
        if self.max_running is not None:
            return self.max_running
        return self.embedded.max_batch_size if self.kind == "embedded" else UPSTREAM_CONNECTIONS

    @field_validator("model_cache")
    @classmethod
    def _expand_cache(cls, v: Path) -> Path:
        return v.expanduser()

    @field_validator("sampling_defaults")
    @classmethod
    def _sampling_ranges(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        return check_sampling_defaults(v)


def check_sampling_defaults(v: dict[str, float] | None) -> dict[str, float] | None:
    """engine.sampling_defaults (and a scenario's): temperature in [0, 2], top_p in (0, 1],
    nothing else."""
    unknown = sorted(set(v or ()) - {"temperature", "top_p"})
    if unknown:
        raise ValueError(f"sampling_defaults takes temperature and top_p, not {unknown}")
    if v and not 0 <= v.get("temperature", 0) <= 2:
        raise ValueError("sampling_defaults.temperature must be between 0 and 2")
    if v and not 0 < v.get("top_p", 1) <= 1:
        raise ValueError("sampling_defaults.top_p must be in (0, 1]")
    return v
