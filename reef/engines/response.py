"""OpenAI chat-completion responses and stream chunks, assembled from one token at a time."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from reef.engines.base import CAPTURE_TOPK, Completion


@dataclass(frozen=True)
class TokenEvent:
    """One sampled token as the scheduler hands it over.

    `text` is what may be shown now (possibly empty: half a character, a possible stop string,
    an end-of-sequence token); `entry` the OpenAI logprobs entry when the request asked for them.
    """

    text: str
    token_id: int
    logprob: float
    entry: dict[str, Any] | None
    finish_reason: str | None = None
    capture: tuple[list[int], list[float]] | None = None  # top-K (ids, log-probs)


class ResponseBuilder:
    """Collects a request's tokens into stream chunks and the final `chat.completion`.

    Token ids (vLLM's `return_token_ids`: top-level `prompt_token_ids`, per-choice `token_ids`)
    and logprob entries ride on the chunk that carries their text; tokens whose text was held
    back travel with the next chunk that has text, or with the finishing chunk, so the chunks'
    ids and entries always add up to the whole completion.
    """

    def __init__(
        self,
        *,
        model: str,
        prompt_ids: list[int],
        logprobs: bool,
        return_token_ids: bool,
        include_usage: bool,
        sampling: dict[str, Any] | None = None,
    ):
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.prompt_ids = prompt_ids
        self.logprobs = logprobs
        self.return_token_ids = return_token_ids
        self.include_usage = include_usage
        self.sampling = sampling
        self.text_parts: list[str] = []
        self.token_ids: list[int] = []
        self.token_logprobs: list[float] = []
        self.entries: list[dict[str, Any]] = []
        self.topk_ids: list[list[int]] | None = []  # None once a token came without capture
        self.topk_logprobs: list[list[float]] = []
        self.finish_reason: str | None = None
        self._unsent = 0  # tokens at the end of token_ids not yet put on a chunk

    def add(self, event: TokenEvent) -> None:
        self.text_parts.append(event.text)
        self.token_ids.append(event.token_id)
        self.token_logprobs.append(event.logprob)
        if event.entry is not None:
            self.entries.append(event.entry)
        if event.capture is None:
            self.topk_ids = None
        elif self.topk_ids is not None:
            self.topk_ids.append(list(event.capture[0]))
            self.topk_logprobs.append([max(v, -9999.0) for v in event.capture[1]])
        self.finish_reason = event.finish_reason or self.finish_reason
        self._unsent += 1

    # ---- stream

    def role_chunk(self) -> dict[str, Any]:
        chunk = self._chunk({"role": "assistant", "content": ""})
        if self.return_token_ids:
            chunk["prompt_token_ids"] = self.prompt_ids
        return chunk

    def content_chunk(self, event: TokenEvent) -> dict[str, Any] | None:
        """The chunk for the event just added, or None while its text is held back."""
        if not event.text:
            return None
        return self._with_tokens(self._chunk({"content": event.text}))

    def finish_chunk(self) -> dict[str, Any]:
        return self._with_tokens(self._chunk({}, finish_reason=self.finish_reason))

    def usage_chunk(self) -> dict[str, Any] | None:
        if not self.include_usage:
            return None
        chunk = self._chunk(None)
        chunk["usage"] = self.usage()
        return chunk

    def _chunk(
        self, delta: dict[str, Any] | None, finish_reason: str | None = None
    ) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": []
            if delta is None
            else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }
        if self.include_usage:
            chunk["usage"] = None  # as OpenAI: null on every chunk but the last
        return chunk

    def _with_tokens(self, chunk: dict[str, Any]) -> dict[str, Any]:
        n, self._unsent = self._unsent, 0
        choice = chunk["choices"][0]
        if self.logprobs:
            choice["logprobs"] = {"content": self.entries[len(self.entries) - n :] if n else []}
        if self.return_token_ids:
            choice["token_ids"] = self.token_ids[len(self.token_ids) - n :] if n else []
        return chunk

    # ---- whole response

    def usage(self) -> dict[str, int]:
        prompt, completion = len(self.prompt_ids), len(self.token_ids)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def response(self) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": "".join(self.text_parts)},
            "logprobs": {"content": list(self.entries)} if self.logprobs else None,
            "finish_reason": self.finish_reason,
        }
        response: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": self.usage(),
        }
        if self.return_token_ids:
            response["prompt_token_ids"] = list(self.prompt_ids)
            choice["token_ids"] = list(self.token_ids)
        return response

    def completion(self, timings: dict[str, float]) -> Completion:
        return Completion(
            response=self.response(),
            prompt_token_ids=list(self.prompt_ids),
            completion_token_ids=list(self.token_ids),
            logprobs=list(self.token_logprobs),
            timings=timings,
            topk=None
            if self.topk_ids is None
            else {"k": CAPTURE_TOPK, "ids": self.topk_ids, "logprobs": self.topk_logprobs},
            sampling=self.sampling,
        )
