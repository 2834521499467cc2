"""Guard answers: the answers a candidate gave to a gate guard's tasks that the guard's scorer
failed, kept for people to review (`review.guard_failed`, per scenario like every review key).

At the gate each guard (`gate.guards[]`) has both models answer its fixed task set, and the
paired comparison of their scores decides whether the candidate is shown safe (reef.gate). The
verdict is about the whole set; this module keeps what a person can act on: each task the
candidate FAILED (its score below 1, the built-in scorers' mark for a right answer; a custom
scorer's partial credit counts as failed), with the question, the candidate's answer, the
answer the task expects and the guard's name. That holds whether or not the guard as a whole
was shown safe: a candidate can fail a task the head failed too.

Why they are records of the scenario (tagged, never served): the annotation queue, the review
form, the report path and experience all work on records, so a guard answer is reviewed,
corrected and trained on through exactly the code a served turn goes through. A reviewer sees
the question and the candidate's answer as the turn, and the guard, the task's expected answer
and the candidate in a box above it; a correction becomes a training target as any correction
does (the sft recipe trains on it in place of the answer), a score scores it. What keeps them
apart from traffic:

- tagged `reef.guard` (the guard's name) with the candidate, the task, its score and the
  expected answer (reef.records.GUARD_*); a client cannot set `reef.*` tags;
- made on the release the candidate was judged against (its parent, a release of the chain,
  as an imported record is made on the head): experience accepts a report on it and ages it as
  it ages a turn that release served;
- a report on one counts for no release: its report_references rows carry GUARD_RELEASE in
  place of the release, so neither the per-release scores (releases, learning curve) nor a
  rollout's canary or control arm count a reviewer's score of a candidate's failure; and the
  dashboard's calls per hour leave them out, as they leave imported records out;
- the judge never judges one from a next turn (it has none); a comment without a score on one
  is judged as a comment on a served turn is.

They are written only where the scenario's `review.guard_failed` is on, and queued with
reason `guard` as they are written (no fill has to find them among the traffic). An answer is
kept once per guard, task and text (its Idempotency-Key is their hash): a later candidate that
fails the same task with the same words adds nothing, so the queue holds each distinct failure
once, tagged with the first candidate that gave it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from reef.records import (
    GUARD_CANDIDATE_TAG,
    GUARD_EXPECTED_TAG,
    GUARD_SCORE_TAG,
    GUARD_TAG,
    GUARD_TASK_TAG,
    Candidate,
    Record,
    new_id,
    utcnow,
)
from reef.store.records import RecordStore
from reef.store.review import ReviewStore

ROUTE = "chat.completions"
REASON = "guard"  # the queue item's reason
KEY_PREFIX = "reef-guard:"  # their Idempotency-Keys
PASS = 1.0  # a score below this is a failed answer
EXPECTED_MAX = 2000  # characters of the expected answer kept in its tag


class GuardAnswerStore(RecordStore, ReviewStore, Protocol):
    """Where guard answers go: the scenario's records and its annotation queue."""


@dataclass(frozen=True)
class GuardAnswer:
    """A candidate's answer to one task of a guard, with the task and the score it got."""

    guard: str
    task_id: str
    messages: list[dict[str, Any]]
    answer: str
    score: float
    expected: Any = None  # the task's `answer` column (a string, a list of them) or None

    @property
    def key(self) -> str:
        """Its Idempotency-Key: the same guard, task and answer text are kept once."""
        body = json.dumps(
            [self.guard, self.task_id, self.messages, self.answer],
            sort_keys=True,
            ensure_ascii=False,
        )
        return KEY_PREFIX + hashlib.sha256(body.encode()).hexdigest()[:40]


def failed(
    guard: str,
    tasks: Sequence[tuple[str, list[dict[str, Any]], dict[str, Any]]],
    answers: Sequence[str],
    scores: Sequence[float],
) -> list[GuardAnswer]:
    """The answers of one guard's task set that scored below PASS. `tasks`: (task id, messages,
    the task's columns) in the order of `answers` and `scores`."""
    out = []
    for (task_id, messages, columns), answer, score in zip(tasks, answers, scores, strict=True):
        if score < PASS:
            expected = (columns or {}).get("answer")
            out.append(GuardAnswer(guard, task_id, list(messages), answer, float(score), expected))
    return out


def _expected_text(expected: Any) -> str | None:
    if expected is None:
        return None
    text = expected if isinstance(expected, str) else json.dumps(expected, ensure_ascii=False)
    return text[:EXPECTED_MAX]


def as_record(candidate: Candidate, answer: GuardAnswer) -> Record:
    """The guard answer as a record of the candidate's scenario, made on its parent release."""
    tags = {
        GUARD_TAG: answer.guard,
        GUARD_CANDIDATE_TAG: candidate.id,
        GUARD_TASK_TAG: answer.task_id,
        GUARD_SCORE_TAG: f"{answer.score:g}",
    }
    expected = _expected_text(answer.expected)
    if expected is not None:
        tags[GUARD_EXPECTED_TAG] = expected
    return Record(
        id=new_id("rec"),
        scenario=candidate.scenario,
        created_at=utcnow(),
        route=ROUTE,
        model=candidate.id,  # the model that answered: the candidate
        stream=False,
        request={"model": candidate.id, "messages": answer.messages},
        response={
            "object": "chat.completion",
            "model": candidate.id,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": answer.answer},
                    "finish_reason": "stop",
                }
            ],
        },
        release_id=candidate.parent_id,
        tags=tags,
        idempotency_key=answer.key,
    )


def keep(
    store: GuardAnswerStore, candidate: Candidate, answers: Sequence[GuardAnswer]
) -> list[str]:
    """Store the candidate's failed guard answers as records (those kept before stay as they
    are) and put every one of them in the scenario's queue with reason `guard` (a turn already
    queued stays as it is). Returns the ids of the answers' records, in their order."""
    if not answers:
        return []
    scenario = candidate.scenario
    by_key = {a.key: a for a in answers}
    taken = store.idempotent_ids(scenario, ROUTE, list(by_key))
    fresh = [as_record(candidate, a) for k, a in by_key.items() if k not in taken]
    store.add_records(fresh)
    ids = {**taken, **{r.idempotency_key: r.id for r in fresh if r.idempotency_key}}
    ordered = [ids[k] for k in by_key]
    store.add_review_items(scenario, [(rid, REASON) for rid in ordered])
    return ordered


def guard_view(tags: dict[str, Any]) -> dict[str, str] | None:
    """What the transcript shows of a guard answer (its reef.guard* tags), or None for a turn
    that is not one."""
    if GUARD_TAG not in tags:
        return None
    return {
        "guard": str(tags[GUARD_TAG]),
        "candidate": str(tags.get(GUARD_CANDIDATE_TAG, "")),
        "task": str(tags.get(GUARD_TASK_TAG, "")),
        "score": str(tags.get(GUARD_SCORE_TAG, "")),
        "expected": str(tags.get(GUARD_EXPECTED_TAG, "")),
    }
