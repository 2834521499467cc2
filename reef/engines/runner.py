"""The embedded engine's model runner: carries out a round's plan on the scheduler thread.

It holds the rows in flight: the running groups with their `Batch` (and so their KV caches)
and the reading line of prompts being read (`Prefill`). For each pass a `RoundPlan`
(`reef.engines.planner`) names, it runs the forward pass (a prompt chunk alone, a decode step,
or both in one pass, `reef.engines.fused`), then advances: samples each row's next token,
sends it to the request's event loop, and moves rows (a prompt read to its end joins its
group's batch; finished, cancelled and failed rows leave). When a pass does not go as planned
it stops and says where the round stands, for the rest to be planned again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import torch

from reef.engines import fused
from reef.engines.batch import Batch, Prefill
from reef.engines.detokenize import Detokenizer, TokenText
from reef.engines.grammar import Constraint
from reef.engines.planner import Group, Progress, Read, RoundPlan, Unit
from reef.engines.prefixes import Hit, PrefixCache
from reef.engines.response import TokenEvent
from reef.engines.sampling import Sampled, SamplingParams, sample_rows
from reef.engines.variants import Variant, Variants
from reef.errors import EngineError, ReefError

log = logging.getLogger(__name__)


def failed(what: str, exc: BaseException) -> str:
    """What a caller is told about a failure inside the model: what failed and the kind of
    error, never the exception's text (it can hold paths and tensors); the log has it."""
    return f"{what} ({type(exc).__name__}); the server log has the details"


@dataclass
class EngineStats:
    """Counters the scheduler thread updates; read them for tests, logs and metrics."""

    requests: int = 0  # admitted to the batch
    finished: int = 0
    cancelled: int = 0
    failed: int = 0
    prefills: int = 0  # forward passes over prompts
    prompt_tokens: int = 0
    steps: int = 0  # decode forward passes
    fused: int = 0  # passes that were both: a decode step and a prompt chunk (reef.engines.fused)
    tokens_generated: int = 0
    max_batch: int = 0  # most rows in one forward pass
    active: int = 0  # admitted and not yet done
    prefix_hits: int = 0  # prompts that started from the prefix cache
    prefix_tokens: int = 0  # prompt tokens those did not read again


class Request:
    """One request in flight, built on the event loop and handed over by `Scheduler.submit`.
    Fields below the line belong to the scheduler thread; the event loop reads `events`, sets
    `cancelled` and reads `done`."""

    def __init__(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        loop: asyncio.AbstractEventLoop,
        detok: Detokenizer,
        variant: Variant,
        *,
        check_finite: bool = False,
        sampling: dict[str, Any] | None = None,
        constraint: Constraint | None = None,
    ):
        self.prompt_ids = prompt_ids
        self.params = params
        self.constraint = constraint  # a structured output's matcher (reef.engines.grammar)
        self.sampling = sampling  # what the record keeps of it (Completion.sampling)
        self.loop = loop
        self.variant = variant  # fixed at submission: loads and unloads do not move a request
        self.check_finite = check_finite  # fail the request on NaN/inf logits (verify)
        self.events: asyncio.Queue[TokenEvent | ReefError] = asyncio.Queue()
        self.submitted = time.monotonic()
        self.cancelled = False  # set by the consumer's side when it goes away
        # ---- scheduler thread
        self.detok = detok
        self.generator = params.generator()
        self.generated = 0
        self.last_token = -1
        self.done = False
        self.admitted: float | None = None
        self.first_token: float | None = None
        self.finished: float | None = None

    def post(self, item: TokenEvent | ReefError) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.cancelled = True

    def timings(self) -> dict[str, float]:
        def ms(t: float | None) -> float:
            return round(((t or self.submitted) - self.submitted) * 1000, 3)

        return {
            "queue_ms": ms(self.admitted),
            "ttft_ms": ms(self.first_token),
            "total_ms": ms(self.finished),
        }


class _Group:
    """Rows that read the same weights, decoded together in one batch."""

    def __init__(self, weights: torch.nn.Module):
        self.weights = weights
        self.batch: Batch | None = None
        self.rows: list[Request] = []


class _Reading:
    """Admitted requests whose prompts are being read (a chunk per round) before they join
    their group's batch; with `hit`, all of them open with its tokens, read already."""

    def __init__(self, weights: torch.nn.Module, rows: list[Request], pad_id: int, hit: Hit | None):
        self.weights = weights
        self.rows = rows
        skip = hit.tokens if hit is not None else 0
        self.waiting_since: float | None = None  # when the pacer first had no room for it
        self.prefill = Prefill(
            [r.prompt_ids[skip:] for r in rows], pad_id, hit.layers if hit is not None else None
        )


@dataclass
class Tally:
    """What one round did, for the pacer: rows decoded, prompt columns x rows read (padding
    included), and whether it read a prompt outside the budget."""

    rows: int = 0
    tokens: int = 0
    unpaced: bool = False


class Runner:
    """The rows in flight and the forward passes over them. Scheduler thread only."""

    def __init__(
        self,
        variants: Variants,
        stats: EngineStats,
        *,
        eos_ids: frozenset[int],
        pad_id: int,
        token_text: TokenText,
        prefixes: PrefixCache | None,
    ):
        self.variants = variants
        self.stats = stats
        self.prefixes = prefixes
        self._eos_ids = eos_ids
        self._pad_id = pad_id
        self._token_text = token_text
        self.groups: dict[Hashable, _Group] = {}  # by their weights
        self.reading: deque[_Reading] = deque()  # admitted, prompts being read, in order

    # ---- the rows in flight

    def in_flight(self) -> list[Request]:
        """Admitted requests not done: rows of the running batches and prompts being read."""
        return [r for g in self.groups.values() for r in g.rows] + [
            r for unit in self.reading for r in unit.rows
        ]

    def decoding(self) -> bool:
        """Whether any row is decoding: a prompt read whole would stall it."""
        return any(g.rows for g in self.groups.values())

    def queue(self, weights: torch.nn.Module, rows: list[Request], hit: Hit | None) -> None:
        """Put admitted `rows` on the reading line as one unit, read in one pass each round."""
        self.reading.append(_Reading(weights, rows, self._pad_id, hit))

    def drop_cancelled(self) -> None:
        """Take rows whose consumer went away out of the running batches."""
        for group in self.groups.values():
            keep = [i for i, r in enumerate(group.rows) if not r.cancelled]
            if len(keep) == len(group.rows) or group.batch is None:
                continue
            for r in group.rows:
                if r.cancelled:
                    self.drop(r)
            group.batch, group.rows = group.batch.select(keep), [group.rows[i] for i in keep]

    def tidy(self) -> None:
        """Forget groups left without rows (their weights may be unloaded)."""
        self.groups = {w: g for w, g in self.groups.items() if g.rows}

    def clear(self) -> None:
        self.groups, self.reading = {}, deque()

    def view(self) -> tuple[list[Group], list[Unit]]:
        """The planner's view of the rows in flight: groups in batch order, the reading line."""
        groups = [
            Group(
                w, len(g.rows), self.variants.lora(g.weights, [r.variant.adapter for r in g.rows])
            )
            for w, g in self.groups.items()
        ]
        units = [
            Unit(
                key=id(u),
                group=u.weights,
                rows=len(u.rows),
                width=int(u.prefill.mask.shape[1]),
                read=u.prefill.read,
                lora=self.variants.lora(u.weights, [r.variant.adapter for r in u.rows]),
                cancelled=all(r.cancelled for r in u.rows),
                waiting_since=u.waiting_since,
            )
            for u in self.reading
        ]
        return groups, units

    # ---- carrying out a plan

    def read(self, plan: RoundPlan, now: float, tally: Tally) -> Progress | None:
        """Carry out `plan`'s drops and reads in order. None when every pass went as planned;
        else where the round stands, for its rest to be planned again."""
        units: dict[Hashable, _Reading] = {id(u): u for u in self.reading}
        for key in plan.drops:
            unit = units[key]
            for r in unit.rows:
                self.drop(r)
            self.reading.remove(unit)
        if plan.waiting is not None and units[plan.waiting].waiting_since is None:
            units[plan.waiting].waiting_since = now
        stepped = set(plan.start.stepped)
        before = plan.start
        for step in plan.reads:
            unit = units[step.unit]
            if all(r.cancelled for r in unit.rows):  # since it was planned: plan again
                return Progress(before.budget, before.progressed, frozenset(stepped))
            tally.unpaced |= not step.paced
            if not self._pass(unit, step, stepped, tally):
                return Progress(step.after.budget, True, frozenset(stepped))
            before = step.after
        return None

    def decode(self, plan: RoundPlan, tally: Tally) -> None:
        """The decode steps of the groups `plan` did not read a prompt with, in batch order."""
        for key in plan.decodes:
            group = self.groups.get(key)
            if group is not None and group.rows:
                self._decode(group, tally)

    def _pass(self, unit: _Reading, step: Read, stepped: set[Any], tally: Tally) -> bool:
        """One prefill pass over the next `step.columns` columns of `unit`, fused with its
        group's decode step where planned; True when it went as planned: no failure, and read
        to its end (`step.last`), every row joined its group."""
        rows = unit.rows
        reading = unit.prefill
        start = reading.read
        group = self.groups.get(unit.weights)
        if step.fused and group is not None and group.rows:
            stepped.add(unit.weights)
            return self._read_fused(unit, step, group, tally)
        try:
            model, extra = self.variants.forward(unit.weights, [r.variant.adapter for r in rows])
            logits = reading.step(model, step.columns, **extra)
            self.stats.prefills += 1
            self.stats.prompt_tokens += int(reading.mask[:, start : reading.read].sum())
            self.stats.max_batch = max(self.stats.max_batch, len(rows))
            tally.tokens += (reading.read - start) * len(rows)
            keep = None if logits is None else self._advance(rows, logits)
        except Exception as exc:
            log.exception("embedded engine: prefill of %d requests failed", len(rows))
            for r in rows:
                self.fail(r, EngineError(failed("the model failed while reading the prompt", exc)))
            self.reading.remove(unit)
            return False
        self._joined(unit, keep)
        return _as_planned(step, len(rows), keep)

    def _read_fused(self, unit: _Reading, step: Read, group: _Group, tally: Tally) -> bool:
        """A prefill pass and `group`'s decode step in one forward pass (`reef.engines.fused`)."""
        reading = unit.prefill
        start = reading.read
        batch = group.batch
        assert batch is not None
        adapters = [r.variant.adapter for r in group.rows + unit.rows]
        model, _ = self.variants.forward(unit.weights, adapters)  # one LoRA setting: planned so
        try:
            decoded, read = fused.step(
                model, batch, [r.last_token for r in group.rows], reading, step.columns
            )
            self.stats.steps += 1
            self.stats.prefills += 1
            self.stats.fused += 1
            self.stats.prompt_tokens += int(reading.mask[:, start : reading.read].sum())
            tally.rows += len(group.rows)
            tally.tokens += (reading.read - start) * len(unit.rows)
            self.stats.max_batch = max(self.stats.max_batch, len(group.rows) + len(unit.rows))
            self._stepped(group, self._advance(group.rows, decoded))
            keep = None if read is None else self._advance(unit.rows, read)
        except Exception as exc:
            # Both caches may be half-updated: the group's rows and the prompt's fail.
            log.exception(
                "embedded engine: fused pass over %d rows and %d prompts failed",
                len(group.rows),
                len(unit.rows),
            )
            for r in group.rows + unit.rows:
                self.fail(r, EngineError(failed("the model failed while generating", exc)))
            group.batch, group.rows = None, []
            self.reading.remove(unit)
            return False
        self._joined(unit, keep)
        return _as_planned(step, len(unit.rows), keep)

    def _joined(self, unit: _Reading, keep: list[int] | None) -> None:
        """After a pass over `unit`: once read to the end (`keep`: its rows still running)
        it leaves the reading line and those rows join their group."""
        rows, reading = unit.rows, unit.prefill
        if keep is None:
            return
        self.reading.remove(unit)
        batch = reading.batch
        assert batch is not None
        if self.prefixes is not None:
            self._remember(rows, batch)
        if len(keep) < len(rows):
            batch = batch.select(keep)
            if batch is None:
                return
        group = self.groups.setdefault(unit.weights, _Group(unit.weights))
        group.batch = batch if group.batch is None else group.batch.merge(batch)
        group.rows = group.rows + [rows[i] for i in keep]

    def _remember(self, rows: list[Request], batch: Batch) -> None:
        """Give the prefix cache each freshly read prompt's keys and values."""
        assert self.prefixes is not None
        for i, r in enumerate(rows):
            if not self.prefixes.wants(r.variant.key, r.prompt_ids):
                continue
            columns = batch.mask[i].nonzero().squeeze(1)  # the row's tokens, not its padding
            layers = [
                (k[i : i + 1].index_select(2, columns), v[i : i + 1].index_select(2, columns))
                for k, v, *_ in batch.cache
            ]
            self.prefixes.store(r.variant.key, r.prompt_ids, layers)

    def _decode(self, group: _Group, tally: Tally) -> None:
        rows, batch = group.rows, group.batch
        assert batch is not None
        try:
            model, extra = self.variants.forward(group.weights, [r.variant.adapter for r in rows])
            logits = batch.step(model, [r.last_token for r in rows], **extra)
            self.stats.steps += 1
            tally.rows += len(rows)
            self.stats.max_batch = max(self.stats.max_batch, len(rows))
            keep = self._advance(rows, logits)
        except Exception as exc:
            # The cache may be half-updated: every row of this step fails, the thread goes on.
            log.exception("embedded engine: decode step over %d rows failed", len(rows))
            for r in rows:
                self.fail(r, EngineError(failed("the model failed while generating", exc)))
            group.batch, group.rows = None, []
            return
        self._stepped(group, keep)

    def _stepped(self, group: _Group, keep: list[int]) -> None:
        """After a decode step of `group`: only the rows at `keep` go on."""
        if len(keep) < len(group.rows):
            assert group.batch is not None
            group.batch = group.batch.select(keep)
            group.rows = [group.rows[i] for i in keep]

    # ---- advancing: each row's next token

    def _advance(self, rows: list[Request], logits: torch.Tensor) -> list[int]:
        """Sample each row's next token, send it, and return the indices of rows still running."""
        masks = [r.constraint.allowed() if r.constraint else None for r in rows]
        picks = sample_rows(logits, [r.params for r in rows], [r.generator for r in rows], masks)
        now = time.monotonic()
        keep = []
        events: list[tuple[Request, TokenEvent]] = []
        for i, (r, pick) in enumerate(zip(rows, picks, strict=True)):
            if r.cancelled:
                self.drop(r)
                continue
            if r.check_finite and not bool(torch.isfinite(logits[i]).all()):
                self.fail(r, EngineError(f"model '{r.variant.name}' produced non-finite logits"))
                continue
            r.generated += 1
            r.last_token = pick.token_id
            r.first_token = r.first_token or now
            self.stats.tokens_generated += 1
            eos = pick.token_id in self._eos_ids
            text = "" if eos else r.detok.add(pick.token_id)
            if not eos and r.constraint is not None and not self._constrained(r, pick.token_id):
                continue
            finish = None
            if r.detok.stopped or eos or (r.constraint is not None and r.constraint.complete):
                finish = "stop"
            elif r.generated >= (r.params.max_tokens or 0):
                finish = "length"
            if finish is not None and not r.detok.stopped:
                text += r.detok.finish()
            entry = self._logprob_entry(pick) if r.params.logprobs else None
            if finish is None:
                keep.append(i)
            else:
                self.leave(r)
                self.stats.finished += 1
            events.append(
                (r, TokenEvent(text, pick.token_id, pick.logprob, entry, finish, pick.capture))
            )
        _post_all(events)
        return keep

    def _constrained(self, r: Request, token_id: int) -> bool:
        """Advance a structured output's matcher; False (and the request failed) if it cannot
        go on, which a mask built by that matcher should never let happen."""
        assert r.constraint is not None
        r.constraint.accept(token_id)
        error = r.constraint.error
        if error is None:
            return True
        self.fail(r, EngineError(f"the structured output could not go on: {error}"))
        return False

    def _logprob_entry(self, pick: Sampled) -> dict[str, Any]:
        text_of = self._token_text
        assert text_of is not None

        def item(token_id: int, logprob: float) -> dict[str, Any]:
            token, data = text_of(token_id)
            # JSON has no -inf; vLLM reports the same floor.
            return {"token": token, "logprob": max(logprob, -9999.0), "bytes": data}

        entry = item(pick.token_id, pick.logprob)
        entry["top_logprobs"] = [item(t, lp) for t, lp in pick.top]
        return entry

    # ---- requests leaving

    def leave(self, r: Request) -> None:
        """Mark a request done; counted out of `active` before its last event is posted."""
        r.done, r.finished = True, time.monotonic()
        if r.admitted is not None:
            self.stats.active -= 1

    def drop(self, r: Request) -> None:
        """A cancelled request leaves: nobody reads its events any more."""
        self.leave(r)
        self.stats.cancelled += 1

    def fail(self, r: Request, exc: ReefError) -> None:
        if r.done:
            return
        self.leave(r)
        self.stats.failed += 1
        r.post(exc)


def _as_planned(step: Read, rows: int, keep: list[int] | None) -> bool:
    """Whether a pass that read `step` went as its plan assumed: a unit read to its end
    (`keep`: its rows still running) joined its group with all its `rows`."""
    if step.last:
        return keep is not None and len(keep) == rows
    return keep is None


def _post_all(events: list[tuple[Request, TokenEvent]]) -> None:
    """Send a step's tokens with one wake-up per event loop rather than one per row: on a
    machine with as many cores as torch has threads, each wake-up of the loop takes a core
    from the next forward pass."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Request, TokenEvent]]] = {}
    for r, event in events:
        by_loop.setdefault(r.loop, []).append((r, event))
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(_deliver, items)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            for r, _ in items:
                r.cancelled = True


def _deliver(items: list[tuple[Request, TokenEvent]]) -> None:
    """On the event loop: each token to its request's queue, in order."""
    for r, event in items:
        r.events.put_nowait(event)
