"""The judge: what came after an assistant turn (a next message, a text report) becomes a vote
in {+1, 0, -1} and hindsight hints, stored as a report with `source: judge`.

OpenClaw-RL's process reward (the OpenClaw-RL paper), in our own words. Two questions are asked
of the judged turn and its next state, each `votes` (m) times:

- evaluate: did the turn meet the user's intent, given what came next? The last `\\boxed{v}`
  of each answer is its vote; the score is the plurality of the valid votes, and a tie for the
  top count (or no valid vote) is 0;
- hint: does the next state say something that would have improved the turn? An answer with
  `\\boxed{1}` carries a hint between [HINT_START] and [HINT_END]; the candidates are those
  hints stripped, longer than 10 characters, de-duplicated, shortest first, at most 3.

`dispatch` says what a judgment trains (the table of §2.2). Who answers is pluggable, as
verifiers are: a Python function `pkg.module:fn` (a rule judge) or any OpenAI-compatible chat
endpoint (`endpoint_ask`); the worker (flows/judging.py) wires the default, the scenario's
served head through the engine's admin generate route. Judging never runs on the request path.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from reef.errors import ConfigError, UpstreamError
from reef.intervals import wilson
from reef.recipe import import_object
from reef.records import Report, utcnow

if TYPE_CHECKING:
    from reef.settings import JudgeSettings

Task = Literal["evaluate", "hint"]
TASKS: tuple[Task, ...] = ("evaluate", "hint")

SOURCE = "judge"  # Report.metadata["source"] of a judgment
MIN_HINT_CHARS = 10  # a hint must be longer than this (§2.2)
MAX_HINTS = 3  # prm_max_hint_candidates (§2.2)
HINT_HEADER = "\n\n[user's hint / instruction]\n"  # what append_hint puts before a hint

_BOXED = re.compile(r"\\boxed\{\s*([+-]?\d+)\s*\}")
_HINT = re.compile(r"\[HINT_START\](.*?)\[HINT_END\]", re.DOTALL)


@dataclass(frozen=True)
class Exchange:
    """The judged assistant turn and what came after it.

    `next_role` is "user" (the user's next message), "tool" (a tool's result) or "feedback"
    (the text of a report on the turn); the judge reads it as an input."""

    messages: tuple[dict[str, Any], ...]  # the turn's prompt, OpenAI chat form
    reply: str  # what the assistant answered
    next_role: str
    next_text: str


# One answer of the judge to one question: (task, exchange, sample index) -> raw text in the
# output format above. Sample i of m lets a rule judge vary its answers deterministically.
Ask = Callable[[Task, Exchange, int], str]


@dataclass(frozen=True)
class Judgment:
    """The judge's verdict on one turn, with everything needed to audit it."""

    score: int  # plurality of the evaluate votes, ties -> 0
    hints: tuple[str, ...]  # the hint candidates, shortest first
    votes: dict[str, int]  # evaluate votes by value ("1", "0", "-1", "void")
    hint_votes: dict[str, int]  # hint answers by value
    raw: dict[str, list[str]] = field(default_factory=dict)  # task -> the m raw answers
    judge: str = ""  # the judge's identity (function path or endpoint + model)
    # how sure the judge is of `verdict`, in [0, 1]: the verdict's probability (likelihood
    # judges) or the share of all m votes that gave it (a void vote counts against)
    confidence: float = 0.0
    verdict: int | None = None  # what the judge concluded; `score` is 0 when below the bar
    method: str = "generate"  # generate (m sampled answers) or likelihood (reef.verdicts)
    tokens: int = 0  # tokens the judge read or wrote for this turn, where known
    seconds: float = 0.0  # wall time of this turn's judging

    @property
    def void(self) -> bool:
        """No valid verdict at all (every evaluate vote void)."""
        return sum(self.votes.get(k, 0) for k in ("1", "0", "-1")) == 0

    @property
    def trains(self) -> bool:
        return dispatch(self.score, self.hints) is not None


@dataclass(frozen=True)
class Dispatch:
    """What one judged turn trains (§2.2's table): the RL reward and the teacher's context."""

    reward: int
    teacher: Literal["hints", "anchor"]  # hint-enhanced prompts, or the plain prompt


def dispatch(score: int, hints: Sequence[str]) -> Dispatch | None:
    """Hints and a ±1 score: reward and hint teachers; hints and 0: hints only (the RL term
    vanishes); no hints and ±1: reward and the anchor (the un-enhanced prompt); neither: None,
    the turn trains nothing."""
    if hints:
        return Dispatch(reward=score, teacher="hints")
    if score != 0:
        return Dispatch(reward=score, teacher="anchor")
    return None


# the rules -------------------------------------------------------------------------------
def boxed(text: str) -> int | None:
    """The last `\\boxed{n}` value of an answer, or None when there is none."""
    found = _BOXED.findall(text or "")
    return int(found[-1]) if found else None


def plurality(votes: Sequence[int | None]) -> int:
    """The most frequent valid vote (+1, 0 or -1); a tie for the top count, or no valid vote,
    is 0. Void votes (None, or values outside {-1, 0, 1}) do not count."""
    counts = Counter(v for v in votes if v in (-1, 0, 1))
    if not counts:
        return 0
    ranked = counts.most_common()
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
        return 0
    return int(ranked[0][0])


def hint_of(text: str) -> str | None:
    """The hint an answer gives: its text between the markers when it votes `\\boxed{1}`."""
    if boxed(text) != 1:
        return None
    found = _HINT.findall(text or "")
    return found[-1].strip() if found else None


def hint_candidates(hints: Sequence[str | None], limit: int = MAX_HINTS) -> tuple[str, ...]:
    """Hints stripped, longer than MIN_HINT_CHARS characters, de-duplicated, shortest first
    (ties in first-seen order), at most `limit`."""
    kept = [h.strip() for h in hints if h is not None and len(h.strip()) > MIN_HINT_CHARS]
    unique = list(dict.fromkeys(kept))
    return tuple(sorted(unique, key=len)[:limit])


def append_hint(messages: Sequence[Mapping[str, Any]], hint: str) -> list[dict[str, Any]]:
    """The prompt with the hint appended to its last user message (a user message holding only
    the hint is added when there is none): the teacher's hint-enhanced context."""
    out = [dict(m) for m in messages]
    for m in reversed(out):
        if m.get("role") == "user":
            m["content"] = _text(m.get("content")) + HINT_HEADER + hint
            return out
    out.append({"role": "user", "content": HINT_HEADER.lstrip("\n") + hint})
    return out


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


# judging -------------------------------------------------------------------------------------
class TurnJudge(Protocol):
    """What the worker asks of a judge: a judgment of one turn (reef.verdicts' likelihood
    judge, or `Judge` below)."""

    identity: str
    method: str

    def judge(self, exchange: Exchange) -> Judgment: ...


class Judge:
    """Asks both questions `votes` times and applies the rules. `ask` may raise; the caller
    counts the turn as a judge failure (flows/judging.py)."""

    def __init__(self, ask: Ask, identity: str, votes: int = 3, max_hints: int = MAX_HINTS):
        if votes < 1:
            raise ConfigError("judge.votes must be >= 1")
        self.ask = ask
        self.identity = identity
        self.votes = votes
        self.max_hints = max_hints

    method = "generate"

    def judge(self, exchange: Exchange) -> Judgment:
        start = time.perf_counter()
        raw: dict[str, list[str]] = {
            task: [self.ask(task, exchange, i) for i in range(self.votes)] for task in TASKS
        }
        evaluate = [boxed(a) for a in raw["evaluate"]]
        hints = [hint_of(a) for a in raw["hint"]]
        score = plurality(evaluate)
        return Judgment(
            score=score,
            hints=hint_candidates(hints, self.max_hints),
            votes=_tally(evaluate),
            hint_votes=_tally([boxed(a) for a in raw["hint"]]),
            raw=raw,
            judge=self.identity,
            confidence=sum(v == score for v in evaluate) / len(evaluate),
            verdict=score,
            method=self.method,
            seconds=time.perf_counter() - start,
        )

    def evaluate(self, exchange: Exchange) -> int:
        """The evaluate question alone, `votes` times: the plurality vote in {-1, 0, 1}."""
        return plurality([boxed(self.ask("evaluate", exchange, i)) for i in range(self.votes)])


def configured_judge(j: JudgeSettings) -> Judge | None:
    """The judge `judge.function`, or `judge.url` + `judge.model`, configures; None when
    neither is set (the worker then asks the served head: flows/judging.py)."""
    if j.function:
        return Judge(function_ask(j.function), f"function:{j.function}", votes=j.votes)
    if not j.url:
        return None
    if not j.model:
        raise ConfigError("judge.url needs judge.model")
    ask = endpoint_ask(
        j.url,
        j.model,
        api_key=j.api_key.get_secret_value() if j.api_key else None,
        temperature=j.temperature,
        max_tokens=j.max_tokens,
        timeout_s=j.timeout_s,
    )
    return Judge(ask, endpoint_identity(j.url, j.model), votes=j.votes)


def endpoint_identity(url: str, model: str) -> str:
    """A judge endpoint's name in every judgment's metadata, which scoped tokens read: the URL
    without userinfo, query or fragment, where a credential may ride."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    try:
        port = parts.port
    except ValueError:  # not a number: leave it out rather than fail the judge
        port = None
    netloc = f"{host}:{port}" if port is not None else host
    return f"endpoint:{urlunsplit((parts.scheme, netloc, parts.path, '', ''))}#{model}"


def _tally(votes: Sequence[int | None]) -> dict[str, int]:
    out = {"1": 0, "0": 0, "-1": 0, "void": 0}
    for v in votes:
        out[str(v) if v in (-1, 0, 1) else "void"] += 1
    return out


def judgment_report(
    scenario: str,
    report_id: str,
    record_id: str,
    exchange: Exchange,
    judgment: Judgment,
    judged_report_id: str | None = None,
) -> Report:
    """The report a judgment is stored as: it scores the turn (so readiness, records and
    `reef export` see it), its feedback carries the hints the openclaw recipe teaches with,
    its metadata the votes, the raw answers and who judged. A human report with a score on
    the same receipt wins over it (reef.experience.pick)."""
    metadata: dict[str, Any] = {
        "source": SOURCE,
        "judge": judgment.judge,
        "method": judgment.method,
        "confidence": round(judgment.confidence, 4),
        "verdict": judgment.verdict,
        "void": judgment.void,
        "seconds": round(judgment.seconds, 4),
        "votes": judgment.votes,
        "hint_votes": judgment.hint_votes,
        "raw": judgment.raw,
        "trains": judgment.trains,
        # also here (not only in the feedback) because a rollout row carries the counting
        # report's metadata: the openclaw recipe reads its teachers' hints from it
        "hints": list(judgment.hints),
    }
    feedback = {"hints": list(judgment.hints), **_next_state(exchange)}
    return _stored(
        scenario, report_id, record_id, float(judgment.score), feedback, metadata, judged_report_id
    )


def dropped_report(
    scenario: str,
    report_id: str,
    record_id: str,
    exchange: Exchange,
    identity: str,
    reason: str,
    judged_report_id: str | None = None,
) -> Report:
    """What a turn the judge could not judge is stored as (after its retry): a judgment with no
    score and the reason, so the drop is counted in the scenario's status and the turn is not
    judged again by a restarted worker; it trains nothing."""
    metadata: dict[str, Any] = {"source": SOURCE, "judge": identity, "dropped": reason}
    return _stored(
        scenario, report_id, record_id, None, _next_state(exchange), metadata, judged_report_id
    )


def _next_state(exchange: Exchange) -> dict[str, Any]:
    return {"next_state": {"role": exchange.next_role, "content": exchange.next_text}}


def _stored(
    scenario: str,
    report_id: str,
    record_id: str,
    score: float | None,
    feedback: dict[str, Any],
    metadata: dict[str, Any],
    judged_report_id: str | None,
) -> Report:
    """A judge's report on one turn (`record_id`), scored or (a drop) not."""
    if judged_report_id is not None:
        metadata["judged_report_id"] = judged_report_id
    return Report(
        id=report_id,
        scenario=scenario,
        created_at=utcnow(),
        references=(record_id,),
        score=score,
        feedback=feedback,
        metadata=metadata,
    )


def is_judgment(report: Report) -> bool:
    return report.metadata.get("source") == SOURCE


def hints_of(feedback: Any) -> tuple[str, ...]:
    """The hint candidates a judgment's feedback carries (a dict, or its JSON text)."""
    if isinstance(feedback, str):
        import orjson

        try:
            feedback = orjson.loads(feedback)
        except orjson.JSONDecodeError:
            return ()
    hints = feedback.get("hints") if isinstance(feedback, dict) else None
    return tuple(h for h in hints if isinstance(h, str)) if isinstance(hints, list) else ()


# who answers -----------------------------------------------------------------------------
_INSTRUCTIONS: dict[Task, str] = {
    "evaluate": (
        "You judge one assistant turn by what happened right after it. Decide whether the "
        "turn did what the user wanted. Signs it did: the user moves on, thanks, or a tool "
        "ran successfully. Signs it did not: the user asks for a redo, corrects it, asks for "
        "a change, repeats the request in other words, or a tool failed because of the "
        "turn. Think briefly, then end with \\boxed{1} (it did), \\boxed{-1} (it did not) "
        "or \\boxed{0} (cannot tell)."
    ),
    "hint": (
        "You read one assistant turn and what happened right after it. Does the next "
        "message reveal something that would have made the turn better? If it does, answer "
        "\\boxed{1} and give a short actionable hint (1 to 3 sentences) the assistant could "
        "have followed, between [HINT_START] and [HINT_END]. If it does not, answer "
        "\\boxed{-1} and no hint."
    ),
}


def judge_messages(task: Task, exchange: Exchange) -> list[dict[str, str]]:
    """The chat an LLM judge is asked: the instructions, then the turn and its next state."""
    context = "\n".join(
        f"[{m.get('role', 'user')}] {_text(m.get('content'))}" for m in exchange.messages
    )
    body = (
        f"## Conversation before the turn\n{context}\n\n"
        f"## The assistant's turn\n{exchange.reply}\n\n"
        f"## What came next ({exchange.next_role})\n{exchange.next_text}"
    )
    return [
        {"role": "system", "content": _INSTRUCTIONS[task]},
        {"role": "user", "content": body},
    ]


def function_ask(path: str) -> Ask:
    """A Python judge `pkg.module:fn`, called as fn(task, exchange, sample) -> raw answer."""
    fn = import_object(path, "judge.function")
    if not callable(fn):
        raise ConfigError(f"judge.function '{path}' is not callable")
    return fn


def endpoint_ask(
    url: str,
    model: str,
    *,
    api_key: str | None = None,
    temperature: float = 0.6,
    max_tokens: int = 512,
    timeout_s: float = 120.0,
) -> Ask:
    """A judge behind any OpenAI-compatible `/v1` (`url` ends in /v1): one chat completion per
    answer. Errors are UpstreamError, which the worker counts as a judge failure."""
    import httpx

    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    client = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout_s)

    def ask(task: Task, exchange: Exchange, sample: int) -> str:
        body = {
            "model": model,
            "messages": judge_messages(task, exchange),
            "temperature": temperature,
            "max_tokens": max_tokens,
        }
        try:
            r = client.post("/chat/completions", json=body)
        except httpx.HTTPError as e:
            raise UpstreamError(f"judge at {url} unreachable: {e}") from None
        if r.status_code >= 400:
            raise UpstreamError(f"judge at {url}: {r.status_code} {r.text[:300]}")
        content = r.json()["choices"][0]["message"].get("content")
        return content if isinstance(content, str) else ""

    return ask


# the judge's record ----------------------------------------------------------------------
@dataclass(frozen=True)
class JudgeQuality:
    """How a scenario's judge has done, from its stored judgments: how many turns it judged or
    dropped (by reason), how many verdicts were void or under `judge.min_confidence`, its mean
    confidence, and how often its verdict agreed with a person's score on the same turn."""

    judged: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    void: int = 0
    unsure: int = 0  # a verdict kept in the record but scored 0 (below min_confidence)
    mean_confidence: float | None = None
    compared: int = 0  # turns with both a verdict and a person's decisive score
    agreed: int = 0
    judges: tuple[str, ...] = ()  # the identities that judged
    # the same over the last `window` compared turns (by the person's score's time)
    window: int = 0
    recent_compared: int = 0
    recent_agreed: int = 0

    @property
    def recent_interval(self) -> tuple[float, float] | None:
        """The 90% Wilson interval of the agreement over the recent compared turns."""
        return wilson(self.recent_agreed, self.recent_compared)

    def trust(self, min_agreement: float | None) -> str | None:
        """Why the judge's verdicts may not train now (judge.min_agreement), or None."""
        if min_agreement is None:
            return None
        interval = self.recent_interval
        if interval is None:
            return (
                f"judge.min_agreement {min_agreement:.2f}: no turn has both a verdict and a "
                "person's score yet, so the judge's agreement with people is not shown"
            )
        if interval[0] < min_agreement:
            return (
                f"judge.min_agreement {min_agreement:.2f} not shown: the judge agreed with "
                f"people on {self.recent_agreed} of the last {self.recent_compared} turns both "
                f"scored (90% interval {interval[0]:.2f}-{interval[1]:.2f})"
            )
        return None

    @property
    def void_rate(self) -> float | None:
        return self.void / self.judged if self.judged else None

    @property
    def agreement(self) -> float | None:
        return self.agreed / self.compared if self.compared else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "judged": self.judged,
            "dropped": dict(sorted(self.dropped.items())),
            "void": self.void,
            "void_rate": self.void_rate,
            "unsure": self.unsure,
            "mean_confidence": self.mean_confidence,
            "compared_with_people": self.compared,
            "agreement_with_people": self.agreement,
            "recent_compared_with_people": self.recent_compared,
            "recent_agreement_interval": (
                list(self.recent_interval) if self.recent_interval else None
            ),
            "judges": list(self.judges),
        }


def person_vote(score: float) -> int:
    """A person's score as a verdict to compare with the judge's: 0.5 or more is +1, 0 or
    less is -1, anything in between is 0 (not compared)."""
    return 1 if score >= 0.5 else -1 if score <= 0 else 0


def judge_quality(reports: Iterable[Report], window: int = 50) -> JudgeQuality:
    """The JudgeQuality of a scenario's reports (all of them, in any order). A person's score
    of 0.5 or more agrees with a verdict of +1, of 0 or less with -1; a verdict of 0 and scores
    in between are not compared. `window`: how many of the latest compared turns the recent
    agreement counts."""
    verdicts: dict[str, int] = {}
    people: dict[str, tuple[Any, float]] = {}
    dropped: Counter[str] = Counter()
    confidences: list[float] = []
    void = unsure = 0
    judges: set[str] = set()
    for rep in reports:
        if not is_judgment(rep):
            if rep.score is not None:
                for rid in rep.references:
                    if rid not in people or people[rid][0] <= rep.created_at:
                        people[rid] = (rep.created_at, float(rep.score))
            continue
        md = rep.metadata
        if md.get("dropped"):
            dropped[str(md["dropped"])] += 1
            continue
        judges.add(str(md.get("judge", "")))
        verdict = md.get("verdict")
        verdict = int(verdict) if isinstance(verdict, (int, float)) else int(rep.score or 0)
        void += bool(md.get("void", False))
        confidence = md.get("confidence")
        if isinstance(confidence, (int, float)):
            confidences.append(float(confidence))
        if verdict != 0 and rep.score == 0:
            unsure += 1
        for rid in rep.references[-1:]:  # the judged turn
            verdicts[rid] = verdict
    outcomes: list[tuple[Any, bool]] = []  # (when the person scored, agreed)
    for rid, verdict in verdicts.items():
        if rid not in people or verdict == 0:
            continue
        when, score = people[rid]
        person = person_vote(score)
        if person:
            outcomes.append((when, person == verdict))
    compared, agreed = len(outcomes), sum(ok for _, ok in outcomes)
    recent = sorted(outcomes, key=lambda o: o[0])[-window:]
    return JudgeQuality(
        judged=len(verdicts),
        dropped=dict(dropped),
        void=void,
        unsure=unsure,
        mean_confidence=sum(confidences) / len(confidences) if confidences else None,
        compared=compared,
        agreed=agreed,
        judges=tuple(sorted(judges)),
        window=window,
        recent_compared=len(recent),
        recent_agreed=sum(ok for _, ok in recent),
    )
