"""OpenAI Responses ⇄ chat completions: pure translation, no I/O.

Engines speak OpenAI chat completions; the `/v1/responses` route translates the request in and
the answer (or its stream of chunks) out, as `/v1/messages` does (reef.anthropic). Records keep
the Responses bodies the client saw.

- A response's id is its record's (`resp_<…>` for `rec_<…>`), so `previous_response_id` and
  `GET /v1/responses/{id}` find the record without another index.
- `previous_response_id` continues a stored conversation server-side: the route walks the
  chain of records back and hands `to_chat` the conversation so far (`history`): each earlier
  turn's input and output, without the earlier turns' `instructions` (they are not carried
  over, as in OpenAI's API; this request's `instructions` lead).
- Supported input items: messages (string or `input_text` / `output_text` / `input_image`
  parts), `function_call` and `function_call_output`; `reasoning` items are dropped (the
  engines have none). Tools: `function` tools, and the functions of `namespace` tools; hosted
  tools (web search, file search, …) are left out, as no engine here runs them; others are a
  400.
- `reasoning`, `store`, `metadata`, `truncation`, `include`, `text` are accepted;
  `text.format` (JSON object or schema) becomes the chat body's `response_format`; what the
  engine cannot do is left out.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from typing import Any

import orjson

from reef.errors import BadRequest

_STATUS_OF_FINISH = {"length": "incomplete", "content_filter": "incomplete"}


def response_id(record_id: str) -> str:
    """The response id of the record `record_id` (`rec_X` -> `resp_X`)."""
    return "resp_" + record_id.removeprefix("rec_")


def record_id_of(resp_id: str) -> str | None:
    """The record id a response id names, or None for an id that is not one of ours."""
    if not resp_id.startswith("resp_") or len(resp_id) <= 5:
        return None
    return "rec_" + resp_id.removeprefix("resp_")


def answered_state(resp_id: str) -> str:
    """The state hash of a record that answered with an upstream's response `resp_id` (a
    Responses body passed through): what lets a `previous_response_id` be checked against the
    caller's scenario with one indexed lookup. No conversation hash (reef.sessions) starts
    this way, so it never stitches a chat session."""
    return hashlib.sha256(b"response\0" + resp_id.encode()).hexdigest()


# input ----------------------------------------------------------------------------------------
def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", "")) if isinstance(p, dict) else str(p)
            for p in content
            if not isinstance(p, dict) or p.get("type") in ("input_text", "output_text", "text")
        )
    return str(content)


def _parts(content: list[Any], where: str) -> str | list[dict[str, Any]]:
    """Responses content parts as chat content: text joined, images as image_url parts."""
    out: list[dict[str, Any]] = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            out.append({"type": "text", "text": part})
            continue
        if not isinstance(part, dict):
            raise BadRequest(f"{where}.content[{i}] must be an object", param=f"{where}.content")
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            out.append({"type": "text", "text": str(part.get("text") or "")})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str) or not url:
                raise BadRequest(
                    f"{where}.content[{i}]: an input_image needs an image_url (file_id is not "
                    "supported)",
                    param=f"{where}.content",
                )
            out.append({"type": "image_url", "image_url": {"url": url}})
        elif kind in ("refusal",):
            out.append({"type": "text", "text": str(part.get("refusal") or "")})
        else:
            raise BadRequest(
                f"{where}.content[{i}]: content type '{kind}' is not supported",
                param=f"{where}.content",
            )
    if all(p["type"] == "text" for p in out):
        return "".join(p["text"] for p in out)
    return out


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value or {}).decode()


def input_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """This request's `input` as chat messages (not its instructions, not the history)."""
    given = body.get("input")
    if given is None:
        return []
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    if not isinstance(given, list):
        raise BadRequest("input must be a string or a list of items", param="input")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(given):
        where = f"input[{i}]"
        if isinstance(item, str):
            messages.append({"role": "user", "content": item})
            continue
        if not isinstance(item, dict):
            raise BadRequest(f"{where} must be an object", param="input")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise BadRequest(f"{where}: unknown role {role!r}", param="input")
            content = item.get("content")
            if isinstance(content, list):
                content = _parts(content, where)
            elif content is not None and not isinstance(content, str):
                raise BadRequest(f"{where}.content must be a string or a list", param="input")
            messages.append({"role": role, "content": content or ""})
        elif kind == "function_call":
            call = {
                "id": str(item.get("call_id") or item.get("id") or ""),
                "type": "function",
                "function": {
                    "name": str(item.get("name") or ""),
                    "arguments": _arguments(item.get("arguments")),
                },
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)  # parallel calls: one assistant turn
            elif last is not None and last["role"] == "assistant" and last.get("content"):
                last["tool_calls"] = [call]  # the text and the calls of one output
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": str(item.get("call_id") or ""),
                    "content": output if isinstance(output, str) else _text(output),
                }
            )
        elif kind in ("reasoning", "item_reference"):
            continue  # no engine here reasons in items; references are resolved by the client
        else:
            raise BadRequest(f"{where}: input item type '{kind}' is not supported", param="input")
    return messages


def output_messages(response: dict[str, Any]) -> list[dict[str, Any]]:
    """A response's output items as the chat messages a next turn continues from."""
    return input_messages({"input": [_as_input(item) for item in response.get("output") or []]})


def _as_input(item: dict[str, Any]) -> dict[str, Any]:
    if item.get("type") == "message":
        return {"type": "message", "role": "assistant", "content": item.get("content") or []}
    return item


# Tools the API's servers run themselves (search, code, computer, MCP connectors): no engine
# here runs them, so the model is not shown them, as if they were not on offer. An agent
# that sends them along with its own functions (Codex: web_search) keeps working.
HOSTED_TOOLS = frozenset(
    {
        "web_search",
        "web_search_preview",
        "file_search",
        "code_interpreter",
        "computer_use_preview",
        "image_generation",
        "mcp",
        "local_shell",
    }
)


def _function(tool: dict[str, Any], where: str) -> dict[str, Any]:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"{where}: a function tool needs a name", param="tools")
    # OpenAI's key order (name, description, parameters): chat templates render the tool's
    # JSON as it comes, so the model reads the same text whichever API the tool came through
    function: dict[str, Any] = {"name": name}
    if tool.get("description"):
        function["description"] = tool["description"]
    parameters = tool.get("parameters")
    function["parameters"] = (
        parameters if parameters is not None else {"type": "object", "properties": {}}
    )
    return {"type": "function", "function": function}


def _tools(tools: list[Any]) -> list[dict[str, Any]]:
    """Function tools, and the functions of `namespace` tools (Codex groups some that way),
    in chat form; hosted tools left out; anything else a 400."""
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        if kind == "function":
            out.append(_function(tool, f"tools[{i}]"))
        elif kind == "namespace" and isinstance(tool.get("tools"), list):
            for j, inner in enumerate(tool["tools"]):
                if isinstance(inner, dict) and inner.get("type") == "function":
                    out.append(_function(inner, f"tools[{i}].tools[{j}]"))
        elif kind in HOSTED_TOOLS:
            continue
        else:
            raise BadRequest(
                f"tools[{i}]: tool type '{kind}' is not supported (function tools are)",
                param="tools",
            )
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, str):
        return choice  # "auto" | "none" | "required"
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": str(choice.get("name") or "")}}
    raise BadRequest("tool_choice must be auto, none, required or a function", param="tool_choice")


def to_chat(body: dict[str, Any], history: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A Responses request (continuing `history`) as a chat-completions request."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions:
        text = instructions if isinstance(instructions, str) else _text(instructions)
        messages.append({"role": "system", "content": text})
    messages += list(history or [])
    messages += input_messages(body)
    if not messages:
        raise BadRequest("the request has no input", param="input")
    out: dict[str, Any] = {"model": body["model"], "messages": messages}
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    for key in ("temperature", "top_p", "seed"):
        if body.get(key) is not None:
            out[key] = body[key]
    tools = _tools(body.get("tools") or [])
    if tools:
        out["tools"] = tools
        if body.get("tool_choice") is not None:
            out["tool_choice"] = _tool_choice(body["tool_choice"])
        if body.get("parallel_tool_calls") is not None:
            out["parallel_tool_calls"] = bool(body["parallel_tool_calls"])
    response_format = _text_format(body.get("text"))
    if response_format is not None:
        out["response_format"] = response_format
    if body.get("top_logprobs"):
        out["logprobs"] = True
        out["top_logprobs"] = body["top_logprobs"]
    if body.get("stream"):
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out


def _text_format(text: Any) -> dict[str, Any] | None:
    """The Responses `text.format` as a chat body's `response_format` (None for plain text):
    `{"type": "json_schema", "name", "schema", "strict"}` keeps its fields one level down."""
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt.get("type") == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    return dict(fmt)  # json_object, or a type the engine will refuse by name


# output ---------------------------------------------------------------------------------------
def _item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def _usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return None
    inp, out = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    return {
        "input_tokens": inp,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": inp + out,
    }


def envelope(
    body: dict[str, Any], resp_id: str, created_at: float, status: str = "in_progress"
) -> dict[str, Any]:
    """The response object around its output: what the request asked for, echoed."""
    return {
        "id": resp_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": body.get("model", ""),
        "output": [],
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": body.get("reasoning"),
        "store": body.get("store", True),
        "temperature": body.get("temperature"),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p"),
        "truncation": body.get("truncation", "disabled"),
        "usage": None,
        "user": body.get("user"),
        "metadata": body.get("metadata") or {},
    }


def _message_item(text: str, item_id: str, status: str = "completed") -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _call_item(call: dict[str, Any], item_id: str, status: str = "completed") -> dict[str, Any]:
    fn = call.get("function") or {}
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call.get("id") or _item_id("call"),
        "name": fn.get("name", ""),
        "arguments": fn.get("arguments") or "",
    }


def from_chat(
    chat: dict[str, Any], body: dict[str, Any], resp_id: str, created_at: float | None = None
) -> dict[str, Any]:
    """A chat.completion as a Responses response object."""
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    output: list[dict[str, Any]] = []
    if message.get("content"):
        output.append(_message_item(str(message["content"]), _item_id("msg")))
    for call in message.get("tool_calls") or []:
        output.append(_call_item(call, _item_id("fc")))
    finish = choice.get("finish_reason")
    status = _STATUS_OF_FINISH.get(finish or "", "completed")
    out = envelope(body, resp_id, created_at if created_at is not None else time.time(), status)
    out["output"] = output
    out["usage"] = _usage(chat.get("usage"))
    if status == "incomplete":
        out["incomplete_details"] = {"reason": "max_output_tokens"}
    return out


def output_text(response: dict[str, Any]) -> str:
    """The text of a response's message items (what the SDK calls `output_text`)."""
    return "".join(
        _text(item.get("content"))
        for item in response.get("output") or []
        if item.get("type") == "message"
    )


class StreamTranslator:
    """Chat-completion chunks in, Responses stream events out (with sequence numbers)."""

    def __init__(self, body: dict[str, Any], resp_id: str):
        self.body = body
        self.resp_id = resp_id
        self.created_at = time.time()
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self.text_index: int | None = None  # output index of the message item, once opened
        self.text = ""
        self.calls: dict[int, int] = {}  # the chunk's tool-call index -> output index
        self.finish: str | None = None

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    def start(self) -> list[dict[str, Any]]:
        shell = envelope(self.body, self.resp_id, self.created_at)
        return [
            self._event("response.created", response=shell),
            self._event("response.in_progress", response=shell),
        ]

    def chunk(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
            if delta.get("content"):
                events += self._text_delta(str(delta["content"]))
            for call in delta.get("tool_calls") or []:
                events += self._call_delta(call)
        return events

    def _text_delta(self, text: str) -> list[dict[str, Any]]:
        events = []
        if self.text_index is None:
            self.text_index = len(self.output)
            item = _message_item("", _item_id("msg"), "in_progress")
            item["content"] = []
            self.output.append(item)
            events.append(
                self._event("response.output_item.added", output_index=self.text_index, item=item)
            )
            events.append(
                self._event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=self.text_index,
                    content_index=0,
                    part={"type": "output_text", "text": "", "annotations": []},
                )
            )
        self.text += text
        item_id = self.output[self.text_index]["id"]
        events.append(
            self._event(
                "response.output_text.delta",
                item_id=item_id,
                output_index=self.text_index,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return events

    def _call_delta(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        events = []
        index = int(call.get("index", len(self.calls)))
        fn = call.get("function") or {}
        if index not in self.calls:
            self.calls[index] = len(self.output)
            item = _call_item(
                {"id": call.get("id"), "function": {"name": fn.get("name", ""), "arguments": ""}},
                _item_id("fc"),
                "in_progress",
            )
            self.output.append(item)
            events.append(
                self._event(
                    "response.output_item.added", output_index=self.calls[index], item=dict(item)
                )
            )
        at = self.calls[index]
        item = self.output[at]
        if fn.get("name") and not item["name"]:
            item["name"] = fn["name"]
        if fn.get("arguments"):
            item["arguments"] += fn["arguments"]
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=at,
                    delta=fn["arguments"],
                )
            )
        return events

    def finish_events(self, final: dict[str, Any]) -> list[dict[str, Any]]:
        """The closing events, given the stored response (`from_chat` of the assembled answer,
        re-keyed here to the item ids the stream announced)."""
        events: list[dict[str, Any]] = []
        for at, item in enumerate(self.output):
            if item["type"] == "message":
                part = {"type": "output_text", "text": self.text, "annotations": []}
                events.append(
                    self._event(
                        "response.output_text.done",
                        item_id=item["id"],
                        output_index=at,
                        content_index=0,
                        text=self.text,
                        logprobs=[],
                    )
                )
                events.append(
                    self._event(
                        "response.content_part.done",
                        item_id=item["id"],
                        output_index=at,
                        content_index=0,
                        part=part,
                    )
                )
                item.update(status="completed", content=[part])
            else:
                events.append(
                    self._event(
                        "response.function_call_arguments.done",
                        item_id=item["id"],
                        output_index=at,
                        arguments=item["arguments"],
                    )
                )
                item["status"] = "completed"
            events.append(
                self._event("response.output_item.done", output_index=at, item=dict(item))
            )
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        events.append(self._event(kind, response=final))
        return events

    def final(self, chat: dict[str, Any]) -> dict[str, Any]:
        """The response object for the assembled answer, with the streamed items' ids."""
        out = from_chat(chat, self.body, self.resp_id, self.created_at)
        streamed = [dict(item, status="completed") for item in self.output]
        for item in streamed:
            if item["type"] == "message":
                item["content"] = [{"type": "output_text", "text": self.text, "annotations": []}]
        out["output"] = streamed or out["output"]
        return out
