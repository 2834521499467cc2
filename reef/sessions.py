"""Session stitching: conversation states as hashes of normalized messages (pure, no I/O).

A record's state is its request's messages plus its answer. A later request whose messages
start with exactly that state (and go on) continues the record's conversation. Messages are
normalized first, so that what a client resends for the same conversation hashes the same:
the OpenAI SDK's assistant message with `refusal: null`, a string content vs. a list of text
parts, `developer` vs. `system`, tool-call arguments with or without spaces.

Both wire formats are stitched in the OpenAI chat form: the Anthropic route's messages go
through `reef.anthropic.to_openai` first.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import orjson

_ROLES = {"developer": "system"}


def _canonical(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _arguments(arguments: Any) -> Any:
    """Tool-call arguments as canonical JSON when they parse (spacing and key order differ
    between an engine's output and what a client re-serializes), else verbatim."""
    if isinstance(arguments, str):
        try:
            return _canonical(orjson.loads(arguments)).decode()
        except orjson.JSONDecodeError:
            return arguments
    if arguments is None:
        return None
    return _canonical(arguments).decode()


def _content(content: Any) -> Any:
    """A string, or a list of text parts joined into one; with any non-text part, a list of
    the parts (adjacent text merged) kept as JSON values."""
    if content is None or isinstance(content, str):
        return content or None
    if not isinstance(content, list):
        return content
    parts: list[Any] = []
    for part in content:
        text = part.get("text") if isinstance(part, dict) else None
        # a text part whose text is not a string is kept as the JSON value it is
        if (
            isinstance(part, dict)
            and part.get("type") == "text"
            and (isinstance(text, str) or not text)
        ):
            text = text or ""
            if parts and isinstance(parts[-1], str):
                parts[-1] += text
            else:
                parts.append(text)
        elif isinstance(part, str):
            if parts and isinstance(parts[-1], str):
                parts[-1] += part
            else:
                parts.append(part)
        else:
            parts.append(part)
    if all(isinstance(p, str) for p in parts):
        return "".join(parts) or None
    return [p for p in parts if p != ""]


def _tool_calls(calls: Any) -> list[Any] | None:
    """Tool calls as (id, name, arguments); a call of another shape (`{"function": "x"}`, not
    an object at all) is kept as the JSON value it is: it still identifies the conversation."""
    if not calls:
        return None
    if not isinstance(calls, list):
        return [calls]
    out: list[Any] = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if fn is None and isinstance(call, dict) and ("name" in call or "arguments" in call):
            # already normalized (record_state_hash normalizes an answer twice): idempotent,
            # so an answer's calls hash as the next request's copy of them does
            fn = call
        if not isinstance(call, dict) or not isinstance(fn or {}, dict):
            out.append(call)
            continue
        fn = fn or {}
        item = {
            "id": call.get("id") or None,
            "name": fn.get("name") or None,
            "arguments": _arguments(fn.get("arguments")),
        }
        out.append({k: v for k, v in item.items() if v is not None})
    return out


def normalize_message(message: dict[str, Any]) -> dict[str, Any]:
    """One OpenAI chat message reduced to what identifies it in a conversation."""
    role = message.get("role")
    out: dict[str, Any] = {"role": _ROLES.get(role, role) if isinstance(role, str) else role}
    content = _content(message.get("content"))
    if content is not None:
        out["content"] = content
    calls = _tool_calls(message.get("tool_calls"))
    if calls:
        out["tool_calls"] = calls
    function_call = message.get("function_call")  # the legacy single call
    if isinstance(function_call, dict) and function_call:
        out["tool_calls"] = [
            {
                "name": function_call.get("name"),
                "arguments": _arguments(function_call.get("arguments")),
            }
        ]
    elif function_call:  # another shape: kept as sent
        out["tool_calls"] = [{"function_call": function_call}]
    for key in ("tool_call_id", "name"):
        if message.get(key):
            out[key] = message[key]
    return out


def normalize(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI chat messages reduced to what identifies a conversation: role (`developer`
    counts as `system`), text content (a list of text parts joined; other parts kept as
    JSON), tool calls as (id, name, arguments), tool_call_id, name; empty fields dropped."""
    return [normalize_message(m) for m in messages]


def answer_message(response: dict[str, Any]) -> dict[str, Any]:
    """The assistant message of an OpenAI chat.completion (its first choice), normalized."""
    choices = response.get("choices") or [{}]
    message = dict(choices[0].get("message") or {})
    message.setdefault("role", "assistant")
    return normalize_message(message)


def _hash_prefixes(normalized: Sequence[dict[str, Any]], ends: Sequence[int]) -> list[str]:
    """sha256 of the canonical JSON of normalized[:k] for each k in `ends` (ascending), in
    one pass: the JSON of a list is its items' JSON between brackets, so the digest of each
    prefix is a copy of the running hash closed with ']'."""
    running = hashlib.sha256(b"[")
    out: list[str] = []
    want = iter(ends)
    next_end = next(want, None)
    for i, message in enumerate(normalized):
        if next_end is None:
            break
        if i:
            running.update(b",")
        running.update(_canonical(message))
        if i + 1 == next_end:
            closed = running.copy()
            closed.update(b"]")
            out.append(closed.hexdigest())
            next_end = next(want, None)
    return out


def state_hash(messages: Sequence[dict[str, Any]]) -> str:
    """The hash of a conversation state (equal to sha256 of the normalized messages'
    canonical JSON)."""
    normalized = normalize(messages)
    if not normalized:
        return hashlib.sha256(b"[]").hexdigest()
    return _hash_prefixes(normalized, [len(normalized)])[0]


def record_state_hash(request_messages: Sequence[dict[str, Any]], answer: dict[str, Any]) -> str:
    """The state after an exchange: the request's messages followed by its answer (an
    OpenAI chat.completion, or an assistant message already in OpenAI form with `role`)."""
    message = answer if "choices" not in answer else answer_message(answer)
    return state_hash([*request_messages, message])


def candidate_hashes(messages: Sequence[dict[str, Any]]) -> list[str]:
    """Hashes of every prefix messages[:k] that ends with an assistant message and is
    followed by at least one more message, longest first: the states this request may
    continue."""
    # The common first turn has no assistant message: no normalizing, no hashing.
    if not any(m.get("role") == "assistant" for m in messages[:-1]):
        return []
    normalized = normalize(messages)
    ends = [k for k in range(1, len(normalized)) if normalized[k - 1].get("role") == "assistant"]
    if not ends:
        return []
    return list(reversed(_hash_prefixes(normalized, ends)))
