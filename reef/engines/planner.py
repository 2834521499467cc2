"""The embedded engine's round planner: what a scheduler round reads and decodes, as a value.

A pure function over lengths and counts (`Group`, `Unit`), never a tensor: it returns a frozen
`RoundPlan` that the runner carries out (`reef.engines.runner`), and it is tested on its own.

The rules, in the order a round applies them:

- Admitted prompts are split into units read in one pass each (`split`): while rows decode,
  as many as fit one chunk padded to their longest prompt, so that a long prompt is read on
  its own and short ones behind it do not wait for its last chunk; with nothing decoding,
  all of one kind together.
- The round's budget of prompt tokens (padding included) comes from the rows decoding as it
  starts: none with nothing decoding (prompts are read whole), what the pacer allows for
  that many rows when pacing (`reef.engines.pacing`), else `chunk_tokens` (0: no limit).
  With nothing decoding the budget is set as soon as a prompt has joined the batch, so that
  a long prompt queued behind short ones does not hold up their second token for its whole
  length.
- Units are read oldest first. Paced, a unit that fits one chunk (all of it: a long prompt's
  last chunk is paced too) goes first and is read at once, outside the budget, which is for
  the longer ones; such a round says nothing about what paced chunks cost and is not
  observed. Every other unit reads what is left of the budget, split over its rows.
- Where the budget holds not even one token of a long prompt, the round stops reading, unless
  nothing has been read yet: then (paced) a unit with budget 0 waits for room or for the
  streams to end, at most `max_wait_s`, and after that, or when the budget is smaller than
  its rows, reads a column regardless, so that it always progresses.
- A read that does not reach a unit's end ends the round's reading: the budget is spent.
- A read rides the decode step of the group it will join (`fused`) when fusing is on, that
  group has rows, has not decoded yet this round, and its rows and the unit's set the LoRA
  layers alike (`reef.engines.variants`); every group with rows that did not decode so gets
  a pass of its own after the reads (`decodes`).

A plan assumes every pass goes through and every prompt read to its end joins its batch with
all its rows. When one does not (a pass failed, a request finished on its first token or was
cancelled), the runner stops and the rest of the round is planned again from what is, with
the `Progress` the round had made, so the decisions are those of a round planned pass by pass.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Group:
    """Rows decoding together over one weights (`key`): how many, and the LoRA setting each
    needs (adapter names; empty where the weights carry no adapters)."""

    key: Hashable
    rows: int
    lora: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Unit:
    """Prompts read together, a pass at a time, until they join the group of `group`."""

    key: Hashable  # which unit: the runner's handle on it
    group: Hashable
    rows: int
    width: int  # columns in all: the longest prompt, the others padded to it
    read: int = 0  # columns read so far
    lora: frozenset[str] = frozenset()
    cancelled: bool = False  # every request in it was cancelled
    waiting_since: float | None = None  # when the pacer first had no room for it

    @property
    def remaining(self) -> int:
        return self.width - self.read

    @property
    def tokens(self) -> int:
        """All it reads, padding included."""
        return self.rows * self.width


@dataclass(frozen=True)
class Policy:
    """The engine's settings that shape plans (see `Scheduler`)."""

    chunk_tokens: int = 0  # prompt tokens a round while rows decode; 0: read whole
    fuse: bool = False  # a chunk may ride its group's decode step
    max_wait_s: float = 10.0  # paced: how long a long prompt waits for room


@dataclass(frozen=True)
class Progress:
    """Where a round's reading stands: the budget left (None: no limit), whether anything was
    read yet, and the groups that have had their decode step (fused with a read)."""

    budget: int | None
    progressed: bool = False
    stepped: frozenset[Hashable] = frozenset()


@dataclass(frozen=True)
class Read:
    """One prefill pass: the next `columns` columns of unit `unit`."""

    unit: Hashable
    columns: int
    fused: bool  # in one forward pass with its group's decode step
    paced: bool  # within the budget (False: a unit that fits one chunk, read at once)
    last: bool  # reads the unit to its end: its rows join their group
    after: Progress  # where the round stands once this pass went as planned


@dataclass(frozen=True)
class RoundPlan:
    """A round: units to drop (all cancelled), prefill passes in order, then the groups that
    decode in a pass of their own; `waiting`: the unit the pacer had no room for, whose wait
    starts now unless it had; `start`: where the round stood when this was planned."""

    drops: tuple[Hashable, ...]
    reads: tuple[Read, ...]
    decodes: tuple[Hashable, ...]
    waiting: Hashable | None
    start: Progress

    @property
    def unpaced(self) -> bool:
        """Whether it reads a prompt outside the budget: its time says nothing of paced chunks."""
        return any(not r.paced for r in self.reads)


Pace = Callable[[int], int]  # prompt tokens a round may read while this many rows decode


def split(lengths: Sequence[int], skip: int, chunk_tokens: int) -> list[list[int]]:
    """Prompts of one kind (their lengths, in arrival order; each opens with `skip` tokens
    read already) as units read in one pass each: indices into `lengths`, in order. With a
    chunk (`chunk_tokens` > 0), a unit holds as many as fit it padded to their longest."""
    units: list[list[int]] = []
    unit: list[int] = []
    for i, n in enumerate(lengths):
        longest = max([n, *(lengths[j] for j in unit)]) - skip
        if unit and chunk_tokens and longest * (len(unit) + 1) > chunk_tokens:
            units.append(unit)
            unit = []
        unit.append(i)
    units.append(unit)
    return units


def budget(rows: int, policy: Policy, pace: Pace | None) -> int | None:
    """The most prompt tokens to read in a round in which `rows` rows decode; None: no limit."""
    if not rows:
        return None
    if pace is not None:
        return pace(rows)
    return policy.chunk_tokens or None


def one_chunk(unit: Unit, policy: Policy, pace: Pace | None) -> bool:
    """Whether `unit`, being paced, is read at once: it fits one chunk (all of it, not just
    what is left of it, so that a long prompt's last chunk is paced too)."""
    return pace is not None and unit.tokens <= policy.chunk_tokens


def plan(
    groups: Sequence[Group],
    units: Sequence[Unit],
    policy: Policy,
    *,
    pace: Pace | None = None,
    now: float = 0.0,
    progress: Progress | None = None,
) -> RoundPlan:
    """The round for `groups` (in their batch order) and `units` (the reading line, oldest
    first); `pace`: the pacer's budget when pacing; `now`: the clock `waiting_since` is on;
    `progress`: where the round stands when its rest is planned again (None: a new round)."""
    rows = {g.key: g.rows for g in groups}
    lora = {g.key: g.lora for g in groups}
    if progress is None:
        progress = Progress(budget(sum(rows.values()), policy, pace))
    start = progress
    left, progressed, stepped = progress.budget, progress.progressed, set(progress.stepped)
    line = list(units)
    drops: list[Hashable] = []
    reads: list[Read] = []
    waiting: Hashable | None = None
    while line:
        if left is None and progressed:
            # Prompts read whole joined the batch: the rest must not stall their rows.
            left = budget(sum(rows.values()), policy, pace)
        unit = next((u for u in line if one_chunk(u, policy, pace)), line[0])
        if unit.cancelled:
            drops.append(unit.key)
            line.remove(unit)
            continue
        columns, paced = unit.remaining, not one_chunk(unit, policy, pace)
        if paced and left is not None:
            columns = min(columns, left // unit.rows)
            if columns < 1:
                if progressed:
                    break
                if left <= 0:
                    waiting = unit.key
                    since = now if unit.waiting_since is None else unit.waiting_since
                    if now - since < policy.max_wait_s:
                        break
                columns = 1
            left -= columns * unit.rows
        progressed = True
        fused = (
            policy.fuse
            and rows.get(unit.group, 0) > 0
            and unit.group not in stepped
            and len(lora[unit.group] | unit.lora) <= 1
        )
        if fused:
            stepped.add(unit.group)
        last = columns >= unit.remaining
        after = Progress(left, True, frozenset(stepped))
        reads.append(Read(unit.key, columns, fused, paced, last, after))
        if not last:
            break  # the budget is spent: this unit goes on next round
        line.remove(unit)
        rows[unit.group] = rows.get(unit.group, 0) + unit.rows
        lora[unit.group] = lora.get(unit.group, frozenset()) | unit.lora
    decodes = tuple(k for k, n in rows.items() if n and k not in stepped)
    return RoundPlan(tuple(drops), tuple(reads), decodes, waiting, start)
