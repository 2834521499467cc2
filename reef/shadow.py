"""Shadow rollouts: the candidate answers copies of served calls, off the request path, and
each copy is scored against the head's answer to the same request.

The user's answer never waits for the shadow: Serving hands the call here only after the
user's record is durable, as a background task. A sample of calls (`shadow.sample`) is
copied, at most `shadow.max_concurrency` at once in a process; a copy beyond the bound is
dropped (counted), never queued. Shadow answers go to their own table (ShadowRecord), written
in batches by a background task (reef.background; one transaction per `flush_s` window, so a
copy costs the serving process no commit of its own): no user sees them, and no listing,
session lookup, readiness count or experience reads them.

Scoring puts both answers on one scorer, in this order of preference:
- `rollout.shadow.scorer`, else `gate.scorer`: a verifier `fn(completions, prompts=...)` ->
  one score per answer in [0, 1] (the gate's scorer signature), called with both answers;
- else the judge (`judge.function`, or `judge.url` + `judge.model`): the evaluate question
  (reef.judge), `votes` times per answer, plurality vote v in {-1, 0, 1} scored (v + 1) / 2;
- else nothing: the copy is stored unscored (`error` says so) and the rollout's test never
  gets a pair, so it ends at `max_duration_s` as `on_inconclusive` says.
The watcher (deploy.rollout) compares the shadow's and the head's score sums with the same
anytime-valid test as a canary's reports (reef.sequential).
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from reef import judge
from reef.background import BackgroundTask
from reef.recipe import import_object
from reef.records import Record, ShadowRecord, new_id, utcnow
from reef.settings import JudgeSettings, RolloutSettings
from reef.store.shadows import ShadowStore

log = logging.getLogger(__name__)

# Both answers at once: (prompt messages, [shadow answer, head answer]) -> their scores.
Score = Callable[[list[dict[str, Any]], Sequence[str]], list[float]]
Outcome = str  # "scored" | "unscored" | "failed" | "dropped"


def answer_text(response: dict[str, Any] | None) -> str:
    """The assistant's text in an OpenAI chat completion (what the engine answers)."""
    if not response:
        return ""
    choices = response.get("choices") or [{}]
    content = (choices[0].get("message") or {}).get("content")
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def verifier_score(path: str) -> Score:
    """A gate-style verifier `fn(completions, prompts=...) -> list[float]` as a Score."""
    fn = import_object(path, "shadow scorer")
    if not callable(fn):
        raise ValueError(f"shadow scorer {path} is not callable")

    def score(messages: list[dict[str, Any]], answers: Sequence[str]) -> list[float]:
        return [float(s) for s in fn(list(answers), prompts=[messages] * len(answers))]

    return score


def judge_score(judging: judge.Judge) -> Score:
    """The judge's evaluate question on each answer alone (no next turn exists for a copy):
    the plurality vote in {-1, 0, 1} mapped to [0, 1]."""

    def score(messages: list[dict[str, Any]], answers: Sequence[str]) -> list[float]:
        exchanges = [judge.Exchange(tuple(messages), a, "feedback", "(none)") for a in answers]
        return [(judging.evaluate(e) + 1) / 2 for e in exchanges]

    return score


def scorer_of(scorer: str | None, judging: JudgeSettings) -> tuple[Score | None, str | None]:
    """The Score a shadow rollout uses and its name (None, None: nothing to score with)."""
    if scorer:
        return verifier_score(scorer), scorer
    configured = judge.configured_judge(judging)
    if configured is None:
        return None, None
    return judge_score(configured), configured.identity


class Shadows:
    """The shadow side of rollouts in one serving process: which calls are copied, how many
    copies are in flight, and what became of each (`counts`, by scenario and outcome).
    `start()` its writer with the app; at shutdown `drain()` the copies in flight, then
    `stop()` it."""

    def __init__(
        self,
        store: ShadowStore,
        settings: RolloutSettings,
        *,
        gate_scorer: str | None = None,
        judging: JudgeSettings | None = None,
        on_outcome: Callable[[str, Outcome], None] | None = None,
        flush_s: float = 0.2,
    ):
        self.store = store
        self.settings = settings
        self._gate_scorer = gate_scorer
        self._judging = judging if judging is not None else JudgeSettings()
        self._scorers: dict[str | None, tuple[Score | None, str | None]] = {}
        self.on_outcome = on_outcome
        self.counts: Counter[tuple[str, Outcome]] = Counter()
        self.in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()  # held: the loop keeps only weak refs
        self._pending: list[ShadowRecord] = []  # answered copies waiting for the next batch
        self._lock = threading.Lock()  # the loop appends, the writer's thread takes
        self.writer = BackgroundTask("shadow-writer", self._write, gather_s=flush_s)

    def start(self) -> None:
        self.writer.start()

    def stop(self) -> None:
        self.writer.stop()
        self._write()  # what the last window left

    def active(self, scenario: str) -> bool:
        return self.settings.for_scenario(scenario).mode == "shadow"

    def take(self, scenario: str) -> bool:
        """Whether this call is copied: drawn with probability `shadow.sample`, and only while
        fewer than `shadow.max_concurrency` copies are in flight (else dropped, counted)."""
        shadow = self.settings.for_scenario(scenario).shadow
        if shadow.sample < 1.0 and random.random() >= shadow.sample:
            return False
        if self.in_flight >= shadow.max_concurrency:
            self._count(scenario, "dropped")
            return False
        self.in_flight += 1
        return True

    def launch(
        self,
        record: Record,
        messages: list[dict[str, Any]],
        head_answer: dict[str, Any],
        candidate: Callable[[], Awaitable[str | None]],
        answer: Callable[[str], Awaitable[dict[str, Any]]],
    ) -> None:
        """Run a copy taken by `take` in the background: `candidate()` names the live shadow
        candidate (None: there is none for this record, and the copy is let go), `answer(id)`
        asks it (the caller prepares its variant and harness), then both answers are scored
        and stored."""
        task = asyncio.get_running_loop().create_task(
            self._run(record, messages, head_answer, candidate, answer)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for the copies in flight, then write what waits (shutdown, tests)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await asyncio.to_thread(self._write)

    def _store(self, shadow: ShadowRecord) -> None:
        with self._lock:
            self._pending.append(shadow)
        self.writer.trigger()

    def _write(self) -> None:
        """Write the copies answered so far (those of one `flush_s` window) in one
        transaction."""
        with self._lock:
            batch, self._pending = self._pending, []
        if not batch:
            return
        try:
            self.store.add_shadow_records(batch)
        except Exception:
            log.exception("storing %d shadow records failed", len(batch))

    async def _run(
        self,
        record: Record,
        messages: list[dict[str, Any]],
        head_answer: dict[str, Any],
        candidate: Callable[[], Awaitable[str | None]],
        answer: Callable[[str], Awaitable[dict[str, Any]]],
    ) -> None:
        scenario = record.scenario
        outcome: Outcome | None = "failed"
        try:
            release_id = await candidate()
            if release_id is None:
                outcome = None
                return
            t0 = time.perf_counter()
            response: dict[str, Any] | None = None
            error: str | None = None
            try:
                response = await answer(release_id)
            except Exception as e:  # the candidate failed: stored as such, never raised
                error = f"shadow call failed: {e}"
            timings = {"server_ms": (time.perf_counter() - t0) * 1000.0}
            scores: list[float | None] = [None, None]
            scored_by = None
            if response is not None:
                scores, scored_by, error = await asyncio.to_thread(
                    self._score, scenario, messages, response, head_answer
                )
            shadow = ShadowRecord(
                id=new_id("shd"),
                scenario=scenario,
                created_at=utcnow(),
                record_id=record.id,
                release_id=release_id,
                control_release_id=record.release_id,
                response=response,
                timings=timings,
                score=scores[0],
                control_score=scores[1],
                scored_by=scored_by,
                error=error,
            )
            self._store(shadow)
            if response is not None:
                outcome = "scored" if scored_by and error is None else "unscored"
        except Exception:
            log.exception("shadow copy of %s failed", record.id)
        finally:
            self.in_flight -= 1
            if outcome is not None:
                self._count(scenario, outcome)

    def _score(
        self,
        scenario: str,
        messages: list[dict[str, Any]],
        response: dict[str, Any],
        head_answer: dict[str, Any],
    ) -> tuple[list[float | None], str | None, str | None]:
        """(shadow score, head score), the scorer's name, and why there is no score."""
        path = self.settings.for_scenario(scenario).shadow.scorer or self._gate_scorer
        score, name = None, None
        try:
            if path not in self._scorers:
                self._scorers[path] = scorer_of(path, self._judging)
            score, name = self._scorers[path]
            if score is None:
                return [None, None], None, "no scorer: set rollout.shadow.scorer or a judge"
            shadow, head = score(messages, [answer_text(response), answer_text(head_answer)])
        except Exception as e:  # a scorer that cannot load or fails: the copy stays unscored
            return [None, None], name, f"scoring failed: {e}"
        return [shadow, head], name, None

    def _count(self, scenario: str, outcome: Outcome) -> None:
        self.counts[(scenario, outcome)] += 1
        if self.on_outcome is not None:
            self.on_outcome(scenario, outcome)
