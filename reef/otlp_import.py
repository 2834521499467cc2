"""OpenTelemetry GenAI spans as chat exchanges, for reef.imports.

Reads OTLP/JSON trace exports (`{"resourceSpans": [...]}`, one export request per line: what
the OpenTelemetry Collector's file exporter writes) and turns each span that carries the GenAI
semantic conventions' content attributes into a prompt and an answer in OpenAI chat form:

- `gen_ai.input.messages` / `gen_ai.output.messages`: messages with typed parts (`text`,
  `tool_call`, `tool_call_response`), as a JSON string or a structured OTLP value;
- `gen_ai.system_instructions`: the system prompt, when instrumentations record it apart;
- `gen_ai.response.model` (else `gen_ai.request.model`): the model.

Spans without both message attributes (HTTP, database, agent-step spans) are not exchanges and
are skipped. A span's id is `<traceId>:<spanId>`, so a re-import adds nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True)
class Exchange:
    """One GenAI span: its id, the prompt and the answer in OpenAI chat form, the model."""

    span_id: str
    messages: list[dict[str, Any]]
    completion: str
    tool_calls: list[dict[str, Any]]
    model: str | None


def any_value(v: dict[str, Any]) -> Any:
    """An OTLP/JSON AnyValue as a plain Python value."""
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return int(v["intValue"])  # a string in OTLP/JSON (64-bit)
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "arrayValue" in v:
        return [any_value(x) for x in v["arrayValue"].get("values") or []]
    if "kvlistValue" in v:
        return {
            kv["key"]: any_value(kv.get("value") or {})
            for kv in v["kvlistValue"].get("values") or []
        }
    return None


def _structured(value: Any) -> Any:
    """A message attribute recorded as a JSON string, or already structured."""
    return orjson.loads(value) if isinstance(value, str) else value


def _text(parts: list[dict[str, Any]]) -> str:
    return "".join(str(p.get("content", "")) for p in parts if p.get("type") == "text")


def _tool_calls(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    calls = []
    for p in parts:
        if p.get("type") == "tool_call":
            arguments = p.get("arguments")
            calls.append(
                {
                    "id": str(p.get("id") or ""),
                    "type": "function",
                    "function": {
                        "name": str(p.get("name") or ""),
                        "arguments": arguments
                        if isinstance(arguments, str)
                        else orjson.dumps(arguments).decode(),
                    },
                }
            )
    return calls


def chat_message(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A GenAI input message as OpenAI chat messages (a tool message per tool result)."""
    role = str(message.get("role") or "user")
    parts = [p for p in message.get("parts") or [] if isinstance(p, dict)]
    results = [p for p in parts if p.get("type") == "tool_call_response"]
    if results:
        return [
            {
                "role": "tool",
                "tool_call_id": str(p.get("id") or "").strip(),
                "content": p["result"]
                if isinstance(p.get("result"), str)
                else orjson.dumps(p.get("result")).decode(),
            }
            for p in results
        ]
    out: dict[str, Any] = {"role": role, "content": _text(parts)}
    if role == "assistant" and (calls := _tool_calls(parts)):
        out["tool_calls"] = calls
    return [out]


def exchanges(export: dict[str, Any]) -> Iterator[Exchange]:
    """The GenAI exchanges of one OTLP/JSON export request, in its order."""
    for resource in export.get("resourceSpans") or []:
        for scope in resource.get("scopeSpans") or []:
            for span in scope.get("spans") or []:
                attrs = {
                    a["key"]: any_value(a.get("value") or {}) for a in span.get("attributes") or []
                }
                if "gen_ai.input.messages" not in attrs or "gen_ai.output.messages" not in attrs:
                    continue
                messages = [
                    m
                    for msg in _structured(attrs["gen_ai.input.messages"])
                    for m in chat_message(msg)
                ]
                system = attrs.get("gen_ai.system_instructions")
                if system is not None:
                    parts = _structured(system)
                    text = _text(parts) if isinstance(parts, list) else str(parts)
                    messages.insert(0, {"role": "system", "content": text})
                outputs = _structured(attrs["gen_ai.output.messages"]) or [{}]
                parts = [p for p in outputs[0].get("parts") or [] if isinstance(p, dict)]
                yield Exchange(
                    span_id=f"{span.get('traceId', '')}:{span.get('spanId', '')}",
                    messages=messages,
                    completion=_text(parts),
                    tool_calls=_tool_calls(parts),
                    model=attrs.get("gen_ai.response.model") or attrs.get("gen_ai.request.model"),
                )
