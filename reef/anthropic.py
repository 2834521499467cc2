"""Anthropic Messages ⇄ OpenAI chat completions: pure translation, no I/O.

Engines speak OpenAI chat completions; the `/v1/messages` route translates the request in,
the answer (or its stream of chunks) out. Records keep the Anthropic bodies the client saw;
the experience layer can normalize them with `to_openai`.
"""

from __future__ import annotations

import secrets
from typing import Any

import orjson

from reef.errors import BadRequest

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _bad(where: str, what: str) -> BadRequest:
    return BadRequest(f"{where} {what}", code="invalid_value", param=where)


def _text(block: dict[str, Any], where: str) -> str:
    text = block.get("text", "")
    if not isinstance(text, str):
        raise _bad(f"{where}.text", "must be a string")
    return text


def _text_of(blocks: Any, where: str = "content") -> str:
    """The text of a string or a list of content blocks (strings in the list count as text;
    other blocks carry none); a clear 400 for any other shape."""
    if blocks is None:
        return ""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise _bad(where, "must be a string or a list of content blocks")
    texts = []
    for i, b in enumerate(blocks):
        if isinstance(b, str):
            texts.append(b)
        elif not isinstance(b, dict):
            raise _bad(f"{where}[{i}]", "must be a content block (an object)")
        elif b.get("type") == "text":
            texts.append(_text(b, f"{where}[{i}]"))
    return "".join(texts)


def _image_url(source: Any, where: str) -> str | None:
    """An image block's source as an OpenAI image URL (base64 data or a URL); None for a
    source this translation does not carry (a file id)."""
    if not isinstance(source, dict):
        raise _bad(where, "must be an object ({type: base64 | url, ...})")
    kind = source.get("type")
    if kind == "base64":
        media_type, data = source.get("media_type", "image/png"), source.get("data", "")
        if not isinstance(media_type, str) or not isinstance(data, str):
            raise _bad(where, "needs media_type and data as strings")
        return f"data:{media_type};base64,{data}"
    if kind == "url":
        url = source.get("url")
        if not isinstance(url, str):
            raise _bad(f"{where}.url", "must be a string")
        return url
    return None


def _user_parts(
    content: str | list[dict[str, Any]], where: str = "content"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Split a user turn into OpenAI messages: tool results become `tool` messages first."""
    if isinstance(content, str):
        return [], [{"role": "user", "content": content}]
    tool_msgs: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for i, block in enumerate(content):
        kind = block.get("type")
        if kind == "tool_result":
            tool_msgs.append(
                {
                    "role": "tool",
                    "tool_call_id": block.get("tool_use_id", ""),
                    "content": _text_of(block.get("content"), f"{where}[{i}].content"),
                }
            )
        elif kind == "text":
            parts.append({"type": "text", "text": _text(block, f"{where}[{i}]")})
        elif kind == "image":
            url = _image_url(block.get("source"), f"{where}[{i}].source")
            if url is not None:
                parts.append({"type": "image_url", "image_url": {"url": url}})
    user: list[dict[str, Any]] = []
    if parts:
        only_text = all(p["type"] == "text" for p in parts)
        content_out: Any = "".join(p["text"] for p in parts) if only_text else parts
        user.append({"role": "user", "content": content_out})
    return tool_msgs, user


def _assistant(content: str | list[dict[str, Any]], where: str = "content") -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    text = _text_of(content, where)
    calls = [
        {
            "id": b.get("id", ""),
            "type": "function",
            "function": {
                "name": b.get("name", ""),
                "arguments": orjson.dumps(b.get("input", {})).decode(),
            },
        }
        for b in content
        if b.get("type") == "tool_use"
    ]
    msg: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        msg["tool_calls"] = calls
    return msg


def _tool_choice(choice: dict[str, Any]) -> str | dict[str, Any]:
    kind = choice.get("type")
    if kind == "any":
        return "required"
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name", "")}}
    if kind == "none":
        return "none"
    return "auto"


def to_openai(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages request as an OpenAI chat-completions request."""
    messages: list[dict[str, Any]] = []
    if body.get("system"):
        messages.append({"role": "system", "content": _text_of(body["system"], "system")})
    for i, m in enumerate(body["messages"]):
        where = f"messages[{i}].content"
        if m["role"] == "user":
            tool_msgs, user = _user_parts(m["content"], where)
            messages.extend(tool_msgs)
            messages.extend(user)
        else:
            messages.append(_assistant(m["content"], where))
    out: dict[str, Any] = {
        "model": body["model"],
        "messages": messages,
        "max_tokens": body["max_tokens"],
    }
    for key in ("temperature", "top_p", "top_k"):
        if body.get(key) is not None:
            out[key] = body[key]
    if body.get("stop_sequences"):
        out["stop"] = body["stop_sequences"]
    if body.get("tools"):
        out["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.get("name", ""),
                    "description": t.get("description", ""),
                    "parameters": t.get("input_schema", {"type": "object"}),
                },
            }
            for t in body["tools"]
        ]
    if body.get("tool_choice"):
        out["tool_choice"] = _tool_choice(body["tool_choice"])
    response_format = _output_format(body.get("output_config"))
    if response_format is not None:
        out["response_format"] = response_format
    if body.get("stream"):
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out


def message_id() -> str:
    return f"msg_{secrets.token_hex(12)}"


def _tool_input(arguments: str) -> Any:
    try:
        return orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return {"_raw": arguments}


def from_openai(response: dict[str, Any], model: str, msg_id: str) -> dict[str, Any]:
    """An OpenAI chat.completion as an Anthropic Messages response."""
    choice = response["choices"][0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {})
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{secrets.token_hex(8)}",
                "name": fn.get("name", ""),
                "input": _tool_input(fn.get("arguments", "")),
            }
        )
    usage = response.get("usage") or {}
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": _STOP_REASONS.get(choice.get("finish_reason") or "stop", "end_turn"),
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage.get("prompt_tokens", 0),
            "output_tokens": usage.get("completion_tokens", 0),
        },
    }


_FINISH_REASONS = {v: k for k, v in _STOP_REASONS.items()}


def assistant_message(message: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages response as the OpenAI assistant message `to_openai` makes of it
    when a client sends it back in its next request."""
    return _assistant(message.get("content") or [])


def to_openai_response(message: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages response back as an OpenAI chat.completion (what `from_openai`
    was given, up to ids and timestamps): replays a stored answer through StreamTranslator."""
    usage = message.get("usage") or {}
    finish = _FINISH_REASONS.get(message.get("stop_reason") or "end_turn", "stop")
    return {
        "id": message.get("id"),
        "object": "chat.completion",
        "model": message.get("model"),
        "choices": [{"index": 0, "message": assistant_message(message), "finish_reason": finish}],
        "usage": {
            "prompt_tokens": usage.get("input_tokens", 0),
            "completion_tokens": usage.get("output_tokens", 0),
        },
    }


class StreamTranslator:
    """Turns OpenAI chat.completion.chunk dicts into Anthropic stream events, in order.

    Each method returns a list of (event name, data) pairs for the route to send as SSE.
    """

    def __init__(self, model: str, msg_id: str):
        self.model = model
        self.msg_id = msg_id
        self._open: tuple[str, int] | None = None  # ("text", index) or ("tool:<i>", index)
        self._next_index = 0

    def start(self) -> list[tuple[str, dict[str, Any]]]:
        message: dict[str, Any] = {
            "id": self.msg_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return [("message_start", {"type": "message_start", "message": message})]

    def _close(self) -> list[tuple[str, dict[str, Any]]]:
        if self._open is None:
            return []
        index = self._open[1]
        self._open = None
        return [("content_block_stop", {"type": "content_block_stop", "index": index})]

    def _begin(self, key: str, block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        events = self._close()
        index = self._next_index
        self._next_index += 1
        self._open = (key, index)
        data = {"type": "content_block_start", "index": index, "content_block": block}
        events.append(("content_block_start", data))
        return events

    def chunk(self, chunk: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        events: list[tuple[str, dict[str, Any]]] = []
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                if self._open is None or self._open[0] != "text":
                    events += self._begin("text", {"type": "text", "text": ""})
                assert self._open is not None
                text_delta = {"type": "text_delta", "text": delta["content"]}
                events.append(
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": self._open[1],
                            "delta": text_delta,
                        },
                    )
                )
            for call in delta.get("tool_calls") or []:
                key = f"tool:{call.get('index', 0)}"
                fn = call.get("function") or {}
                if self._open is None or self._open[0] != key:
                    block = {
                        "type": "tool_use",
                        "id": call.get("id") or f"toolu_{secrets.token_hex(8)}",
                        "name": fn.get("name", ""),
                        "input": {},
                    }
                    events += self._begin(key, block)
                assert self._open is not None
                if fn.get("arguments"):
                    json_delta = {"type": "input_json_delta", "partial_json": fn["arguments"]}
                    events.append(
                        (
                            "content_block_delta",
                            {
                                "type": "content_block_delta",
                                "index": self._open[1],
                                "delta": json_delta,
                            },
                        )
                    )
        return events

    def finish(self, message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """Events after the last chunk, up to but not including message_stop; `message` is the
        finished Anthropic message (what `from_openai` made of the assembled response)."""
        events = self._close()
        delta = {"stop_reason": message.get("stop_reason", "end_turn"), "stop_sequence": None}
        data = {"type": "message_delta", "delta": delta, "usage": message.get("usage", {})}
        events.append(("message_delta", data))
        return events

    @staticmethod
    def stop() -> tuple[str, dict[str, Any]]:
        return ("message_stop", {"type": "message_stop"})


def _output_format(config: Any) -> dict[str, Any] | None:
    """Anthropic's structured output (`output_config.format`, a JSON schema) as OpenAI's
    `response_format`; None when the request asks for none. `effort` is accepted and left out:
    no engine here reasons."""
    if config is None:
        return None
    if not isinstance(config, dict):
        raise BadRequest("output_config must be an object", param="output_config")
    fmt = config.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise BadRequest(
            'output_config.format must be {"type": "json_schema", "schema": {...}}',
            param="output_config.format",
        )
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt.get("schema")}}
