"""Prompt rendering: an OpenAI chat-completions body to the exact token ids the model reads."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from reef.engines.tool_calls import ToolsUnsupported, parses_calls, template_takes_tools
from reef.errors import BadRequest


class ChatRenderer:
    """Renders messages (and tools) with the tokenizer's own chat template, then tokenizes.

    Safe to call from worker threads (the embedded engine renders large prompts off its event
    loop): a fast tokenizer's Rust backend is used through `encode_batch`, which lets go of the
    interpreter lock while it works. Its `encode` and transformers' `encode` hold the lock for
    most of the work (measured on the tiny model's tokenizer, a 4 MB prompt: 2.2 s and stalls
    of 52 ms; `encode_batch`: stalls of 4 ms), which would stall the event loop all the same.
    Freeing the encoding of a very long text holds the lock too (one string per token): text
    longer than the context can hold (`max_chars`) should not be tokenized at all.

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
        self.takes_tools = template_takes_tools(template)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        # Truncation or padding set in tokenizer.json would change the ids: transformers turns
        # them off for each call, the backend used directly would apply them.
        plain = backend is not None and backend.truncation is None and backend.padding is None
        self._backend = backend if plain else None
        # A vocabulary entry is at least as long as the text it decodes to (byte-level and
        # SentencePiece pieces spell each byte or space with one character or more).
        self._max_chars_per_token = max((len(t) for t in tokenizer.get_vocab()), default=1)

    def prompt_ids(self, body: dict[str, Any]) -> list[int]:
        _, ids = self.encode(self.prompt_text(body))
        assert ids is not None
        return ids

    def max_chars(self, tokens: int) -> int:
        """The most characters `tokens` tokens can spell: more text than this needs more
        tokens, which is known without tokenizing it (vLLM checks prompts the same way)."""
        return tokens * self._max_chars_per_token

    def encode(self, text: str, max_len: int | None = None) -> tuple[int, list[int] | None]:
        """The text's length in tokens, and its token ids unless there are more than
        `max_len` of them (a prompt too long to serve is counted, never made into a list)."""
        if self._backend is None:
            ids = list(self._tokenizer.encode(text, add_special_tokens=False))
            return len(ids), ids if max_len is None or len(ids) <= max_len else None
        encoding = self._backend.encode_batch([text], add_special_tokens=False)[0]
        count = len(encoding)
        if max_len is not None and count > max_len:
            return count, None
        return count, list(encoding.ids)

    def prompt_text(self, body: dict[str, Any]) -> str:
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise BadRequest("messages must be a non-empty list", param="messages")
        messages = [self._message(m, i) for i, m in enumerate(raw)]
        kwargs: dict[str, Any] = {}
        if body.get("tools") and self.takes_tools:
            kwargs["tools"] = body["tools"]
        elif parses_calls(body):  # the model would never see the tools it is asked to call
            raise ToolsUnsupported(str(body.get("model") or "this model"))
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
    if not isinstance(fn, dict):  # another shape (`{"function": "x"}`): written as sent
        payload = json.dumps(call, ensure_ascii=False)
        return f"\n<tool_call>\n{payload}\n</tool_call>"
    args = fn.get("arguments", {})
    if isinstance(args, str):
        with contextlib.suppress(ValueError):
            args = json.loads(args)
    payload = json.dumps({"name": fn.get("name"), "arguments": args}, ensure_ascii=False)
    return f"\n<tool_call>\n{payload}\n</tool_call>"
