"""The worker's judging pass: next turns and text-only reports become judge reports.

A turn is judged when its next turn arrives: a later record whose request extends the turn's
conversation (its session child) brings the next state, the messages appended after the
turn's answer (a user reply or a tool result, with its role). A report that carries feedback
text but no score is judged too, with its text as the next state. The last turn of a session
gets no next state: after `judge.session_ttl_s` it is retired unjudged (counted).

Bounded: at most `judge.concurrency` turns are judged at once and each within
`judge.timeout_s`; a judging that fails or times out is tried again `judge.retries` times,
then stored as a drop (a judgment with no score and its reason: counted in the scenario's
status and on /metrics, never lost silently). A judgment's report id is derived from what it
judged (`judge_<record>` or `judge_<report>`), so a restarted worker never judges a turn twice.
Never on the request path: this runs in the worker process (cli/worker.py).

The default judge (`judge.method: likelihood`) reads with the served base model, loaded here
(reef.verdicts); its probe is fitted on the shipped seed labels plus the scenario's turns that a
person scored and that have a next state, and refitted as such labels arrive.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from reef.errors import ReefError
from reef.experience import completion_text, prompt_messages
from reef.judge import (
    Ask,
    Exchange,
    Judge,
    TurnJudge,
    configured_judge,
    dropped_report,
    is_judgment,
    judge_messages,
    judgment_report,
)
from reef.recipe import recipe_class
from reef.records import Record, Report
from reef.scenario_settings import learning_settings
from reef.settings import Settings
from reef.store.base import Store

if TYPE_CHECKING:
    from reef.verdicts import Labelled, Reader

log = logging.getLogger("reef.judging")

PAGE = 500


def judging_enabled(settings: Settings, scenario: str | None = None) -> bool:
    """For `scenario` (its `scenarios.<name>` settings): `judge.enabled`, or when unset,
    whether its recipe learns from judgments (openclaw). Without one: whether any scenario's
    settings, or the top-level ones, turn judging on (the worker then runs it)."""
    if scenario is None:
        return any(judging_enabled(settings, name) for name in ("", *settings.scenarios))
    own = settings.for_scenario(scenario)
    if own.judge.enabled is not None:
        return own.judge.enabled
    return recipe_class(own.reef.recipe).name == "openclaw"


def build_judge(settings: Settings, scenario: str) -> TurnJudge:
    """The configured judge for `scenario`: a function, an endpoint, the likelihood judge on
    the served base model (the default where the model's files are here), or the served head
    generating its votes."""
    configured = configured_judge(settings.judge)
    if configured is not None:
        return configured
    j = settings.judge
    if j.method == "likelihood" and settings.engine.kind != "upstream":
        from reef.verdicts import LikelihoodJudge

        read = shared_reader(settings)
        return LikelihoodJudge(
            read,
            f"likelihood:{read.model_dir.name}",
            min_confidence=j.min_confidence,
            hints=j.hints,
        )
    return Judge(_head_ask(settings, scenario), f"head:{scenario}", votes=j.votes)


_READERS: dict[Path, Reader] = {}
_READERS_LOCK = threading.Lock()


def shared_reader(settings: Settings) -> Reader:
    """The base model's reader, loaded once per process (every scenario's judge shares it)."""
    from reef.models import resolve_model
    from reef.verdicts import Reader

    model_dir = resolve_model(settings.engine.model, settings.engine.model_cache)
    with _READERS_LOCK:
        if model_dir not in _READERS:
            log.info("loading %s to judge turns by likelihood", model_dir)
            cache = settings.engine.model_cache / "judge"  # seed readings, once per machine
            _READERS[model_dir] = Reader(model_dir, cache_dir=cache)
        return _READERS[model_dir]


def _head_ask(settings: Settings, scenario: str) -> Ask:
    """The scenario's served head answers, through the engine's admin generate route (so the
    judging is never recorded as traffic)."""
    from reef.deploy.engine import EngineAdmin

    admin = EngineAdmin.for_settings(settings)
    j = settings.judge

    def ask(task: str, exchange: Exchange, sample: int) -> str:
        return admin.generate(
            scenario,
            judge_messages(task, exchange),  # type: ignore[arg-type]
            max_tokens=j.max_tokens,
            temperature=j.temperature,
            seed=sample,
        )

    return ask


@dataclass(frozen=True)
class Case:
    """One turn to judge: the record, what came next, and the report id its judgment gets."""

    report_id: str
    record: Record
    next_role: str
    next_text: str
    judged_report_id: str | None = None

    def exchange(self) -> Exchange:
        return Exchange(
            messages=tuple(prompt_messages(self.record)),
            reply=completion_text(self.record),
            next_role=self.next_role,
            next_text=self.next_text,
        )


@dataclass
class _ScenarioState:
    record_cursor: str | None = None
    report_cursor: str | None = None
    judged: set[str] = field(default_factory=set)  # judgment report ids seen or tried
    scored: set[str] = field(default_factory=set)  # records a human report scores
    waiting: dict[str, float] = field(default_factory=dict)  # tail record -> seen at (monotonic)
    human: dict[str, float] = field(default_factory=dict)  # record -> a person's latest score
    # record -> (role, text), the most recent NEXT_STATES_KEPT (and every one a person scored)
    next_states: OrderedDict[str, tuple[str, str]] = field(default_factory=OrderedDict)
    fitted_on: int = -1  # scenario labels the judge's probe was last fitted with

    def keep_next_state(self, record_id: str, role: str, text: str) -> None:
        """Keep a turn's next state for the probe, should a person score the turn later; the
        oldest go first (a worker lives long), except those of turns people already scored."""
        self.next_states[record_id] = (role, text)
        while len(self.next_states) > NEXT_STATES_KEPT:
            oldest, value = self.next_states.popitem(last=False)
            if oldest in self.human:
                self.next_states[oldest] = value  # a label: kept, moved to the end
                if len(self.next_states) <= len(self.human):
                    break


NEXT_STATES_KEPT = 4096  # per scenario: a person's score usually follows its turn closely


# A person's score on a turn as a verdict the probe learns from: scores of 0.5 and above (a
# thumbs-up on a 0/1 scale, anything positive on -1..1) are "good", 0 and below "bad"; the
# scores in between say too little and are left out.
def human_label(score: float) -> int | None:
    if score >= 0.5:
        return 1
    if score <= 0.0:
        return -1
    return None


REFIT_EVERY = 8  # new labelled turns of a scenario before its probe is fitted again


class Judging:
    """Finds and judges the turns of every scenario; one instance per worker."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        judge_for: Callable[[str], TurnJudge] | None = None,
    ):
        self.settings = settings
        self.store = store
        self.judge_for = judge_for or (
            lambda scenario: build_judge(learning_settings(settings, store, scenario), scenario)
        )
        self.counts: Counter[str] = Counter()
        self._state: dict[str, _ScenarioState] = {}
        self._judges: dict[str, TurnJudge] = {}
        self._seed: list[Labelled] | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(
            settings.judge.concurrency, thread_name_prefix="reef-judge"
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # finding turns -------------------------------------------------------------------
    def cases(self, scenario: str) -> list[Case]:
        """New turns of `scenario` with a next state, not judged yet; retires old tails."""
        st = self._state.setdefault(scenario, _ScenarioState())
        out = self._from_reports(scenario, st)
        out += self._from_records(scenario, st)
        ttl = self.settings.judge.session_ttl_s
        now = time.monotonic()
        for rid, seen in list(st.waiting.items()):
            if now - seen > ttl:
                del st.waiting[rid]
                self.counts["retired"] += 1
        return [c for c in out if c.record.id not in st.scored]

    def _from_reports(self, scenario: str, st: _ScenarioState) -> list[Case]:
        out: list[Case] = []
        for rep in _all(self.store.list_reports, scenario, st.report_cursor):
            st.report_cursor = rep.id
            if is_judgment(rep):
                st.judged.add(rep.id)
                continue
            if rep.score is not None:
                st.scored.update(rep.references)
                for rid in rep.references:
                    st.human[rid] = rep.score
                continue
            text = _feedback_text(rep)
            if not text:
                continue
            records = self.store.get_records(scenario, rep.references)
            if not records:
                continue
            # A report on several receipts is about the trajectory: its last turn is judged.
            last = max(records, key=lambda r: (r.turn if r.turn is not None else -1, r.id))
            out.append(Case(f"judge_{rep.id}", last, "feedback", text, judged_report_id=rep.id))
        return out

    def _from_records(self, scenario: str, st: _ScenarioState) -> list[Case]:
        out: list[Case] = []
        now = time.monotonic()
        for rec in _all(self.store.list_records, scenario, st.record_cursor):
            st.record_cursor = rec.id
            st.waiting[rec.id] = now
            if rec.parent_id is None:
                continue
            st.waiting.pop(rec.parent_id, None)
            try:
                parent = self.store.get_record(scenario, rec.parent_id)
            except ReefError:
                continue
            role, text = next_state(parent, rec)
            if role is None:
                self.counts["no_next_state"] += 1  # a retry of the same request
                continue
            st.keep_next_state(parent.id, role, text)
            out.append(Case(f"judge_{parent.id}", parent, role, text))
        return out

    # judging ---------------------------------------------------------------------------
    def run_pass(self, scenarios: Iterable[str]) -> set[str]:
        """Judge what is new in `scenarios`; returns the scenarios that got judgments."""
        touched: set[str] = set()
        for scenario in scenarios:
            st = self._state.setdefault(scenario, _ScenarioState())
            todo = [c for c in self.cases(scenario) if c.report_id not in st.judged]
            for c in todo:
                st.judged.add(c.report_id)  # tried once per worker, judged or not
            if todo and self._judge_all(scenario, todo):
                touched.add(scenario)
        return touched

    def _judge(self, scenario: str) -> TurnJudge | None:
        """The scenario's judge, built once, its probe fitted again when labels arrived."""
        judge = self._judges.get(scenario)
        if judge is None:
            try:
                judge = self.judge_for(scenario)
            except ReefError as e:
                log.error("%s: no judge: %s", scenario, e.message)
                return None
            self._judges[scenario] = judge
        st = self._state.setdefault(scenario, _ScenarioState())
        labels = self.scenario_labels(st)
        fit = getattr(judge, "fit", None)
        if (
            fit is not None
            and self.settings.judge.probe
            and (st.fitted_on < 0 or len(labels) >= st.fitted_on + REFIT_EVERY)
        ):
            seed = self._seed_labels()
            fit(seed + labels)
            st.fitted_on = len(labels)
            log.info(
                "%s: the judge's probe fitted on %d seed and %d scenario labels",
                scenario,
                len(seed),
                len(labels),
            )
        return judge

    def _seed_labels(self) -> list[Labelled]:
        from reef.verdicts import seed_labels

        if self._seed is None:
            self._seed = seed_labels()
        return self._seed

    @staticmethod
    def scenario_labels(st: _ScenarioState) -> list[Labelled]:
        """The scenario's turns a person scored that also have a next state, as labels."""
        from reef.verdicts import Labelled

        out: list[Labelled] = []
        for rid, score in st.human.items():  # few: only what people scored
            label = human_label(score)
            if label is not None and rid in st.next_states:
                out.append(Labelled(*st.next_states[rid], label))
        return out

    def _judge_all(self, scenario: str, cases: list[Case]) -> int:
        judge = self._judge(scenario)
        if judge is None:
            self.counts["judge_failed"] += len(cases)
            for case in cases:
                self._store_drop(scenario, case, "no_judge", "-")
            return 0
        stored = 0
        pending = [(c, self._pool.submit(judge.judge, c.exchange())) for c in cases]
        for attempt in range(self.settings.judge.retries + 1):
            failed: list[tuple[Case, str]] = []
            for case, fut in pending:
                try:
                    judgment = fut.result(timeout=self.settings.judge.timeout_s)
                except concurrent.futures.TimeoutError:
                    fut.cancel()
                    failed.append((case, "judge_timeout"))
                    continue
                except Exception as e:
                    log.warning("%s: judging %s failed: %s", scenario, case.record.id, e)
                    failed.append((case, "judge_failed"))
                    continue
                stored += self._store(
                    scenario,
                    judgment_report(
                        scenario,
                        case.report_id,
                        case.record.id,
                        case.exchange(),
                        judgment,
                        judged_report_id=case.judged_report_id,
                    ),
                )
                self.counts["judged"] += 1
            if not failed:
                return stored
            if attempt < self.settings.judge.retries:
                self.counts["retried"] += len(failed)
                pending = [(c, self._pool.submit(judge.judge, c.exchange())) for c, _ in failed]
                continue
            for case, reason in failed:
                self.counts[reason] += 1
                log.warning("%s: judging %s dropped: %s", scenario, case.record.id, reason)
                self._store_drop(scenario, case, reason, judge.identity)
        return stored

    def _store_drop(self, scenario: str, case: Case, reason: str, identity: str) -> None:
        report = dropped_report(
            scenario,
            case.report_id,
            case.record.id,
            case.exchange(),
            identity,
            reason,
            judged_report_id=case.judged_report_id,
        )
        self._store(scenario, report)

    def _store(self, scenario: str, report: Report) -> int:
        try:
            self.store.add_report(report)
        except ReefError as e:
            self.counts["store_failed"] += 1
            log.warning("%s: storing judgment %s failed: %s", scenario, report.id, e.message)
            return 0
        return 1

    def run_forever(self, stop: threading.Event, on_judged: Callable[[str], None]) -> None:
        """Poll every `judge.poll_s` until `stop` is set; `on_judged(scenario)` after new
        judgments (the worker then checks that scenario's readiness)."""
        while not stop.is_set():
            try:
                names = [s.name for s in self.store.list_scenarios()]
                for scenario in sorted(self.run_pass(names)):
                    on_judged(scenario)
            except Exception:
                log.exception("judging pass failed")
            stop.wait(self.settings.judge.poll_s)


def next_state(parent: Record, child: Record) -> tuple[str | None, str]:
    """The role and text of what the child's request appended after the parent's answer; (None,
    "") when it appended nothing."""
    before = len(prompt_messages(parent)) + 1  # the parent's prompt and its answer
    added = prompt_messages(child)[before:]
    if not added:
        return None, ""
    text = "\n".join(_content(m.get("content")) for m in added)
    return str(added[0].get("role") or "user"), text


def _content(content: object) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _feedback_text(report: Report) -> str | None:
    """The text a scoreless report says: its feedback string, or a structured feedback's
    "text"/"comment" (a correction is not a reaction to judge: SFT learns from it)."""
    fb = report.feedback
    if isinstance(fb, str):
        return fb.strip() or None
    if isinstance(fb, dict):
        for key in ("text", "comment", "feedback"):
            value = fb.get(key)
            if isinstance(value, str) and value.strip():
                return value.strip()
    return None


def _all(list_page: Callable[..., list], scenario: str, after: str | None) -> list:
    out: list = []
    while True:
        page = list_page(scenario, after=after, limit=PAGE)
        out += page
        if len(page) < PAGE:
            return out
        after = page[-1].id
