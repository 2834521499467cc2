"""Experience: a scenario's records joined with their reports, checked, as samples for a recipe.

Reads only what reports point at: the reports first (they are few and small), indexed by the
records they quote; then those records, in one query the database joins on the receipts
(report_references). Records no report quotes are never read: the store counts them in one aggregate query. So time and memory grow with the reported
records of a scenario, never with its whole traffic (readiness runs on every status call and
/metrics refresh; bench/status_latency.py measures it at 100k records).

A report quoting one receipt scores that exchange. A report quoting several receipts scores
them together: ONE trajectory-level sample, its records ordered by session turn, then id.
Several reports on the same receipts are all kept (`Sample.report_ids`); a rule picks which
counts: "latest" (default), "first", or "mean" of their scores.

Each candidate sample is then checked, and a failing one is dropped alone with one counted
reason (the first that applies, in this order):

- "missing_record":  a quoted record is not in the scenario any more;
- "incomplete":      a quoted record is a stream cut before its end (reef.records.INCOMPLETE_TAG):
                     its answer is only what was streamed before the engine failed or the
                     client left;
- "not_selected":    with a slice (the loop's `reef.select`), a record is outside it (lacks
                     one of its tags, is of another session or was served to another user):
                     the sample belongs to another agent, role, session or user;
- "consumed":        a record was already trained on by this recipe (consumption receipts);
- "no_score":        the counting report carries feedback but no score;
- "unknown_release": a record names a release that is neither on the scenario's chain nor a
                     canary that served (live, or rolled back: its records are experience like
                     any other, at its parent's seq; the sample's turns name the release);
- "stale":           head seq − the oldest record's release seq > max_staleness;
- "imported":        kind "rollout" and an imported record (reef.imports) without the
                     engine's token ids: learning from one's own tokens needs them;
- "no_token_ids":    kind "rollout" and a record without recorded token ids;
- "token_mismatch":  a multi-turn sample whose turns do not extend each other token by token;
- "unpaired":        kind "preference" and no answer to the same prompt with another score.

Records that no report quotes are not samples: `awaiting_feedback` counts them.

Multi-turn token continuity. A trajectory is assembled from the token ids the engine recorded,
never by re-tokenizing text: turn k+1's prompt_token_ids must start with turn k's
prompt_token_ids + completion_token_ids. It does not when the client edited the history, when
the chat template renders earlier assistant turns differently from what was generated (e.g.
drops reasoning blocks), or when turns were served by releases with different tokenizers. Such
samples are dropped as "token_mismatch" (on-policy token identity is what RL needs). A recipe
that can live with off-policy tokens can instead (a) use the "scored" kind, whose text it
re-tokenizes itself, or (b) ask for single-turn samples by reporting per receipt.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import orjson

from reef import gcpause, responses
from reef.anthropic import assistant_message, to_openai
from reef.errors import BadRequest
from reef.records import (
    IMPORTED_TAG,
    INCOMPLETE_TAG,
    Consumption,
    Record,
    Report,
    Slice,
    content_hash,
    utcnow,
)
from reef.samples import (
    Kind,
    PreferenceSample,
    RolloutSample,
    Sample,
    ScoredSample,
    TrajectorySample,
    Turn,
    check_kind,
)
from reef.store.base import Store
from reef.store.records import RecordStore
from reef.store.reports import ReportStore

if TYPE_CHECKING:
    pass

Rule = Literal["latest", "first", "mean"]
T = TypeVar("T", Record, Report)

PAGE_SIZE = 1000


@dataclass(frozen=True)
class Experience:
    """Samples of one kind for one scenario, with what was left out and why."""

    scenario: str
    kind: Kind
    recipe: str
    samples: tuple[Sample, ...]
    dropped: Counter[str]
    awaiting_feedback: int
    head_seq: int
    max_staleness: int | None
    collected_at: datetime = field(default_factory=utcnow)

    @property
    def record_ids(self) -> list[str]:
        return sorted({rid for s in self.samples for rid in s.record_ids})


# reading the store ----------------------------------------------------------------------
def _pages(list_page: Callable[..., list[T]], scenario: str, page_size: int) -> Iterator[list[T]]:
    """Everything `list_page` (a Store lister paged by id) returns for the scenario, page by page."""
    after: str | None = None
    while True:
        page = list_page(scenario, after=after, limit=page_size)
        if not page:
            return
        yield page
        if len(page) < page_size:
            return
        after = page[-1].id


def _pages_of_reports(store: ReportStore, scenario: str, page_size: int) -> Iterator[list[Report]]:
    return _pages(store.list_reports, scenario, page_size)


def reports_of(store: Store, scenario: str, page_size: int = PAGE_SIZE) -> Iterator[Report]:
    """All reports of a scenario, oldest first."""
    for page in _pages_of_reports(store, scenario, page_size):
        yield from page


def pages_of_records(
    store: RecordStore, scenario: str, page_size: int = PAGE_SIZE
) -> Iterator[list[Record]]:
    """All records of a scenario, oldest first, one page (list) at a time."""
    return _pages(store.list_records, scenario, page_size)


def reports_by_record(
    store: ReportStore, scenario: str, page_size: int = PAGE_SIZE
) -> dict[str, list[Report]]:
    """Every report of the scenario, under each record it quotes."""
    out: dict[str, list[Report]] = {}
    for page in _pages_of_reports(store, scenario, page_size):
        for rep in page:
            for rid in dict.fromkeys(rep.references):
                out.setdefault(rid, []).append(rep)
    return out


# normalizing records ----------------------------------------------------------------------
def prompt_messages(record: Record) -> list[dict[str, Any]]:
    """The request's messages in OpenAI chat form (Anthropic and Responses bodies are
    translated; a Responses turn that continues a `previous_response_id` brings its
    instructions and its own input, the earlier turns are its session's records)."""
    if record.route == "messages":
        return list(to_openai(record.request).get("messages", []))
    if record.route == "responses":
        return list(responses.to_chat(record.request).get("messages", []))
    return list(record.request.get("messages", []))


def completion_text(record: Record) -> str:
    """The answer's text (tool calls are not text and are left out)."""
    resp = record.response
    if record.route == "responses":
        return responses.output_text(resp)
    if record.route == "messages":
        return "".join(
            b.get("text", "") for b in resp.get("content") or [] if b.get("type") == "text"
        )
    choices = resp.get("choices") or [{}]
    content = (choices[0].get("message") or {}).get("content")
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def completion_tool_calls(record: Record) -> list[dict[str, Any]]:
    """The answer's tool calls in OpenAI chat form (`{"id", "type", "function": {"name",
    "arguments"}}`), whichever route served it: what an agent asked its tools to do."""
    resp = record.response
    if record.route == "responses":
        return [c for m in responses.output_messages(resp) for c in m.get("tool_calls") or []]
    if record.route == "messages":
        return list(assistant_message(resp).get("tool_calls") or [])
    choices = resp.get("choices") or [{}]
    return list((choices[0].get("message") or {}).get("tool_calls") or [])


def _n_tokens(record: Record) -> int | None:
    if record.prompt_token_ids is not None and record.completion_token_ids is not None:
        return len(record.prompt_token_ids) + len(record.completion_token_ids)
    usage = record.response.get("usage") or {}
    p = usage.get("prompt_tokens", usage.get("input_tokens"))
    c = usage.get("completion_tokens", usage.get("output_tokens"))
    return int(p) + int(c) if p is not None and c is not None else None


def _turn(record: Record) -> Turn:
    return Turn(
        record_id=record.id,
        turn=record.turn,
        release_id=record.release_id,
        messages=tuple(prompt_messages(record)),
        completion=completion_text(record),
        prompt_token_ids=tuple(record.prompt_token_ids) if record.prompt_token_ids else None,
        completion_token_ids=tuple(record.completion_token_ids)
        if record.completion_token_ids is not None
        else None,
        logprobs=tuple(record.logprobs) if record.logprobs is not None else None,
    )


def _order(records: list[Record]) -> list[Record]:
    if len(records) == 1:
        return records
    return sorted(records, key=lambda r: (r.turn if r.turn is not None else -1, r.id))


def tokens_continue(records: Sequence[Record]) -> bool:
    """Whether each turn's prompt tokens start with the previous turn's prompt + completion."""
    for prev, cur in itertools.pairwise(records):
        if (
            prev.prompt_token_ids is None
            or prev.completion_token_ids is None
            or cur.prompt_token_ids is None
        ):
            return False
        before = list(prev.prompt_token_ids) + list(prev.completion_token_ids)
        if list(cur.prompt_token_ids[: len(before)]) != before:
            return False
    return True


def _flatten(records: Sequence[Record]) -> tuple[list[int], list[int], list[int], list[float]]:
    """(prompt, completion, mask, logprobs) of a continuous trajectory (see RolloutSample)."""
    first = records[0]
    prompt = list(first.prompt_token_ids or [])
    completion: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    done = len(prompt)  # tokens of the full sequence emitted so far
    for r in records:
        inserted = list(r.prompt_token_ids or [])[done:]
        completion += inserted
        mask += [0] * len(inserted)
        logprobs += [0.0] * len(inserted)
        gen = list(r.completion_token_ids or [])
        completion += gen
        mask += [1] * len(gen)
        lp = list(r.logprobs) if r.logprobs is not None and len(r.logprobs) == len(gen) else None
        logprobs += lp if lp is not None else [0.0] * len(gen)
        done = len(r.prompt_token_ids or []) + len(gen)
    return prompt, completion, mask, logprobs


def _topk(records: Sequence[Record]) -> tuple[tuple[int, ...], ...] | None:
    """The flattened trajectory's top-K capture rows, aligned with `_flatten`'s completion:
    one row per generated token, an empty row per inserted token; None when a turn has no
    capture or a capture that does not cover its completion."""
    rows: list[tuple[int, ...]] = []
    done = len(records[0].prompt_token_ids or [])
    for r in records:
        gen = r.completion_token_ids or []
        ids = (r.topk or {}).get("ids")
        if not isinstance(ids, list) or len(ids) != len(gen):
            return None
        rows += [()] * len(list(r.prompt_token_ids or [])[done:])
        rows += [tuple(int(v) for v in row) for row in ids]
        done = len(r.prompt_token_ids or []) + len(gen)
    return tuple(rows)


# the rule --------------------------------------------------------------------------------
def pick(
    reports: Sequence[Report], rule: Rule = "latest", metric: str = "score"
) -> tuple[Report, float | None]:
    """The report that counts and the value it gives `metric` (reef.metric: the score, or a
    named metric), among several on the same receipts.

    A person's word wins over the judge's: when a report that is not a judgment (reef.judge)
    gives a value, the judgments are left out; a valueless human report (text the judge
    turned into a score) is superseded by its judgment."""
    if len(reports) == 1:  # the common case; every rule gives the one report's value
        return reports[0], reports[0].value(metric)
    human = [r for r in reports if r.metadata.get("source") != "judge"]
    if any(r.value(metric) is not None for r in human):
        reports = human
    elif len(human) < len(reports):
        reports = [r for r in reports if r.metadata.get("source") == "judge"]
    ordered = sorted(reports, key=lambda r: (r.created_at, r.id))
    if rule == "first":
        return ordered[0], ordered[0].value(metric)
    if rule == "mean":
        values = [v for v in (r.value(metric) for r in ordered) if v is not None]
        return ordered[-1], (sum(values) / len(values) if values else None)
    if rule == "latest":
        return ordered[-1], ordered[-1].value(metric)
    raise BadRequest(f"unknown report rule '{rule}': use latest, first or mean")


def _sample_id(record_ids: Sequence[str]) -> str:
    if len(record_ids) == 1:
        return record_ids[0]
    return "traj_" + hashlib.sha256(",".join(record_ids).encode()).hexdigest()[:26]


# collecting -------------------------------------------------------------------------------
def _release_seqs(store: Store, scenario: str) -> tuple[dict[str, int], int]:
    """The chain position of every release a record can have been made on, and the head's."""
    chain = store.list_releases(scenario)
    scenario_row = store.get_scenario(scenario)
    seq_of = {r.id: r.seq for r in chain}
    head_seq = seq_of.get(scenario_row.head_release_id, max(seq_of.values(), default=0))
    # A canary serves before it is on the chain, and a rolled-back one never gets there: its
    # records count as made on the release it was made on (a promoted one is on the chain).
    for status in ("canary", "rolled_back"):
        for served in store.list_candidates(scenario, status):
            if served.parent_id in seq_of:
                seq_of[served.id] = seq_of[served.parent_id]
    return seq_of, head_seq


def _by_receipts(by_record: Mapping[str, list[Report]]) -> dict[tuple[str, ...], list[Report]]:
    """The reports grouped by the exact set of receipts they quote: one group, one sample."""
    groups: dict[tuple[str, ...], list[Report]] = {}
    for reps in by_record.values():
        for rep in reps:
            refs = rep.references
            key = refs if len(refs) == 1 else tuple(sorted(set(refs)))
            lst = groups.setdefault(key, [])
            if all(r.id != rep.id for r in lst):
                lst.append(rep)
    return groups


def collect(
    store: Store,
    scenario: str,
    kind: str,
    *,
    recipe: str,
    max_staleness: int | None = None,
    rule: Rule = "latest",
    page_size: int = PAGE_SIZE,
    select: Slice | None = None,
    metric: str = "score",
    judgments: bool = True,
) -> Experience:
    """The scenario's experience for `kind`, as `recipe` (whose consumption receipts count)
    would see it now. Reads only; `max_staleness=None` keeps samples of any age; `select` keeps
    only samples whose every record is in the slice (its tags, sessions, users); `metric`
    is what a sample's score is (reef.metric: the reports' score, or a named metric);
    `judgments=False` leaves the judge's reports out (judge.min_agreement not shown)."""
    with gcpause.paused():
        return _collect(
            store,
            scenario,
            check_kind(kind),
            recipe,
            max_staleness,
            rule,
            page_size,
            select or Slice(),
            metric,
            judgments,
        )


def _collect(
    store: Store,
    scenario: str,
    kind: Kind,
    recipe: str,
    max_staleness: int | None,
    rule: Rule,
    page_size: int,
    select: Slice,
    metric: str,
    judgments: bool,
) -> Experience:
    seq_of, head_seq = _release_seqs(store, scenario)
    consumed = store.consumed_record_ids(scenario, recipe)

    by_record = reports_by_record(store, scenario, page_size)
    groups = _by_receipts(by_record)
    wanted = {rec.id: rec for rec in store.quoted_records(scenario)}
    del by_record
    awaiting = store.count_awaiting_feedback(scenario, recipe, select)

    dropped: Counter[str] = Counter()
    candidates: list[tuple[list[Record], Report, float, list[Report], int]] = []
    for key, reps in groups.items():
        records = [wanted[rid] for rid in key if rid in wanted]
        if len(records) != len(key):
            dropped["missing_record"] += 1
            continue
        if any(INCOMPLETE_TAG in r.tags for r in records):
            dropped["incomplete"] += 1
            continue
        if select and not all(select.holds(r) for r in records):
            dropped["not_selected"] += 1
            continue
        records = _order(records)
        if any(r.id in consumed for r in records):
            dropped["consumed"] += 1
            continue
        if not judgments:
            reps = [r for r in reps if r.metadata.get("source") != "judge"]
            if not reps:
                dropped["judge_not_trusted"] += 1
                continue
        report, score = pick(reps, rule, metric)
        if score is None or (isinstance(score, float) and math.isnan(score)):
            # a turn the judge could not judge says why (reef.judge.dropped_report)
            dropped[str(report.metadata.get("dropped") or f"no_{metric}")] += 1
            continue
        if any(r.release_id not in seq_of for r in records):
            dropped["unknown_release"] += 1
            continue
        staleness = head_seq - min(seq_of[r.release_id] for r in records)
        if max_staleness is not None and staleness > max_staleness:
            dropped["stale"] += 1
            continue
        why = _tokens_refusal(records, kind)
        if why:
            dropped[why] += 1
            continue
        candidates.append((records, report, float(score), reps, staleness))

    samples: list[Sample]
    if kind == "preference":
        samples = _pairs(candidates, dropped)
    else:
        samples = [_build(kind, *c) for c in candidates]
    samples.sort(key=lambda s: s.sample_id)
    return Experience(
        scenario=scenario,
        kind=kind,
        recipe=recipe,
        samples=tuple(samples),
        dropped=dropped,
        awaiting_feedback=awaiting,
        head_seq=head_seq,
        max_staleness=max_staleness,
    )


def _tokens_refusal(records: Sequence[Record], kind: Kind) -> str | None:
    """Why these records' tokens cannot make a sample of `kind`, or None."""
    if kind == "rollout" and any(
        r.prompt_token_ids is None or r.completion_token_ids is None for r in records
    ):
        return "imported" if any(IMPORTED_TAG in r.tags for r in records) else "no_token_ids"
    has_ids = all(r.prompt_token_ids is not None for r in records)
    if len(records) > 1 and has_ids and not tokens_continue(records):
        return "token_mismatch"
    return None


def _report_ids(reps: Sequence[Report]) -> tuple[str, ...]:
    if len(reps) == 1:
        return (reps[0].id,)
    return tuple(r.id for r in sorted(reps, key=lambda r: (r.created_at, r.id)))


def _build(
    kind: Kind,
    records: list[Record],
    report: Report,
    score: float,
    reps: list[Report],
    staleness: int,
) -> Sample:
    last = records[-1]
    ids = tuple(r.id for r in records)
    common: dict[str, Any] = {
        "sample_id": _sample_id(ids),
        "record_ids": ids,
        "release_id": last.release_id,
        "staleness": staleness,
        "score": score,
        "report_id": report.id,
        "report_ids": _report_ids(reps),
    }
    if kind == "scored":
        return ScoredSample(
            **common,
            messages=tuple(prompt_messages(last)),
            completion=completion_text(last),
            n_tokens=_n_tokens(last),
            feedback=None if report.feedback is None else dumps(report.feedback),
        )
    if kind == "rollout":
        prompt, completion, mask, logprobs = _flatten(records)
        has_lp = all(r.logprobs is not None for r in records)
        return RolloutSample(
            **common,
            messages=tuple(prompt_messages(records[0])),
            completion=completion_text(last),
            prompt_token_ids=tuple(prompt),
            completion_token_ids=tuple(completion),
            completion_mask=tuple(mask),
            logprobs=tuple(logprobs) if has_lp else None,
            n_tokens=len(prompt) + len(completion),
            report_metadata=dumps(report.metadata) if report.metadata else None,
            reported_at=report.created_at.isoformat(),
            topk_ids=_topk(records),
        )
    return TrajectorySample(
        **common,
        session_id=last.session_id,
        turns=tuple(_turn(r) for r in records),
        n_tokens=_n_tokens(last),
    )


def _pairs(
    candidates: list[tuple[list[Record], Report, float, list[Report], int]],
    dropped: Counter[str],
) -> list[Sample]:
    """Pair answers to the same prompt (same normalized request messages): the best with the
    worst, the second best with the second worst, ... while their scores differ. Each answer is
    in at most one pair, so consuming a pair never consumes an answer twice."""
    by_prompt: dict[str, list[tuple[Record, float, list[Report], int]]] = {}
    for records, _report, score, reps, staleness in candidates:
        if len(records) != 1:
            dropped["unpaired"] += 1  # a trajectory has no single prompt to compare on
            continue
        rec = records[0]
        by_prompt.setdefault(content_hash(prompt_messages(rec)), []).append(
            (rec, score, reps, staleness)
        )
    out: list[Sample] = []
    for answers in by_prompt.values():
        answers.sort(key=lambda a: (-a[1], a[0].id))
        i, j = 0, len(answers) - 1
        while i < j and answers[i][1] != answers[j][1]:
            (c, cs, creps, cst), (r, rs, rreps, rst) = answers[i], answers[j]
            ids = (c.id, r.id)
            lens = [n for n in (_n_tokens(c), _n_tokens(r)) if n is not None]
            out.append(
                PreferenceSample(
                    sample_id="pair_" + hashlib.sha256(",".join(ids).encode()).hexdigest()[:26],
                    record_ids=ids,
                    release_id=c.release_id,
                    staleness=max(cst, rst),
                    messages=tuple(prompt_messages(c)),
                    chosen=completion_text(c),
                    rejected=completion_text(r),
                    chosen_score=cs,
                    rejected_score=rs,
                    report_ids=_report_ids(creps) + _report_ids(rreps),
                    n_tokens=max(lens) if lens else None,
                )
            )
            i, j = i + 1, j - 1
        dropped["unpaired"] += len(answers) - 2 * i
    return out


# consumption ---------------------------------------------------------------------
def receipts(
    scenario: str, recipe: str, samples: Sequence[Sample], batch_id: str
) -> list[Consumption]:
    """The consumption receipts for every record of `samples` (trained on in `batch_id`): once
    stored, later or repeated feedback never trains them again for `recipe`. A published
    batch's are stored with its release's compare-and-swap (ReleaseChain.publish)."""
    now = utcnow()
    ids = sorted({rid for s in samples for rid in s.record_ids})
    return [Consumption(scenario, recipe, rid, batch_id, now) for rid in ids]


def consume(
    store: ReportStore, scenario: str, recipe: str, samples: Sequence[Sample], batch_id: str
) -> int:
    """Write the consumption receipts of `samples` (`receipts`). Returns receipts written."""
    made = receipts(scenario, recipe, samples, batch_id)
    store.add_consumptions(made)
    return len(made)


def dumps(obj: Any) -> str:
    """Canonical JSON text (sorted keys) for message lists and feedback objects in datasets."""
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS).decode()


def correction(feedback: str | None) -> str | None:
    """The corrected answer a structured feedback object carries under "correction", if any."""
    if feedback is None:
        return None
    try:
        value = orjson.loads(feedback)
    except orjson.JSONDecodeError:
        return None
    fixed = value.get("correction") if isinstance(value, dict) else None
    return fixed if isinstance(fixed, str) and fixed.strip() else None
