"""What the dashboard's templates show, computed from records, reports and releases: previews,
turns, heat strips, sparklines, diffs and chart series. Pure functions, no I/O."""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from reef.figures import Figure
from reef.records import Record, Release, Report, utcnow
from reef.store.browse import ScoreStats
from reef.store.events import Delivery


def text_of(content: Any) -> str:
    """The text of a message's content: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


def request_messages(record: Record) -> list[dict[str, str]]:
    """The request's messages as (role, text), whatever the wire format (chat, messages,
    responses)."""
    req = record.request
    out: list[dict[str, str]] = []
    system = req.get("system")
    if system:
        out.append({"role": "system", "text": text_of(system)})
    items = req.get("messages")
    if items is None:
        items = req.get("input")
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
    if req.get("instructions"):
        out.append({"role": "system", "text": str(req["instructions"])})
    for m in items or []:
        if isinstance(m, dict):
            out.append({"role": str(m.get("role", "user")), "text": text_of(m.get("content"))})
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


def num(value: Any) -> str:
    """A number as people read it: integers whole, others to three decimals at most."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.3f}".rstrip("0").rstrip(".")


def short(text: str, n: int = 140) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def prompt_preview(record: Record) -> str:
    users = [m["text"] for m in request_messages(record) if m["role"] == "user"]
    return short(users[-1] if users else "")


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


@dataclass
class Turn:
    """One exchange of a session, as the transcript shows it."""

    record: Record
    new_messages: list[dict[str, str]]
    answer: str
    reports: list[Report]
    cells: list[Cell]
    injection: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


def turns(records: list[Record], reports: dict[str, list[Report]]) -> list[Turn]:
    """A session's records as turns: each shows only the messages its parent's did not."""
    out: list[Turn] = []
    seen = 0
    for r in records:
        messages = request_messages(r)
        new = messages[seen:] if r.parent_id else messages
        seen = len(messages) + 1  # the answer becomes the next request's message
        inj = {k: v for k, v in r.tags.items() if k.startswith("reef.")}
        tags = {k: v for k, v in r.tags.items() if not k.startswith("reef.")}
        out.append(Turn(r, new, answer_of(r), reports.get(r.id, []), heat_strip(r), inj, tags))
    return out


def age(when: datetime, now: datetime | None = None) -> str:
    """'3 min', '5 h', '2 d': how long ago."""
    s = max(0.0, ((now or utcnow()) - when).total_seconds())
    if s < 90:
        return f"{int(s)} s"
    if s < 5400:
        return f"{int(s // 60)} min"
    if s < 172800:
        return f"{int(s // 3600)} h"
    return f"{int(s // 86400)} d"


def sparkline(values: list[float | None], width: int = 120, height: int = 28) -> str:
    """An SVG polyline's points for `values` (None: gap, drawn as the previous value)."""
    nums = [v for v in values if v is not None]
    if len(nums) < 1:
        return ""
    lo, hi = min(nums), max(nums)
    span = (hi - lo) or 1.0
    step = width / max(1, len(values) - 1)
    points = []
    last = nums[0]
    for i, v in enumerate(values):
        last = v if v is not None else last
        y = height - 2 - (last - lo) / span * (height - 4)
        points.append(f"{i * step:.1f},{y:.1f}")
    return " ".join(points)


def bars(values: list[int], width: int = 120, height: int = 28) -> list[dict[str, float]]:
    """Rectangles of an SVG bar chart of `values` (traffic per hour)."""
    top = max(values) if values and max(values) > 0 else 1
    w = width / max(1, len(values))
    return [
        {"x": i * w, "w": max(1.0, w - 1), "h": v / top * height, "y": height - v / top * height}
        for i, v in enumerate(values)
    ]


def gate_numbers(gate: dict[str, Any]) -> dict[str, Any]:
    """The gate's decision in the words the timeline uses."""
    keys = (
        "status",
        "policy",
        "test",
        "n",
        "mean_candidate",
        "mean_head",
        "mean_diff",
        "ci_low",
        "p_value",
        "margin",
        "reason",
    )
    return {k: gate[k] for k in keys if gate.get(k) not in (None, "")}


def curve(chain: list[Release], scores: dict[str, ScoreStats]) -> dict[str, list[Any]]:
    """Chart series per release, oldest first: mean reported score with its interval and the
    gate's held-out means (candidate). Other figures per release: `figure_series`."""
    out: dict[str, list[Any]] = {
        "seq": [],
        "label": [],
        "mean": [],
        "low": [],
        "high": [],
        "n": [],
        "gate": [],
    }
    for r in chain:
        s = scores.get(r.id)
        out["seq"].append(r.seq)
        out["label"].append(f"#{r.seq} {r.operation}")
        out["mean"].append(None if s is None else round(s.mean, 4))
        out["low"].append(None if s is None else round(s.low, 4))
        out["high"].append(None if s is None else round(s.high, 4))
        out["n"].append(0 if s is None else s.n)
        held = r.gate.get("mean_candidate")
        out["gate"].append(round(float(held), 4) if isinstance(held, int | float) else None)
    return out


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def figure_series(
    chain: list[Release], figures: list[Figure], max_metrics: int = 40
) -> list[dict[str, Any]]:
    """The second chart's series per release, oldest first (aligned with `curve`): the demo
    and bench figures measured outside Reef (reef.figures) first, then every numeric metric
    the releases recorded when registered (training loss, tttd's best verified score, the
    gate's numbers...). None where a release has no value."""
    index = {r.id: i for i, r in enumerate(chain)}
    out: list[dict[str, Any]] = []
    for f in figures:
        values: list[float | None] = [None] * len(chain)
        for p in f.points:
            if p.release_id in index:
                values[index[p.release_id]] = round(p.value, 6)
        off = sum(1 for p in f.points if p.release_id not in index)
        out.append(
            {"name": f.title, "key": f"figure:{f.name}", "source": f.source, "values": values}
            | ({"off_chain": off} if off else {})
        )
    keys = sorted({k for r in chain for k, v in r.metrics.items() if _finite(v)})
    for k in keys[:max_metrics]:
        vals = [round(float(r.metrics[k]), 6) if _finite(r.metrics.get(k)) else None for r in chain]
        out.append({"name": k, "key": f"metric:{k}", "source": "release metrics", "values": vals})
    return out


def diff(old: dict[str, str], new: dict[str, str]) -> list[dict[str, Any]]:
    """A unified diff per changed file of two harness trees (path -> text)."""
    out = []
    for path in sorted(set(old) | set(new)):
        a, b = old.get(path), new.get(path)
        if a == b:
            continue
        lines = list(
            difflib.unified_diff(
                (a or "").splitlines(),
                (b or "").splitlines(),
                fromfile=f"a/{path}" if a is not None else "/dev/null",
                tofile=f"b/{path}" if b is not None else "/dev/null",
                lineterm="",
            )
        )
        status = "added" if a is None else "removed" if b is None else "changed"
        out.append({"path": path, "status": status, "lines": lines})
    return out


def webhook_events(deliveries: list[Delivery]) -> list[dict[str, Any]]:
    """The jobs page's recent webhook events: each delivery's kind, where it goes (scheme and
    host only: a webhook's path may carry a token), its state and its last error."""
    rows = []
    for d in deliveries:
        where = urlsplit(d.url)
        rows.append(
            {
                "event_id": d.event_id,
                "kind": d.kind,
                "target": f"{where.scheme}://{where.netloc}",
                "status": d.status,
                "attempts": d.attempts,
                "created_at": d.created_at,
                "next_at": d.next_attempt_at if d.status == "pending" else None,
                "error": short(d.last_error or "", 200),
            }
        )
    return rows
