"""What the records, archive and session pages show: a table row per record (live or archived),
and a session's turns with their messages, answer, reports and log-prob heat strip."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from reef.api.ui.views.text import short, text_of
from reef.guard_answers import guard_view
from reef.records import GUARD_TAG, Record, Report
from reef.store.browse import Feedback


@dataclass(frozen=True)
class Message:
    """One message of a request, whatever its wire format: who said it, and its text."""

    role: str
    text: str


def request_messages(record: Record) -> list[Message]:
    """The request's messages, whatever the wire format (chat, messages, responses)."""
    req = record.request
    out: list[Message] = []
    system = req.get("system")
    if system:
        out.append(Message("system", text_of(system)))
    items = req.get("messages")
    if items is None:
        items = req.get("input")
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
    if req.get("instructions"):
        out.append(Message("system", str(req["instructions"])))
    for m in items or []:
        if isinstance(m, dict):
            out.append(Message(str(m.get("role", "user")), text_of(m.get("content"))))
    return out


def answer_of(record: Record) -> str:
    """The answer's text, whatever the wire format."""
    resp = record.response
    choices = resp.get("choices")
    if isinstance(choices, list) and choices:
        msg = choices[0].get("message") or {}
        return text_of(msg.get("content")) or str(choices[0].get("text") or "")
    if isinstance(resp.get("content"), list):  # anthropic messages
        return text_of(resp["content"])
    output = resp.get("output")
    if isinstance(output, list):  # responses
        parts = [text_of(o.get("content")) for o in output if isinstance(o, dict)]
        return " ".join(p for p in parts if p)
    return ""


def prompt_preview(record: Record) -> str:
    users = [m.text for m in request_messages(record) if m.role == "user"]
    return short(users[-1] if users else "")


@dataclass(frozen=True)
class RecordRow:
    """One row of the records table (record_table.html), live or archived alike."""

    record: Record
    prompt: str  # the last user message, shortened
    answer: str  # shortened
    feedback: Feedback | None  # None: no report quotes it


def record_rows(records: list[Record], feedback: dict[str, Feedback]) -> list[RecordRow]:
    return [
        RecordRow(r, prompt_preview(r), short(answer_of(r)), feedback.get(r.id)) for r in records
    ]


def archived_feedback(reports: dict[str, list[Report]]) -> dict[str, Feedback]:
    """What the reports on archived records say, in short (the live records' comes from the
    database's query): their number and mean score, for records with any."""
    out: dict[str, Feedback] = {}
    for rid, reps in reports.items():
        scores = [p.score for p in reps if p.score is not None]
        if reps:
            out[rid] = Feedback(len(reps), sum(scores) / len(scores) if scores else None)
    return out


@dataclass(frozen=True)
class Cell:
    """One token of a heat strip: its text (or id) and log-prob, and its colour's class
    (`heat-0` red, unsure .. `heat-12` green, sure: reef.css; classes rather than a style
    attribute, which the dashboard's Content-Security-Policy refuses)."""

    label: str
    logprob: float
    colour: str


def heat_strip(record: Record) -> list[Cell]:
    """The answer's tokens coloured by log-prob (green sure, red unsure), where recorded. Token
    texts come from the answer's own logprobs when the client asked for them, else ids."""
    if not record.logprobs:
        return []
    labels: list[str] = []
    choices = record.response.get("choices")
    if isinstance(choices, list) and choices:
        content = ((choices[0].get("logprobs") or {}).get("content")) or []
        labels = [str(c.get("token", "")) for c in content if isinstance(c, dict)]
    ids = record.completion_token_ids or []
    cells = []
    for i, lp in enumerate(record.logprobs):
        label = labels[i] if i < len(labels) else f"#{ids[i]}" if i < len(ids) else "?"
        p = math.exp(max(lp, -30.0))
        cells.append(Cell(label, lp, f"heat-{round(12 * p)}"))
    return cells


@dataclass(frozen=True)
class Turn:
    """One exchange of a session, as the transcript shows it."""

    record: Record
    new_messages: tuple[Message, ...]  # what this turn's request added to its parent's
    answer: str
    reports: tuple[Report, ...]
    cells: tuple[Cell, ...]
    injection: dict[str, str] = field(default_factory=dict)  # the reef.* tags
    tags: dict[str, str] = field(default_factory=dict)  # the client's own tags
    # a guard answer's guard, candidate, task, score and expected answer (reef.guard_answers)
    guard: dict[str, str] | None = None


def turns(records: list[Record], reports: dict[str, list[Report]]) -> list[Turn]:
    """A session's records as turns: each shows only the messages its parent's did not."""
    out: list[Turn] = []
    seen = 0
    for r in records:
        messages = request_messages(r)
        new = messages[seen:] if r.parent_id else messages
        seen = len(messages) + 1  # the answer becomes the next request's message
        out.append(
            Turn(
                record=r,
                new_messages=tuple(new),
                answer=answer_of(r),
                reports=tuple(reports.get(r.id, [])),
                cells=tuple(heat_strip(r)),
                injection=_tags(r.tags, injected=True),
                tags=_tags(r.tags, injected=False),
                guard=guard_view(r.tags),
            )
        )
    return out


def _tags(tags: dict[str, Any], *, injected: bool) -> dict[str, str]:
    """Reef's own tags (what the harness injected: `reef.*`), or the client's. A guard
    answer's tags are neither: the transcript shows them in their own box."""
    return {
        k: v
        for k, v in tags.items()
        if k.startswith("reef.") is injected and not k.startswith(GUARD_TAG)
    }
