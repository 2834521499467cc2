"""The annotation queue's policies: which of a scenario's recent turns people are asked to
review (review.* settings, per scenario under scenarios.<name>.review).

- sample: a share of the turns, chosen by a hash of the turn's id (the same on every replica
  and every fill, so a fill never adds a turn it passed over before);
- unsure: turns whose judgment's confidence is below `unsure_below` (reef.judge: the share of
  a generating judge's votes for its verdict, so a split vote is unsure; a likelihood judge's
  probability of its verdict);
- disagreement: turns where the judge's verdict and a person's score disagree
  (reef.judge.person_vote, the rule of the judge's agreement with people);
- canary: turns served by a candidate in canary;
- guard_failed: a candidate's answers that a gate guard failed (reef.guard_answers). Those are
  not picked here: the evolve flow keeps them as records when the gate has run and queues them
  then, with reason `guard`.

The queue itself lives in the store (reef.store.review): a turn is added once, whichever
policy picked it first, and a fill on any replica at any time is safe.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from reef.judge import is_judgment, person_vote
from reef.records import Report
from reef.settings.review import ReviewSettings
from reef.store.chain import ChainStore
from reef.store.review import ReviewStore


class QueueStore(ReviewStore, ChainStore, Protocol):
    """What filling a queue reads and writes: the queue, and the chain's canaries."""


ReportsFor = Callable[[str, Iterable[str]], Mapping[str, Sequence[Report]]]


def describe(policy: ReviewSettings) -> list[str]:
    """The policies that fill the queue, in words (the queue page's summary)."""
    out = []
    if policy.sample:
        out.append(f"a random {policy.sample:.0%} of turns")
    if policy.unsure_below is not None:
        out.append(f"judgments less sure than {policy.unsure_below:g}")
    if policy.disagreement:
        out.append("turns where the judge and a person disagree")
    if policy.canary:
        out.append("turns served by a canary")
    if policy.guard_failed:
        out.append("a candidate's answers a gate guard failed")
    return out


def sampled(record_id: str, share: float) -> bool:
    """Whether the turn falls in a random `share` of the traffic (stable per id)."""
    if share <= 0:
        return False
    digest = hashlib.sha256(record_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def _judgment(reports: Sequence[Report]) -> Report | None:
    """The latest scored judgment of a turn (a dropped one has no verdict)."""
    found = [r for r in reports if is_judgment(r) and not r.metadata.get("dropped")]
    return found[-1] if found else None


def _disagrees(judged: Report, reports: Sequence[Report]) -> bool:
    verdict = judged.metadata.get("verdict")
    if not isinstance(verdict, (int, float)) or verdict == 0:
        return False
    people = [r for r in reports if not is_judgment(r) and r.score is not None]
    if not people:
        return False
    person = person_vote(float(people[-1].score or 0.0))
    return person != 0 and person != int(verdict)


def reason(
    policy: ReviewSettings,
    record_id: str,
    release_id: str,
    reports: Sequence[Report],
    canaries: frozenset[str],
) -> str | None:
    """Why the turn belongs in the queue (the first policy that picks it), or None."""
    if policy.canary and release_id in canaries:
        return "canary"
    judged = _judgment(reports)
    if judged is not None:
        confidence = judged.metadata.get("confidence")
        unsure = policy.unsure_below
        if unsure is not None and isinstance(confidence, (int, float)) and confidence < unsure:
            return "unsure"
        if policy.disagreement and _disagrees(judged, reports):
            return "disagreement"
    if sampled(record_id, policy.sample):
        return "sample"
    return None


def fill(
    store: QueueStore,
    reports_for: ReportsFor,
    scenario: str,
    policy: ReviewSettings,
) -> int:
    """Add the scenario's recent turns (the last `policy.scan`) that a policy picks to its
    queue. Returns how many were new to it."""
    if not policy.active:
        return 0
    turns = store.recent_turns(scenario, policy.scan)
    reports = reports_for(scenario, [rid for rid, _ in turns]) if turns else {}
    canaries = frozenset(c.id for c in store.list_candidates(scenario, "canary"))
    picked = []
    for record_id, release_id in turns:
        why = reason(policy, record_id, release_id, reports.get(record_id, ()), canaries)
        if why is not None:
            picked.append((record_id, why))
    picked.reverse()  # oldest first: the queue serves the oldest turn first
    return store.add_review_items(scenario, picked)
