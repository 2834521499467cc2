"""Prompt rendering: an OpenAI chat-completions body to the exact token ids the model reads."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from reef.errors import BadRequest


class ChatRenderer:
    """Renders messages (and tools) with the tokenizer's own chat template, then tokenizes.

    The template sees messages the way vLLM hands them over: text parts joined into one string,
    `developer` as `system`, a missing content as "", and tool-call arguments parsed from their
    JSON string. A template that has no notion of tool calls (SmolLM2's) would silently drop an
    agent's calls from the history, so for such templates the calls are written into the
    assistant's text in the common `<tool_call>` form instead.
    """

    def __init__(self, tokenizer: Any):
        self._tokenizer = tokenizer
        template = tokenizer.chat_template or ""
        self._template_has_tool_calls = "tool_calls" in template

    def prompt_ids(self, body: dict[str, Any]) -> list[int]:
        text = self.prompt_text(body)
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def prompt_text(self, body: dict[str, Any]) -> str:
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise BadRequest("messages must be a non-empty list", param="messages")
        messages = [self._message(m, i) for i, m in enumerate(raw)]
        kwargs: dict[str, Any] = {}
        if body.get("tools"):
            kwargs["tools"] = body["tools"]
        try:
            return self._tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, **kwargs
            )
        except Exception as exc:  # jinja's TemplateError and friends: the messages do not fit
            raise BadRequest(
                f"the model's chat template rejected the messages: {exc}", param="messages"
            ) from exc

    def _message(self, message: Any, index: int) -> dict[str, Any]:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{index}] must be an object with a role", param="messages")
        role = "system" if message["role"] == "developer" else message["role"]
        out: dict[str, Any] = {"role": role, "content": _text(message.get("content"), index)}
        for key in ("name", "tool_call_id"):
            if message.get(key) is not None:
                out[key] = message[key]
        calls = message.get("tool_calls")
        if calls:
            if self._template_has_tool_calls:
                out["tool_calls"] = [_parsed_call(c) for c in calls]
            else:
                out["content"] += "".join(_call_text(c) for c in calls)
        return out


def _text(content: Any, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in ("text", "input_text", "output_text"):
                raise BadRequest(
                    f"messages[{index}]: the embedded engine reads text only, not '{kind}' parts",
                    code="unsupported_content",
                    param="messages",
                )
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise BadRequest(f"messages[{index}].content must be a string or a list", param="messages")


def _parsed_call(call: Any) -> Any:
    """A tool call with its arguments as an object, which is what chat templates expect."""
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return call
    fn = dict(call["function"])
    if isinstance(fn.get("arguments"), str):
        # Not JSON: the template gets the string as the client sent it.
        with contextlib.suppress(ValueError):
            fn["arguments"] = json.loads(fn["arguments"])
    return {**call, "function": fn}


def _call_text(call: Any) -> str:
    fn = call.get("function", {}) if isinstance(call, dict) else {}
    args = fn.get("arguments", {})
    if isinstance(args, str):
        with contextlib.suppress(ValueError):
            args = json.loads(args)
    payload = json.dumps({"name": fn.get("name"), "arguments": args}, ensure_ascii=False)
    return f"\n<tool_call>\n{payload}\n</tool_call>"
