"""Episodes: a harness answering tasks on the serving engine's weights, each answer scored; and
the paired evaluation of a candidate harness against the head.

An episode injects the harness under test into a task's messages (as server-side injection
would), generates on the same weights for both sides, and scores the answer with the scorer.
The outcome is a score, or an infrastructure failure (the engine was unreachable, overloaded
or failing), which is its own outcome: it says nothing about the harness, so it never counts
as a zero. A request the engine refuses (say, a harness that pushes the prompt past the
context) is the harness's fault and scores 0.

Paired evaluation runs every task `repeats` times on each side with the same seeds; a task's
value is its mean score over the repeats, and only tasks with every episode of both sides
completed enter the gate. The head's episodes are cached by (head harness, weights, task,
repeat, sampling): a later step against the same head does not pay for them again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reef.experience import correction
from reef.harness import Harness

log = logging.getLogger(__name__)

# (messages, seed) -> the answer's text. Raises EpisodeError.
Generate = Callable[[list[dict[str, Any]], int], str]
# TRL's reward-function shape: completions plus the tasks' columns as keyword lists.
Scorer = Callable[..., list[float]]


class EpisodeError(Exception):
    """A generation that did not happen: `infra` when the engine could not answer at all."""

    def __init__(self, message: str, *, infra: bool):
        super().__init__(message)
        self.infra = infra


@dataclass(frozen=True)
class Task:
    """A prompt to answer, and what the scorer gets about it (`columns`, one value each)."""

    task_id: str
    messages: list[dict[str, Any]]
    columns: dict[str, Any] = field(default_factory=dict)

    def content_key(self) -> str:
        data = json.dumps([self.messages, self.columns], sort_keys=True, default=str)
        return hashlib.sha256(data.encode()).hexdigest()


def feedback_text(feedback: str | None) -> str:
    """A report's feedback (JSON text of a string or an object) as plain text for a reader."""
    if not feedback:
        return ""
    try:
        value = json.loads(feedback)
    except ValueError:
        return feedback
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


def tasks_from_rows(rows: Sequence[Mapping[str, Any]]) -> list[Task]:
    """Scored experience rows as tasks: the recorded prompt, with the report's score, feedback
    and correction (the answer the user wanted, when the feedback names one) for the scorer."""
    return [
        Task(
            task_id=str(row["sample_id"]),
            messages=json.loads(row["messages"]),
            columns={
                "correction": correction(row.get("feedback")),
                "feedback": feedback_text(row.get("feedback")),
                "score": float(row["score"]),
                "answer": row.get("completion", ""),
            },
        )
        for row in rows
    ]


def task_set(path: Path) -> list[Task]:
    """A configured task set (gate.eval_dataset): JSONL lines {"messages": [...], "id"?, other
    columns for the scorer}."""
    out = []
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        item = json.loads(line)
        messages = item.pop("messages")
        out.append(Task(str(item.pop("id", i)), list(messages), item))
    return out


_WORD = re.compile(r"\w+")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def correction_scorer(completions: list[str], correction: list[str], **_: Any) -> list[float]:
    """How close each answer is to the user's correction: the F1 of their word multisets
    (1.0 for the same words, 0.0 for none in common). The default scorer of replayed prompts."""
    out = []
    for text, wanted in zip(completions, correction, strict=True):
        got, want = _words(text), _words(wanted or "")
        if not got or not want:
            out.append(0.0)
            continue
        common = sum(min(got.count(w), want.count(w)) for w in set(want))
        if common == 0:
            out.append(0.0)
            continue
        precision, recall = common / len(got), common / len(want)
        out.append(2 * precision * recall / (precision + recall))
    return out


@dataclass(frozen=True)
class Outcome:
    """One episode: the answer and its score, or why there is none."""

    task_id: str
    seed: int
    answer: str
    score: float | None  # None: an infrastructure failure
    error: str | None = None

    @property
    def infra_failure(self) -> bool:
        return self.score is None


def run_episode(
    generate: Generate, harness: Harness, task: Task, seed: int, scorer: Scorer
) -> Outcome:
    messages = harness.inject(task.messages)
    try:
        answer = generate(messages, seed)
    except EpisodeError as e:
        if e.infra:
            return Outcome(task.task_id, seed, "", None, str(e))
        return Outcome(task.task_id, seed, "", 0.0, str(e))
    columns = {k: [v] for k, v in task.columns.items()}
    score = float(scorer([answer], **columns)[0])
    return Outcome(task.task_id, seed, answer, score)


@dataclass(frozen=True)
class PairedEvaluation:
    """Per-task mean scores of the candidate and the head, complete pairs only, in task order;
    plus what did not complete and what it cost."""

    task_ids: list[str]
    candidate: list[float]
    head: list[float]
    repeats: int
    episodes: int  # run now (cached head episodes not counted)
    head_cached: int  # head episodes read from the cache
    infra_failures: int  # episodes the engine could not answer
    incomplete_tasks: list[str]  # left out of the comparison: an episode of theirs failed
    seconds: float
    examples: list[dict[str, Any]] = field(default_factory=list)  # a few answers, both sides

    def metrics(self) -> dict[str, float]:
        return {
            "eval_tasks": float(len(self.task_ids)),
            "eval_repeats": float(self.repeats),
            "eval_episodes": float(self.episodes),
            "eval_head_cached": float(self.head_cached),
            "eval_infra_failures": float(self.infra_failures),
            "eval_incomplete_tasks": float(len(self.incomplete_tasks)),
            "eval_seconds": self.seconds,
        }


def head_key(
    head: Harness, weights_id: str, task: Task, seed: int, sampling: Mapping[str, Any]
) -> str:
    """The cache key of a head episode: everything its outcome depends on."""
    data = [head.content_hash(), weights_id, task.content_key(), seed, dict(sampling)]
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def paired_evaluation(
    generate: Generate,
    tasks: Sequence[Task],
    candidate: Harness,
    head: Harness,
    *,
    repeats: int,
    scorer: Scorer,
    weights_id: str,
    sampling: Mapping[str, Any],
    cache: MutableMapping[str, float],
    progress: Callable[[int, int], None] | None = None,
    answers: list[Outcome] | None = None,
) -> PairedEvaluation:
    """Candidate and head on the same tasks and seeds (0..repeats-1). `cache` holds head
    episode scores by `head_key`; new ones are added to it (infrastructure failures never).
    `answers`, when given, receives every candidate episode (the guards' failed answers are
    kept for review from them)."""
    started = time.monotonic()
    total = len(tasks) * repeats * 2
    done = episodes = cached = failures = 0
    ids: list[str] = []
    cand_means: list[float] = []
    head_means: list[float] = []
    incomplete: list[str] = []
    examples: list[dict[str, Any]] = []
    for task in tasks:
        cand_scores: list[float | None] = []
        head_scores: list[float | None] = []
        for seed in range(repeats):
            key = head_key(head, weights_id, task, seed, sampling)
            if key in cache:
                head_scores.append(cache[key])
                cached += 1
            else:
                outcome = run_episode(generate, head, task, seed, scorer)
                episodes += 1
                head_scores.append(outcome.score)
                if outcome.score is not None:
                    cache[key] = outcome.score
                else:
                    failures += 1
            mine = run_episode(generate, candidate, task, seed, scorer)
            if answers is not None:
                answers.append(mine)
            episodes += 1
            failures += mine.infra_failure
            cand_scores.append(mine.score)
            if seed == 0 and len(examples) < 5:
                examples.append(
                    {"task_id": task.task_id, "candidate": mine.answer, "score": mine.score}
                )
            done += 2
            if progress is not None:
                progress(done, total)
        if any(s is None for s in cand_scores + head_scores):
            incomplete.append(task.task_id)
            continue
        ids.append(task.task_id)
        cand_means.append(sum(s for s in cand_scores if s is not None) / repeats)
        head_means.append(sum(s for s in head_scores if s is not None) / repeats)
    return PairedEvaluation(
        task_ids=ids,
        candidate=cand_means,
        head=head_means,
        repeats=repeats,
        episodes=episodes,
        head_cached=cached,
        infra_failures=failures,
        incomplete_tasks=incomplete,
        seconds=round(time.monotonic() - started, 3),
        examples=examples,
    )
