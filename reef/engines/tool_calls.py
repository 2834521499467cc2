"""Function tools on the embedded engine: which chat templates take them, and the model's
`<tool_call>` text parsed back into OpenAI tool calls, for whole answers and for streams.

The embedded engine renders `tools` through the model's own chat template. A template that
reads `tools` (the tiny model's, and any Hermes/Qwen-style one) tells the model to answer a
call as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; the answer's text is parsed
back here into `message.tool_calls` (finish reason `tool_calls`), which the Anthropic and
Responses routes translate into `tool_use` blocks and `function_call` items as they do for an
upstream's calls. A template that never reads `tools` (SmolLM2's) would drop them silently: the
renderer refuses such a request with a 400 instead (`ToolsUnsupported`).

Everything here is pure: text in, OpenAI shapes out.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from reef.engines.base import Completion
from reef.errors import BadRequest

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class ToolsUnsupported(BadRequest):
    """The model's chat template has no place for tools, so the model could never see them."""

    def __init__(self, model: str):
        super().__init__(
            f"the model '{model}' cannot call tools: its chat template does not render `tools`. "
            'Send the request without tools (or with tool_choice "none"), or serve a model '
            "whose chat template supports tools",
            code="tools_unsupported",
            param="tools",
        )


def template_takes_tools(template: str) -> bool:
    """Whether a Jinja chat template reads the `tools` variable it is given."""
    import jinja2
    from jinja2 import meta

    env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols", "jinja2.ext.do"])
    try:
        return "tools" in meta.find_undeclared_variables(env.parse(template))
    except jinja2.TemplateSyntaxError:  # transformers' own extensions (generation tags): a guess
        return re.search(r"\btools\b", template) is not None


def parses_calls(body: dict[str, Any]) -> bool:
    """Whether the answer to `body` is read for tool calls: it offers tools, and allows them."""
    return bool(body.get("tools")) and body.get("tool_choice") != "none"


def _call(payload: Any) -> dict[str, Any] | None:
    """One `{"name", "arguments"}` object as an OpenAI tool call; None if it is not one."""
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return None
    if not payload["name"]:
        return None
    args = payload.get("arguments", payload.get("parameters", {}))
    return {
        "id": f"call_{secrets.token_hex(12)}",
        "type": "function",
        "function": {
            "name": payload["name"],
            "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False),
        },
    }


def split_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """An answer's text as (content, tool calls).

    The content is the text before the first `<tool_call>` (None when only whitespace). Every
    block must hold one JSON call (a last block may lack its closing tag: the answer ran out of
    tokens right after the JSON); otherwise nothing is a call and the whole text is content, as
    the model wrote it, so nothing it said is lost.
    """
    start = text.find(OPEN)
    if start < 0:
        return text, []
    calls: list[dict[str, Any]] = []
    rest = text[start:]
    while rest:
        if not rest.startswith(OPEN):
            if rest.strip():
                return text, []  # text between or after the calls: not a clean call answer
            break
        end = rest.find(CLOSE)
        block = rest[len(OPEN) : end if end >= 0 else len(rest)]
        try:
            call = _call(json.loads(block))
        except ValueError:
            call = None
        if call is None:
            return text, []
        calls.append(call)
        rest = rest[end + len(CLOSE) :].lstrip() if end >= 0 else ""
    content = text[:start].strip()
    return content or None, calls


def with_calls(response: dict[str, Any]) -> dict[str, Any]:
    """A chat.completion with its message's `<tool_call>` text parsed into `tool_calls`."""
    choices = response.get("choices") or []
    if not choices:
        return response
    choice = choices[0]
    message = choice.get("message") or {}
    content, calls = split_calls(message.get("content") or "")
    if not calls:
        return response
    message = {**message, "content": content, "tool_calls": calls}
    # A call is a finished answer; one cut off by max_tokens before its closing tag is too.
    choice = {**choice, "message": message, "finish_reason": "tool_calls"}
    return {**response, "choices": [choice, *choices[1:]]}


def completion_with_calls(done: Completion) -> Completion:
    return replace(done, response=with_calls(done.response))


class CallStream:
    """Chat-completion chunks in, the same chunks out with tool-call text turned into
    `tool_calls` deltas.

    Text before a `<tool_call>` streams as it comes (less a tail that may be the start of the
    tag). From the tag on, text is held back; at the finishing chunk it is parsed: calls go out
    as one `tool_calls` delta each (name and whole arguments) and the finish reason becomes
    `tool_calls`; text that is not a clean call goes out as content after all. Token ids and
    log-prob entries stay on the chunks that carry them, so they still add up to the whole
    completion.
    """

    def __init__(self) -> None:
        self.pending = ""  # text not sent yet: a possible tag start, or everything from the tag
        self.in_calls = False
        self.calls: list[dict[str, Any]] = []

    def _release(self, text: str) -> str:
        """The part of `text` that can be sent now."""
        self.pending += text
        if not self.in_calls:
            at = self.pending.find(OPEN)
            if at >= 0:
                self.in_calls = True
                out, self.pending = self.pending[:at], self.pending[at:]
                return out
            keep = _tag_prefix_len(self.pending)
            out = self.pending[: len(self.pending) - keep]
            self.pending = self.pending[len(self.pending) - keep :]
            return out
        return ""

    def chunk(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        choices = chunk.get("choices") or []
        if not choices:
            return [chunk]  # the usage chunk
        choice = choices[0]
        delta = choice.get("delta") or {}
        if choice.get("finish_reason"):
            return self._finish(chunk)
        if not delta.get("content"):
            return [chunk]
        sent = self._release(str(delta["content"]))
        return [_with_delta(chunk, {**delta, "content": sent})]

    def _finish(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        choice = chunk["choices"][0]
        delta = choice.get("delta") or {}
        text = self.pending + str(delta.get("content") or "")
        self.pending = ""
        calls = split_calls(text)[1] if self.in_calls else []
        if not calls:
            return [_with_delta(chunk, {**delta, "content": text} if text else delta)]
        self.calls = calls
        out = []
        for index, call in enumerate(calls):
            call_delta = {"tool_calls": [{"index": index, **call}]}
            out.append(_plain(chunk, call_delta))
        finish = _with_delta(chunk, {k: v for k, v in delta.items() if k != "content"})
        finish["choices"][0]["finish_reason"] = "tool_calls"
        return [*out, finish]

    def completion(self, done: Completion) -> Completion:
        """The assembled completion, with the calls the stream sent (the same ids)."""
        out = completion_with_calls(done)
        if self.calls:
            message = out.response["choices"][0]["message"]
            message["tool_calls"] = self.calls
        return out


async def parsed_stream(
    body: dict[str, Any], items: AsyncIterator[dict[str, Any] | Completion]
) -> AsyncIterator[dict[str, Any] | Completion]:
    """An engine's stream with tool calls parsed, when `body` offers tools."""
    calls = CallStream() if parses_calls(body) else None
    try:
        async for item in items:
            if calls is None:
                yield item
            elif isinstance(item, Completion):
                yield calls.completion(item)
            else:
                for chunk in calls.chunk(item):
                    yield chunk
    finally:  # closing this closes the engine's stream at once (it cancels an unfinished request)
        aclose = getattr(items, "aclose", None)
        if aclose is not None:
            await aclose()


def _tag_prefix_len(text: str) -> int:
    """How many characters at the end of `text` could begin `<tool_call>`."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-n:]):
            return n
    return 0


def _with_delta(chunk: dict[str, Any], delta: dict[str, Any]) -> dict[str, Any]:
    choice = {**chunk["choices"][0], "delta": delta}
    return {**chunk, "choices": [choice, *chunk["choices"][1:]]}


def _plain(chunk: dict[str, Any], delta: dict[str, Any]) -> dict[str, Any]:
    """A chunk carrying only `delta` (no token ids or log-probs: they stay where they were)."""
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
    out = {k: v for k, v in chunk.items() if k != "choices"}
    if "usage" in out:
        out["usage"] = None
    return {**out, "choices": [choice]}
