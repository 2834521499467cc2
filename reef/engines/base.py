"""The interface every serving engine implements: OpenAI chat completions in, captured tokens out.

The engine speaks the OpenAI chat-completions wire format (the Anthropic route translates to
and from it), so one interface serves the embedded transformers engine and any upstream
OpenAI-compatible server. Besides the OpenAI response, an engine hands back what a recipe
needs later and the wire format may not carry: the exact prompt and completion token ids and
the log-prob of every sampled token, when the engine has them.

An engine that can also serve several releases at once and change them without a restart
implements `Deployable` as well; callers check with `isinstance(engine, Deployable)`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

# Deployable.verify's smoke generation: the forward passes run and their logits are finite.
VERIFY_MESSAGES = [{"role": "user", "content": "Say hello."}]
VERIFY_TOKENS = 2
# Top-K ids and log-probs recorded per generated token (K = 4, OpenClaw-RL's capture_topk):
# the student set of the openclaw recipe's distillation term. The top-K
# of the raw distribution is also the sampling distribution's (temperature and top-p keep the
# order), so the ids are exactly the sampler's.
CAPTURE_TOPK = 4


@dataclass(frozen=True)
class Completion:
    """A finished chat completion with what the record keeps besides the wire response.

    `response` is an OpenAI `chat.completion` object (for a stream: the one the chunks add up to).
    Token ids and log-probs are None when the engine cannot report them. `logprobs[i]` is the
    log-probability of `completion_token_ids[i]` under the model's unmodified distribution
    (temperature 1, no top-p), as vLLM reports it.
    """

    response: dict[str, Any]
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    timings: dict[str, float] = field(default_factory=dict)
    # Generation-time top-K per completion token, {"k", "ids", "logprobs"} (Record.topk): the
    # K most likely ids under the raw distribution. The openclaw recipe's student set.
    topk: dict[str, Any] | None = None
    # How the answer was sampled, when the engine knows (reef.engines.sampling.sampling_record):
    # {"temperature", "top_p", "defaults": [the keys that came from the model's defaults]}.
    sampling: dict[str, Any] | None = None


@runtime_checkable
class Engine(Protocol):
    """A serving engine. All methods are called from the API's event loop."""

    kind: str  # "embedded" | "upstream" | ...

    def models(self) -> list[str]:
        """Model ids this engine answers to (the first is the default)."""
        ...

    async def start(self) -> None:
        """Load or connect; called once before serving."""
        ...

    async def ready(self) -> bool:
        """True when a request would be served now. Cheap and free of side effects."""
        ...

    async def complete(
        self, body: dict[str, Any], *, sampling_defaults: dict[str, float] | None = None
    ) -> Completion:
        """Serve a non-streaming OpenAI chat-completions request body.

        `body` has been validated by the API and its `model` resolved to one of `models()`.
        `sampling_defaults`: the values given to a body that names no sampling parameter
        instead of the engine's own (a scenario's, reef.engines.defaults); None: the engine's.
        Raises a ReefError subclass on failure (EngineError, UpstreamError, UpstreamRejected).
        """
        ...

    def stream(
        self, body: dict[str, Any], *, sampling_defaults: dict[str, float] | None = None
    ) -> AsyncIterator[dict[str, Any] | Completion]:
        """Serve a streaming request: yields OpenAI `chat.completion.chunk` dicts as they are
        produced, then exactly one final `Completion` (the assembled response), then stops.

        An error before the first chunk raises like `complete`; the API turns a later one into
        an error event on the stream.
        """
        ...

    async def aclose(self) -> None:
        """Release threads, connections and memory."""
        ...


@runtime_checkable
class Deployable(Protocol):
    """An engine that serves releases side by side and loads or unloads them while serving.

    Each loaded release (a variant) answers to its own name, listed by `models()` after the base
    model id, so a request whose `model` names it is served by it. A request's variant is fixed
    when it is submitted: loads and unloads never change what a request in flight runs on. All
    methods are called from the API's event loop.
    """

    def variants(self) -> list[str]:
        """Names of the loaded variants, in load order (without the base model id)."""
        ...

    async def load_adapter(self, name: str, path: Path) -> None:
        """Serve the PEFT LoRA adapter in directory `path` (adapter_config.json and
        adapter_model.safetensors) as `name`.

        Never reloads in place: Conflict (code "adapter_exists") when `name` is taken.
        BadRequest when the directory is not an adapter for the base model; serving is then
        as before.
        """
        ...

    async def load_weights(self, name: str, path: Path) -> None:
        """Serve the full checkpoint in Hugging Face model directory `path` as `name`.

        Conflict (code "model_exists") when `name` is taken; BadRequest unless its parameter
        names, shapes and dtypes are the base model's (checked before anything is served).
        """
        ...

    async def unload(self, name: str) -> None:
        """Stop serving `name` and free it: it leaves `models()` at once, requests already
        submitted on it finish on it, and this returns when the last of them is done.

        NotFound (UnknownModel) when nothing of that name is loaded; BadRequest for the base.
        """
        ...

    async def verify(self, name: str) -> dict[str, Any]:
        """A smoke generation on `name`: a few greedy tokens of a fixed short chat prompt.

        Returns at least {"tokens": int, "seconds": float, "text": str}. EngineError when the
        generation fails or the logits are not finite.
        """
        ...


@runtime_checkable
class ServesResponses(Protocol):
    """An engine whose server answers the OpenAI Responses API itself (an upstream with
    `engine.upstream.responses`): /v1/responses bodies go to it unchanged instead of being
    translated to chat completions. `serves_responses` says whether it is switched on."""

    serves_responses: bool

    async def respond(self, body: dict[str, Any]) -> Completion:
        """The Responses request as sent; the Completion's `response` is the response object."""
        ...

    def respond_stream(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any] | Completion]:
        """The stream's events as they come, except the one that ends it: that event (with the
        whole response object under `response`) is the final Completion's `response`."""
        ...
