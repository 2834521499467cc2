"""Assembling OpenAI `chat.completion.chunk` events into the `chat.completion` they add up to.

A pure function over plain dicts, shared by the upstream engine (to record what a stream
answered) and the API. Follows the OpenAI SDK's own stream accumulator where the wire format
leaves room: string fields of a delta are concatenated (content, refusal, reasoning), tool
calls are merged by their `index`, the last non-null finish reason wins, and log-probs and
vLLM's per-chunk `token_ids` are concatenated in order.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# Top-level fields taken from the first chunk that has them.
_HEAD_FIELDS = ("id", "created", "model", "system_fingerprint", "service_tier")


def assemble(chunks: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The `chat.completion` a list of chunks adds up to (choices sorted by index)."""
    response: dict[str, Any] = {"id": None, "object": "chat.completion", "created": None}
    choices: dict[int, _Choice] = {}
    usage: dict[str, Any] | None = None
    prompt_token_ids: list[int] | None = None
    for chunk in chunks:
        for key in _HEAD_FIELDS:
            if response.get(key) is None and chunk.get(key) is not None:
                response[key] = chunk[key]
        if chunk.get("usage") is not None:
            usage = chunk["usage"]
        if prompt_token_ids is None and chunk.get("prompt_token_ids") is not None:
            prompt_token_ids = chunk["prompt_token_ids"]
        for c in chunk.get("choices") or ():
            index = c.get("index", 0)
            choice = choices.get(index)
            if choice is None:
                choice = choices[index] = _Choice(index)
            choice.add(c)
    response["choices"] = [choices[i].result() for i in sorted(choices)]
    if usage is not None:
        response["usage"] = usage
    if prompt_token_ids is not None:
        response["prompt_token_ids"] = prompt_token_ids
    return response


class _Choice:
    """One choice's deltas so far."""

    def __init__(self, index: int):
        self.index = index
        self.message: dict[str, Any] = {"role": "assistant", "content": None}
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.stop_reason: Any = None
        self.logprobs: dict[str, list[Any]] | None = None
        self.token_ids: list[int] | None = None

    def add(self, c: dict[str, Any]) -> None:
        delta = c.get("delta") or {}
        for key, value in delta.items():
            if key == "tool_calls":
                for call in value or ():
                    self._merge_call(call)
            elif key == "function_call":  # the legacy single call
                if value:
                    _merge_function(self.message.setdefault("function_call", {}), value)
            elif key == "role":
                if value:
                    self.message["role"] = value
            elif isinstance(value, str):
                before = self.message.get(key)
                self.message[key] = before + value if isinstance(before, str) else value
            elif value is not None or key not in self.message:
                self.message[key] = value
        if c.get("finish_reason") is not None:
            self.finish_reason = c["finish_reason"]
        if c.get("stop_reason") is not None:
            self.stop_reason = c["stop_reason"]
        logprobs = c.get("logprobs")
        if logprobs:
            if self.logprobs is None:
                self.logprobs = {}
            for key, entries in logprobs.items():
                if entries:
                    self.logprobs.setdefault(key, []).extend(entries)
        if c.get("token_ids") is not None:
            if self.token_ids is None:
                self.token_ids = []
            self.token_ids.extend(c["token_ids"])

    def _merge_call(self, delta: dict[str, Any]) -> None:
        index = delta.get("index", len(self.tool_calls))
        call = self.tool_calls.get(index)
        if call is None:
            call = self.tool_calls[index] = {"id": None, "type": "function", "function": {}}
        if delta.get("id") and not call["id"]:
            call["id"] = delta["id"]  # some servers repeat the id in every delta: keep the first
        if delta.get("type"):
            call["type"] = delta["type"]
        if delta.get("function"):
            _merge_function(call["function"], delta["function"])

    def result(self) -> dict[str, Any]:
        message = self.message
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        out: dict[str, Any] = {
            "index": self.index,
            "message": message,
            "logprobs": self.logprobs,
            "finish_reason": self.finish_reason,
        }
        if self.stop_reason is not None:
            out["stop_reason"] = self.stop_reason
        if self.token_ids is not None:
            out["token_ids"] = self.token_ids
        return out


def _merge_function(acc: dict[str, Any], delta: dict[str, Any]) -> None:
    name, current = delta.get("name"), acc.get("name")
    # The name usually comes whole in the first delta; some servers repeat it, a few stream it.
    if name and current != name:
        acc["name"] = (current or "") + name
    elif "name" not in acc:
        acc["name"] = current
    acc["arguments"] = acc.get("arguments", "") + (delta.get("arguments") or "")


def disassemble(response: dict[str, Any], *, include_usage: bool = False) -> list[dict[str, Any]]:
    """The inverse of `assemble`: a `chat.completion` as the chunks a stream of it would send
    (per choice: the role, the content, the tool calls, the finish reason; then the usage
    chunk when asked for). Replays a stored answer to a retried streaming request."""
    head = {
        "id": response.get("id"),
        "object": "chat.completion.chunk",
        "created": response.get("created"),
        "model": response.get("model"),
    }

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**head, "choices": [choice]}

    chunks: list[dict[str, Any]] = []
    for choice in response.get("choices") or ():
        index = choice.get("index", 0)
        message = choice.get("message") or {}
        chunks.append(chunk(index, {"role": message.get("role") or "assistant", "content": ""}))
        if message.get("content"):
            chunks.append(chunk(index, {"content": message["content"]}))
        calls = message.get("tool_calls") or []
        for i, call in enumerate(calls):
            fn = call.get("function") or {}
            delta_call = {
                "index": i,
                "id": call.get("id"),
                "type": call.get("type") or "function",
                "function": {"name": fn.get("name"), "arguments": fn.get("arguments") or ""},
            }
            chunks.append(chunk(index, {"tool_calls": [delta_call]}))
        chunks.append(chunk(index, {}, choice.get("finish_reason") or "stop"))
    if include_usage and response.get("usage") is not None:
        chunks.append({**head, "choices": [], "usage": response["usage"]})
    return chunks
