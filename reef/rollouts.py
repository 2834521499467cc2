"""Rollouts: which arm (canary or control) serves a call, and what each arm has earned.

A canary is a candidate the gate accepted, with status "canary": it serves a sticky share of a
scenario's sessions while the head serves the rest. Stickiness comes from a hash, not from
state: sha256(canary id, sticky key) below `share` means canary. The same key gets the same
arm in every process, after a restart and on every replica sharing the database, and a new
canary draws a new sample of keys.

The sticky key is, by `rollout.sticky`: the end user (x-reef-user-id), a tag's value, or the
session: the explicit x-reef-session-id, else the conversation's first user message (every
turn of a conversation repeats it, so all turns land on one arm without a lookup).

`Rollouts` (one per serving process) finds a scenario's canary (a short cache, as for the
scenario row), picks the arm, and keeps each arm's serving health (errors, latency) for the
guardrail. `arm_scores` reads what reports said about each arm from the database.

An A/B split (`rollout.mode: ab`) is the same hash between two named releases, arms "a" and
"b" (`ab.share` of keys get b), with no decision: it lasts until an operator ends it, which
records a release on the chain naming the pair (`metadata.rollout.ab`); a pair so ended is
not split again. A shadow rollout's candidate (reef.shadow) is a canary that serves no arm.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from reef.errors import NotFound
from reef.records import Candidate, Release, Scenario
from reef.sequential import ArmScores, Guardrail, Health, SequentialPolicy
from reef.settings import RolloutSettings
from reef.store.chain import ChainStore
from reef.store.deadline import bounded
from reef.store.reports import ReportStore

log = logging.getLogger(__name__)
ArmName = Literal["canary", "control", "a", "b"]
ARM_TAG = "reef.arm"  # record tags naming the arm and the rollout (canary id, or ab:<a>:<b>)
ROLLOUT_TAG = "reef.rollout"


def sticky_key(
    sticky: str,
    *,
    session_id: str | None,
    user_id: str | None,
    tags: dict[str, str],
    messages: list[dict[str, Any]],
) -> str | None:
    """What keeps a caller on one arm (None: nothing to key on; the call's arm is drawn)."""
    if sticky == "user":
        return f"user:{user_id}" if user_id else None
    if sticky.startswith("tag:"):
        value = tags.get(sticky[4:])
        return f"tag:{value}" if value else None
    if session_id:
        return f"session:{session_id}"
    first = next((m for m in messages if m.get("role") == "user"), None)
    if first is None:
        return None
    content = first.get("content")
    text = content if isinstance(content, str) else repr(content)
    return "first:" + hashlib.sha256(text.encode()).hexdigest()


def arm_for(rollout_id: str, key: str, share: float) -> ArmName:
    """The arm `key` gets in rollout `rollout_id`: the same in every process, every time."""
    digest = hashlib.sha256(f"{rollout_id}\x00{key}".encode()).digest()
    position = int.from_bytes(digest[:8], "big") / 2**64
    return "canary" if position < share else "control"


def ab_id(pair: tuple[str, str]) -> str:
    """The rollout id of an A/B split: its record tag and the seed of its hash."""
    return f"ab:{pair[0]}:{pair[1]}"


def ab_stopped(store: ChainStore, scenario: str, pair: tuple[str, str]) -> str | None:
    """Why the A/B split of `pair` does not run (an operator ended it, or a release it names is
    not on the chain), or None while it runs."""
    chain = store.list_releases(scenario)
    for release in reversed(chain):
        if release.metadata.get("rollout", {}).get("ab") == list(pair):
            return f"the A/B split of {pair[0]} and {pair[1]} was ended by release {release.id}"
    missing = set(pair) - {r.id for r in chain}
    if missing:
        return f"ab.releases names {', '.join(sorted(missing))}, not on the chain of '{scenario}'"
    return None


def sequential_policy(rollout: RolloutSettings) -> SequentialPolicy:
    return SequentialPolicy(
        confidence=rollout.confidence,
        margin=rollout.margin,
        min_samples=rollout.min_samples,
        max_duration_s=rollout.max_duration_s,
        on_inconclusive=rollout.on_inconclusive,
    )


def guardrail_of(rollout: RolloutSettings) -> Guardrail:
    return Guardrail(
        max_error_rate_increase=rollout.max_error_rate_increase,
        max_p95_ratio=rollout.max_p95_ratio,
        min_requests=rollout.guard_min_requests,
    )


@dataclass(frozen=True)
class Arm:
    """The arm a call was given: which release serves it, and the tags its record carries."""

    name: ArmName
    release_id: str
    rollout_id: str

    @property
    def tags(self) -> dict[str, str]:
        return {ARM_TAG: self.name, ROLLOUT_TAG: self.rollout_id}


@dataclass
class _Window:
    """One arm's recent calls in this process: outcomes and latencies (bounded)."""

    requests: int = 0
    errors: int = 0
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=2000))

    def health(self) -> Health:
        if not self.latencies:
            return Health(self.requests, self.errors, None)
        ordered = sorted(self.latencies)
        p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
        return Health(self.requests, self.errors, p95)


class Rollouts:
    """The serving side of rollouts in one process: canary lookup, arm choice, arm health."""

    def __init__(
        self,
        store: ChainStore,
        settings: RolloutSettings,
        ttl_s: float = 2.0,
        *,
        store_deadline_s: float | None = None,
    ):
        self.store = store
        # A call's canary and A/B lookups wait this long at most (store.deadline_s)
        self.store_deadline_s = store_deadline_s
        self.settings = settings
        self._ttl_s = ttl_s
        self._canaries: dict[str, tuple[Candidate | None, float]] = {}
        self._splits: dict[str, tuple[tuple[str, str] | None, float]] = {}
        self._health: dict[tuple[str, ArmName], _Window] = {}

    async def canary(self, scenario: str) -> Candidate | None:
        """The scenario's live canary, if any (re-read after `ttl_s`: another process may
        start or end one)."""
        hit = self._canaries.get(scenario)
        now = time.monotonic()
        if hit is not None and hit[1] > now:
            return hit[0]
        rows = await bounded(self.store_deadline_s, self.store.list_candidates, scenario, "canary")
        found = rows[0] if rows else None
        self._canaries[scenario] = (found, now + self._ttl_s)
        return found

    def forget(self, scenario: str) -> None:
        self._canaries.pop(scenario, None)
        self._splits.pop(scenario, None)

    async def split(self, scenario: str) -> tuple[str, str] | None:
        """The scenario's live A/B pair: `ab.releases` under mode ab, until an operator ends
        it (re-read after `ttl_s`, as the canary is)."""
        rollout = self.settings.for_scenario(scenario)
        if rollout.mode != "ab" or not rollout.ab.releases:
            return None
        pair = (rollout.ab.releases[0], rollout.ab.releases[1])
        hit = self._splits.get(scenario)
        now = time.monotonic()
        if hit is not None and hit[1] > now:
            return hit[0]
        stopped = await bounded(self.store_deadline_s, ab_stopped, self.store, scenario, pair)
        if stopped is not None and hit is None:
            log.warning("%s: serving the head", stopped)
        live = None if stopped is not None else pair
        self._splits[scenario] = (live, now + self._ttl_s)
        return live

    async def arm(
        self,
        scenario: Scenario,
        *,
        session_id: str | None,
        user_id: str | None,
        tags: dict[str, str],
        messages: list[dict[str, Any]],
        fallback: str,
    ) -> Arm | None:
        """The arm of this call, or None when the scenario has no live canary or A/B split.
        `fallback` (the call's record id) keys a call that carries nothing sticky."""
        rollout = self.settings.for_scenario(scenario.name)
        if rollout.mode == "ab":
            pair = await self.split(scenario.name)
            if pair is None:
                return None
            rollout_id, share = ab_id(pair), rollout.ab.share
            drawn, other = Arm("b", pair[1], rollout_id), Arm("a", pair[0], rollout_id)
        elif rollout.mode == "canary":
            canary = await self.canary(scenario.name)
            if canary is None:
                return None
            rollout_id, share = canary.id, rollout.share
            drawn = Arm("canary", canary.id, canary.id)
            other = Arm("control", scenario.head_release_id, canary.id)
        else:
            return None
        key = sticky_key(
            rollout.sticky, session_id=session_id, user_id=user_id, tags=tags, messages=messages
        )
        return drawn if arm_for(rollout_id, key or fallback, share) == "canary" else other

    def observe(self, rollout_id: str, arm: ArmName, ok: bool, latency_ms: float) -> None:
        """One call's outcome on an arm, for the guardrail."""
        window = self._health.setdefault((rollout_id, arm), _Window())
        window.requests += 1
        if ok:
            window.latencies.append(latency_ms)
        else:
            window.errors += 1

    def health(self, rollout_id: str) -> tuple[Health, Health]:
        """(canary, control) health seen by this process during rollout `rollout_id`."""
        canary = self._health.get((rollout_id, "canary"), _Window()).health()
        control = self._health.get((rollout_id, "control"), _Window()).health()
        return canary, control


def arm_scores(
    store: ReportStore, scenario: str, release_id: str, since: datetime, policy: SequentialPolicy
) -> ArmScores:
    """The reports' scores on the records `release_id` served since `since` (the rollout's
    start), clipped to the policy's range: one covering scan of the report references."""
    n, total = store.arm_sums(scenario, release_id, since, policy.score_low, policy.score_high)
    return ArmScores(n, total)


def served_release(store: ChainStore, scenario: str, release_id: str) -> Release:
    """The release that serves `release_id`: on the chain, or a live canary's candidate under
    the id it will take (it serves before it is on the chain)."""
    try:
        return store.get_release(scenario, release_id)
    except NotFound:
        cand = store.get_candidate(scenario, release_id)
        if cand.status != "canary":
            raise
        return cand.release()
