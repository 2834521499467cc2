"""Import: experience from outside Reef, as records and reports of a scenario.

A team that already has logs starts from them instead of from nothing. Three JSONL formats,
told apart line by line:

- **OpenAI chat**: `{"messages": [...], "completion": "..."}`, or the fine-tuning shape whose
  last message is the assistant's answer (`{"messages": [..., {"role": "assistant", ...}]}`).
  Optional: `id` (the caller's id: a re-import skips it), `score`, `feedback` (a string or an
  object; `{"correction": "..."}` is a training target as in a report), `model`, `tags`.
- **Reef's own export** (`reef export --format jsonl`): a row per record with its feedback, its
  token ids and log-probs when the engine recorded them, its session and turn. A round trip
  brings back the same turns, the same reports and the same sessions (new record ids; the
  report ids are kept, so reports quoting several turns stay one report).
- **OpenTelemetry GenAI spans** (`{"resourceSpans": [...]}`: OTLP/JSON trace exports, as the
  Collector's file exporter writes them): each span with `gen_ai.input.messages` and
  `gen_ai.output.messages` is an exchange (reef.otlp_import); other spans are skipped. Spans
  carry no feedback: report on the imported records afterwards.

Imported records are marked (tag `reef.imported`: the format), are made on the scenario's head
at import time (so `reef.max_staleness` ages them like served ones), carry no token ids or
log-probs unless the file has them, and join experience with their feedback exactly as served
ones do. Recipes that learn from the engine's own tokens and log-probs (kind "rollout":
openclaw, grpo, sao, tttd) drop imported records without them, as "imported" (the status
route shows the count). They never count as served traffic (the dashboard's calls per hour).
Idempotent: each record's Idempotency-Key is `import:<the caller's id>` (or a hash of the line
when it has none), so importing a file twice adds nothing the second time. A file is checked
whole before anything is written (a bad line is named and adds nothing), then read and written
a batch at a time: a file of any size streams.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from reef.errors import BadRequest
from reef.otlp_import import exchanges
from reef.records import IMPORTED_TAG, Record, Report, new_id, utcnow
from reef.store.base import Store

ROUTE = "chat.completions"
BATCH = 500


@dataclass
class ImportResult:
    """What an import added, what it found already there, and the reports it could not place."""

    records: int = 0
    reports: int = 0
    skipped: int = 0  # lines imported before (their Idempotency-Key is taken)
    dangling_reports: list[str] = field(default_factory=list)  # quote records not in the file


@dataclass
class _Line:
    key: str  # the Idempotency-Key's suffix: the caller's id, or the line's hash
    record: Record
    old_id: str | None  # a Reef export row's record id (sessions and reports quote it)
    old_parent: str | None
    reports: list[dict[str, Any]]  # {"id", "score", "feedback", "references" (old ids), ...}


def _fail(lineno: int, why: str) -> BadRequest:
    return BadRequest(f"line {lineno}: {why}")


def _response(completion: str, tool_calls: list[Any] | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": completion}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
    }


def _text(content: Any, lineno: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # text parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if content is None:
        return ""
    raise _fail(lineno, "the completion must be a string or a list of text parts")


def _openai(row: dict[str, Any], lineno: int, base: dict[str, Any]) -> _Line:
    messages = row.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise _fail(lineno, "'messages' must be a list of message objects")
    tool_calls = None
    if "completion" in row:
        completion = _text(row["completion"], lineno)
    elif messages and messages[-1].get("role") == "assistant":
        completion = _text(messages[-1].get("content"), lineno)
        tool_calls = messages[-1].get("tool_calls")
        messages = messages[:-1]
    else:
        raise _fail(lineno, "no answer: give 'completion' or end 'messages' with the assistant's")
    if not messages:
        raise _fail(lineno, "no prompt: 'messages' has nothing before the answer")
    tags = row.get("tags") or {}
    if not isinstance(tags, dict) or not all(isinstance(v, str) for v in tags.values()):
        raise _fail(lineno, "'tags' must map names to strings")
    if any(k.startswith("reef.") for k in tags):
        raise _fail(lineno, "tags under 'reef.' are Reef's own")
    caller_id = row.get("id")
    if caller_id is not None and not isinstance(caller_id, str):
        raise _fail(lineno, "'id' must be a string")
    model = str(row.get("model") or "imported")
    record = Record(
        **base,
        model=model,
        request={"model": model, "messages": messages},
        response=_response(completion, tool_calls),
        tags={**tags, IMPORTED_TAG: "openai"},
    )
    reports = []
    if row.get("score") is not None or row.get("feedback") is not None:
        score = row.get("score")
        if score is not None and (isinstance(score, bool) or not isinstance(score, int | float)):
            raise _fail(lineno, "'score' must be a number")
        reports.append({"score": score, "feedback": row.get("feedback"), "references": None})
    key = caller_id or hashlib.sha256(orjson.dumps(row, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return _Line(key, record, None, None, reports)


def _reef(row: dict[str, Any], lineno: int, base: dict[str, Any]) -> _Line:
    try:
        messages = orjson.loads(row["messages"])
        tool_calls = orjson.loads(row.get("tool_calls") or "[]")
        feedback = [
            {
                "id": f["report_id"],
                "score": f.get("score"),
                "feedback": None if f.get("feedback") is None else orjson.loads(f["feedback"]),
                "references": list(f.get("references") or [row["record_id"]]),
                "metadata": orjson.loads(f["metadata"]) if f.get("metadata") else {},
                "metrics": orjson.loads(f["metrics"]) if f.get("metrics") else {},
            }
            for f in row.get("feedback") or []
        ]
    except (KeyError, TypeError, orjson.JSONDecodeError) as e:
        raise _fail(lineno, f"not a row of reef export: {type(e).__name__}: {e}") from e
    model = str(row.get("model") or "imported")
    session = row.get("session_id")
    record = Record(
        **base,
        model=model,
        request={"model": model, "messages": messages},
        response=_response(_text(row.get("completion"), lineno), tool_calls),
        prompt_token_ids=row.get("prompt_token_ids"),
        completion_token_ids=row.get("completion_token_ids"),
        logprobs=row.get("logprobs"),
        tags={IMPORTED_TAG: "reef"},
        # a record that was its own session (never stitched) stays one
        session_id=session if session and session != row["record_id"] else None,
        turn=row.get("turn") if session and session != row["record_id"] else None,
    )
    return _Line(row["record_id"], record, row["record_id"], row.get("parent_id"), feedback)


def _otlp(row: dict[str, Any], lineno: int, base: Callable[[], dict[str, Any]]) -> list[_Line]:
    try:
        found = list(exchanges(row))
    except (KeyError, TypeError, ValueError, AttributeError, orjson.JSONDecodeError) as e:
        raise _fail(lineno, f"not an OTLP/JSON trace export: {type(e).__name__}: {e}") from e
    out = []
    for x in found:
        model = x.model or "imported"
        record = Record(
            **base(),
            model=model,
            request={"model": model, "messages": x.messages},
            response=_response(x.completion, x.tool_calls),
            tags={IMPORTED_TAG: "otlp"},
        )
        out.append(_Line(x.span_id, record, None, None, []))
    return out


def parse(lines: Iterable[bytes], scenario: str, release_id: str) -> Iterator[_Line]:
    """Each non-blank JSONL line as a record to add (and its reports), or BadRequest naming
    the line."""
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            row = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise _fail(lineno, f"not JSON: {e}") from e
        if not isinstance(row, dict):
            raise _fail(lineno, "a line must be a JSON object")

        def base() -> dict[str, Any]:
            return {
                "id": new_id("rec"),
                "scenario": scenario,
                "created_at": utcnow(),
                "route": ROUTE,
                "stream": False,
                "release_id": release_id,
            }

        if "resourceSpans" in row:
            yield from _otlp(row, lineno, base)
        elif "record_id" in row and isinstance(row.get("messages"), str):
            yield _reef(row, lineno, base())
        else:
            yield _openai(row, lineno, base())


class _Importer:
    def __init__(self, store: Store, scenario: str):
        self.store = store
        self.scenario = scenario
        self.result = ImportResult()
        self.new_ids: dict[str, str] = {}  # a Reef export's record id -> the record made of it
        # reports waiting for their records: id -> (fields, references, already new ids?)
        self.pending: dict[str, tuple[dict[str, Any], list[str], bool]] = {}

    def batch(self, lines: list[_Line]) -> None:
        # earlier turns first, so a turn finds its parent's new id (an export lists records by
        # id: the turns of one millisecond in any order)
        lines = sorted(lines, key=lambda line: -1 if line.record.turn is None else line.record.turn)
        keyed = {f"import:{line.key}": line for line in lines}
        if len(keyed) < len(lines):
            raise BadRequest("two lines of one batch have the same id")
        taken = self.store.idempotent_ids(self.scenario, ROUTE, list(keyed))
        fresh = []
        for key, line in keyed.items():
            made = taken.get(key, line.record.id)
            if line.old_id is not None:
                self.new_ids[line.old_id] = made
            if key in taken:
                self.result.skipped += 1
            else:
                parent = self.new_ids.get(line.old_parent or "")
                rec = line.record
                fresh.append(
                    replace(rec, idempotency_key=key, parent_id=parent if rec.session_id else None)
                )
            for rep in line.reports:
                if rep.get("references") is None:  # an OpenAI line's score: on its own record
                    rid = "import:" + hashlib.sha256(key.encode()).hexdigest()[:32]
                    self.pending.setdefault(rid, (rep, [made], True))
                else:  # a Reef export's report: quotes the file's record ids
                    self.pending.setdefault(rep["id"], (rep, rep["references"], False))
        self.store.add_records(fresh)
        self.result.records += len(fresh)
        self._place_reports()

    def _place_reports(self) -> None:
        """Add each pending report whose every quoted record is in the store by now."""
        for rid, (rep, refs, mapped) in list(self.pending.items()):
            if not mapped:
                if not all(r in self.new_ids for r in refs):
                    continue  # a later line may bring the rest
                refs = [self.new_ids[r] for r in refs]
            _, created = self.store.add_report(
                Report(
                    id=rid,
                    scenario=self.scenario,
                    created_at=utcnow(),
                    references=tuple(dict.fromkeys(refs)),
                    score=rep.get("score"),
                    feedback=rep.get("feedback"),
                    metadata={**(rep.get("metadata") or {}), "imported": True},
                    metrics=rep.get("metrics") or {},
                )
            )
            self.result.reports += int(created)
            del self.pending[rid]


def import_lines(store: Store, scenario: str, lines: Iterable[bytes]) -> ImportResult:
    """Add the lines' records and reports to `scenario` (created if new)."""
    head = store.ensure_scenario(scenario).head_release_id
    importer = _Importer(store, scenario)
    batch: list[_Line] = []
    for line in parse(lines, scenario, head):
        batch.append(line)
        if len(batch) >= BATCH:
            importer.batch(batch)
            batch = []
    if batch:
        importer.batch(batch)
    importer.result.dangling_reports = sorted(importer.pending)
    return importer.result


def import_file(store: Store, scenario: str, path: Path) -> ImportResult:
    """`import_lines` over a JSONL file, read a line at a time, twice: every line is checked
    before the first is written, so a bad line (named in the BadRequest) adds nothing."""
    with open(path, "rb") as f:
        for _ in parse(f, scenario, "rel_check"):
            pass
    with open(path, "rb") as f:
        return import_lines(store, scenario, f)
