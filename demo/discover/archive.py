"""The PUCT archive of states (the TTT-Discover paper): which earlier programs the next step's
rollouts start from.

score(s) = Q(s) + c · scale · P(s) · sqrt(1 + T) / (1 + n(s)), with Q(s) the best value among
the children ever produced from s (once it has one) else its own value, P(s) a linear rank
prior ((N − rank) / (N(N+1)/2), best first), scale the spread of values over non-seed states
(at least 1e-6), T the expansions so far and n(s) the visits of s and of its descendants.
A step's parents are taken greedily by score, each blocking its whole lineage (ancestors and
descendants), so the G groups explore G independent lines. After a group: the parent's best
child value is updated, new valid children are added, visits are counted on the parent and its
ancestors for every rollout, and only the top-2 children per parent and the top `cap` states
(seeds always kept) survive.

The archive is plain JSON on disk (`save` / `load`), written after every step: a harness that
restarts continues from the last completed step.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class State:
    id: int
    program: str | None  # None for an empty seed ("write code to solve this problem")
    reward: float
    value: float  # search value (= reward for the packing judge)
    parent: int | None
    seed: bool
    output: str = ""  # the judge's reason string, shown to the children
    visits: int = 0
    best_child: float | None = None  # m(s): best value among children ever produced
    step: int = -1  # the step that produced it (−1: seeded)


@dataclass
class Archive:
    states: dict[int, State] = field(default_factory=dict)
    expansions: int = 0  # T
    c: float = 1.0
    cap: int = 1000
    children_per_parent: int = 2
    next_id: int = 0
    steps_done: int = 0  # the harness's resume point

    # building --------------------------------------------------------------------------
    def add(self, state: State) -> State:
        state.id = self.next_id
        self.next_id += 1
        self.states[state.id] = state
        return state

    def seed(self, program: str | None = None, reward: float = 0.0, output: str = "") -> State:
        return self.add(State(0, program, reward, reward, None, True, output))

    # scoring ---------------------------------------------------------------------------
    def q(self, s: State) -> float:
        return s.best_child if s.visits > 0 and s.best_child is not None else s.value

    def scale(self) -> float:
        pool = [s.value for s in self.states.values() if not s.seed] or [
            s.value for s in self.states.values()
        ]
        return max(max(pool) - min(pool), 1e-6) if pool else 1e-6

    def ranks(self) -> dict[int, int]:
        """rank 0 = highest value (ties: the older state first)."""
        ordered = sorted(self.states.values(), key=lambda s: (-s.value, s.id))
        return {s.id: i for i, s in enumerate(ordered)}

    def scores(self) -> dict[int, float]:
        n = len(self.states)
        ranks = self.ranks()
        total = n * (n + 1) / 2
        scale = self.scale()
        explore = math.sqrt(1.0 + self.expansions)
        return {
            s.id: self.q(s)
            + self.c * scale * ((n - ranks[s.id]) / total) * explore / (1 + s.visits)
            for s in self.states.values()
        }

    # lineage ---------------------------------------------------------------------------
    def ancestors(self, sid: int) -> list[int]:
        out = []
        parent = self.states[sid].parent
        while parent is not None and parent in self.states:
            out.append(parent)
            parent = self.states[parent].parent
        return out

    def descendants(self, sid: int) -> list[int]:
        children: dict[int, list[int]] = {}
        for s in self.states.values():
            if s.parent is not None:
                children.setdefault(s.parent, []).append(s.id)
        out, todo = [], list(children.get(sid, []))
        while todo:
            x = todo.pop()
            out.append(x)
            todo.extend(children.get(x, []))
        return out

    def select(self, groups: int) -> list[State]:
        """G parents by score (ties: higher value), each blocking its whole lineage."""
        scores = self.scores()
        blocked: set[int] = set()
        chosen: list[State] = []
        ordered = sorted(self.states.values(), key=lambda s: (-scores[s.id], -s.value, s.id))
        for s in ordered:
            if len(chosen) == groups:
                break
            if s.id in blocked:
                continue
            chosen.append(s)
            blocked |= {s.id, *self.ancestors(s.id), *self.descendants(s.id)}
        if len(chosen) < groups:
            raise ValueError(
                f"only {len(chosen)} independent lineages for {groups} groups: seed more states"
            )
        return chosen

    # updating --------------------------------------------------------------------------
    def update(self, parent_id: int, children: Iterable[State], rollouts: int, step: int) -> None:
        """After one group: m, new valid children (new program text only), visits, pruning."""
        parent = self.states[parent_id]
        kids = list(children)
        valid = [k for k in kids if k.program is not None and k.reward > 0.0]
        if valid:
            top = max(k.value for k in valid)
            parent.best_child = top if parent.best_child is None else max(parent.best_child, top)
        known = {s.program for s in self.states.values()}
        for k in valid:
            if k.program in known:
                continue
            known.add(k.program)
            k.parent, k.seed, k.step = parent_id, False, step
            self.add(k)
        for sid in (parent_id, *self.ancestors(parent_id)):
            self.states[sid].visits += rollouts
        self.expansions += rollouts
        self._prune()

    def _prune(self) -> None:
        by_parent: dict[int, list[State]] = {}
        for s in self.states.values():
            if s.parent is not None and not s.seed:
                by_parent.setdefault(s.parent, []).append(s)
        drop: set[int] = set()
        for kids in by_parent.values():
            kids.sort(key=lambda s: (-s.value, s.id))
            drop |= {s.id for s in kids[self.children_per_parent :]}
        keep = [s for s in self.states.values() if s.id not in drop]
        seeds = [s for s in keep if s.seed]
        rest = sorted((s for s in keep if not s.seed), key=lambda s: (-s.value, s.id))
        keep_ids = {s.id for s in seeds} | {s.id for s in rest[: max(self.cap - len(seeds), 0)]}
        self.states = {sid: s for sid, s in self.states.items() if sid in keep_ids}
        for s in self.states.values():  # cut dangling parent links
            if s.parent is not None and s.parent not in self.states:
                s.parent = None

    # results and persistence -----------------------------------------------------------
    def best(self) -> State:
        return max(self.states.values(), key=lambda s: (s.value, -s.id))

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k != "states"}
        return data | {"states": [asdict(s) for s in self.states.values()]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Archive:
        states = {s["id"]: State(**s) for s in data["states"]}
        return cls(states=states, **{k: v for k, v in data.items() if k != "states"})

    def save(self, path: Path) -> None:
        """Atomically: a crash mid-write leaves the previous step's archive."""
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> Archive:
        return cls.from_dict(json.loads(path.read_text()))
