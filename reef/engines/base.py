"""The interface every serving engine implements: OpenAI chat completions in, captured tokens out.

The engine speaks the OpenAI chat-completions wire format (the Anthropic route translates to
and from it), so one interface serves the embedded transformers engine and any upstream
OpenAI-compatible server. Besides the OpenAI response, an engine hands back what a recipe
needs later and the wire format may not carry: the exact prompt and completion token ids and
the log-prob of every sampled token, when the engine has them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


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

    async def complete(self, body: dict[str, Any]) -> Completion:
        """Serve a non-streaming OpenAI chat-completions request body.

        `body` has been validated by the API and its `model` resolved to one of `models()`.
        Raises a ReefError subclass on failure (EngineError, UpstreamError, UpstreamRejected).
        """
        ...

    def stream(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any] | Completion]:
        """Serve a streaming request: yields OpenAI `chat.completion.chunk` dicts as they are
        produced, then exactly one final `Completion` (the assembled response), then stops.

        An error before the first chunk raises like `complete`; the API turns a later one into
        an error event on the stream.
        """
        ...

    async def aclose(self) -> None:
        """Release threads, connections and memory."""
        ...
