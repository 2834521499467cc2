"""The embedded engine's scheduler: one thread that owns the model and decodes every request.

Which thread owns what:

- The event loop (`EmbeddedEngine`) builds each `Request` and hands it over with `submit`; from
  then on it only reads the request's `events` and sets `cancelled` when its consumer goes away.
  It asks for variant changes with `attach_adapter`, `detach_adapter` and `retire`, and awaits
  the `concurrent.futures.Future` they return.
- The scheduler thread (`Scheduler._run`) owns everything else: the waiting line, the running
  groups with their `Batch` (and so their KV caches), the PEFT wrapper around the base model and
  the mode of its LoRA layers, the variants waiting to be freed, a request's fields below its
  line, and the `EngineStats` counters (others only read them). Every forward pass runs on it,
  and so does every change to the base model's layers, only between decode steps.
- They meet at one thread-safe queue (requests and control messages in); tokens go back through
  each request's own event loop (`call_soon_threadsafe`), control results through the futures.
  After the thread has stopped, `close` (on whichever thread calls it) fails what is left.

Between decode steps the scheduler admits queued requests, reads their prompts (prefill), merges
them into the running batch, drops finished and cancelled rows, and advances every row by one
token per forward pass. While rows are decoding, prompts are read in chunks
(`prefill_chunk_tokens` prompt tokens per round, `reef.engines.batch.Prefill`): a long prompt
arriving mid-batch costs the running rows a chunk per round instead of a stall for its whole
length; with nothing decoding they are read whole, in as few passes as can be, until the first
of them has joined the batch (a long prompt queued behind short ones must not hold up their
second token for its whole length: from then on it is read in chunks too). Where the model
allows (`reef.engines.fused`), a chunk goes through the model in the same forward pass as the
decode step of the rows it will join, so a round reads the weights once. With an inter-token
latency target the chunk is sized from measured round times instead, so that a round that reads
one stays within the target (`reef.engines.pacing`); a prompt that fits one chunk is still read
at once, ahead of the long ones being paced, so that ordinary requests arriving as others finish
are not held up for a long prompt's sake.
Prompts that open with tokens read before (a scenario's system prompt and harness text) start
from the keys and values the prefix cache kept of them (`reef.engines.prefixes`).

Rows are grouped by the weights they read: the base model and all its adapters
share one batch (PEFT's mixed-adapter forward, `adapter_names`), each full checkpoint has its own
batch, and every group advances one token per scheduler round.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from reef.engines import fused
from reef.engines.batch import Batch, Prefill
from reef.engines.detokenize import Detokenizer, TokenText
from reef.engines.pacing import Pacer
from reef.engines.prefixes import Hit, PrefixCache, VariantKey
from reef.engines.response import TokenEvent
from reef.engines.sampling import Sampled, SamplingParams, sample_rows
from reef.errors import BadRequest, EngineError, EngineUnavailable, ReefError

log = logging.getLogger(__name__)


def _failed(what: str, exc: BaseException) -> str:
    """What a caller is told about a failure inside the model: what failed and the kind of
    error, never the exception's text (it can hold paths and tensors); the log has it."""
    return f"{what} ({type(exc).__name__}); the server log has the details"


_STOP = object()  # queued by close(): the scheduler fails what is left and exits
BASE_ADAPTER = "__base__"  # PEFT's adapter name for rows of a mixed batch that take no adapter
_MIXED = "__mixed__"  # LoRA layers enabled, each row's adapter named in the forward call


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


@dataclass(eq=False)
class Variant:
    """A model the engine answers to: the base, a LoRA adapter on it, or a full checkpoint.

    `weights` is the model whose parameters a forward pass reads: the base model for the base
    and every adapter (which then share a batch), a model of its own for a checkpoint. Made on
    the event loop, never changed; the scheduler only reads it.
    """

    name: str
    weights: torch.nn.Module
    adapter: str | None = None  # the PEFT adapter's key inside the base model

    @property
    def key(self) -> VariantKey:
        """What the keys and values it computes depend on (the prefix cache's key)."""
        return (id(self.weights), self.adapter)


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
    ):
        self.prompt_ids = prompt_ids
        self.params = params
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


@dataclass(frozen=True)
class _Control:
    """Work for the scheduler thread between decode steps; `done` carries its result back."""

    run: Callable[[], Any]
    done: Future[Any]


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


class Scheduler:
    """The thread that owns the model: batches requests, runs prefill and decode, and applies
    variant changes between decode steps. Its public methods are the event loop's interface
    and may be called from any thread; everything else runs on the scheduler thread."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        model_id: str,
        max_batch_size: int,
        eos_ids: frozenset[int],
        pad_id: int,
        token_text: TokenText,
        stats: EngineStats,
        prefill_chunk_tokens: int = 0,
        prefix_cache_bytes: int = 0,
        fuse_prefill: bool = False,
        itl_target_s: float | None = None,
        itl_headroom: float | None = None,
        itl_max_wait_s: float = 10.0,
    ):
        """`prefill_chunk_tokens`: the most prompt tokens (padding included) read per round
        while other rows decode; 0 reads every admitted prompt whole at once.
        `prefix_cache_bytes`: how much the prefix cache may keep; 0: no prefix cache.
        `fuse_prefill`: a chunk read while rows of the same weights decode goes through the
        model in one pass with their decode step (`reef.engines.fused`; the model must be one
        `fused.supported` accepts).
        `itl_target_s`: while rows decode, read as many prompt tokens a round (at most
        `prefill_chunk_tokens` when that is set) as keep the round within this many seconds,
        by the measured cost of earlier rounds (`reef.engines.pacing`), of the prompts longer
        than `prefill_chunk_tokens`: the others are read at once, first; None: always
        `prefill_chunk_tokens`. `itl_headroom`: the same, within this much longer than a
        round that reads no prompt (0.15: 15 %); with both, the tighter. `itl_max_wait_s`:
        paced, how long a long prompt waits while not even one of its tokens fits a round,
        before it is read a token a round regardless."""
        # ---- fixed before the thread starts
        self.model_id = model_id
        self.max_batch_size = max_batch_size
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.fuse_prefill = fuse_prefill
        self.stats = stats  # written by the scheduler thread only
        self._eos_ids = eos_ids
        self._pad_id = pad_id
        self._token_text = token_text
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        # ---- scheduler thread
        self._model: Any = model  # the base model, never wrapped: adapters go in `_peft`
        self._peft: Any = None  # PeftModel around `_model` while an adapter is loaded
        self._lora_mode: str | None = None  # what its LoRA layers apply now (see _lora_layers)
        self._groups: dict[torch.nn.Module, _Group] = {}
        self._waiting: deque[Request] = deque()  # taken off the queue, not yet admitted
        self._reading: deque[_Reading] = deque()  # admitted, prompts being read, in order
        self._retiring: list[tuple[Variant, Future[None]]] = []  # unloaded, maybe still in use
        self._prefixes = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes else None
        self._pacer = (
            Pacer(itl_target_s, prefill_chunk_tokens, headroom=itl_headroom)
            if itl_target_s or itl_headroom
            else None
        )
        self.itl_max_wait_s = itl_max_wait_s
        self._round_rows = 0  # rows that decoded in this round
        self._round_tokens = 0  # prompt columns x rows read in this round, padding included
        self._round_unpaced = False  # whether this round read a prompt outside the budget

    # ---- the event loop's interface (any thread)

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"reef-engine-{self.model_id}", daemon=True
        )
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, req: Request) -> None:
        """Queue a request; its tokens come back through `req.events`."""
        self._queue.put(req)

    def attach_adapter(
        self, key: str, config: Any, weights: dict[str, torch.Tensor]
    ) -> Future[None]:
        """Add LoRA adapter `key` to the base model between decode steps. It is attached even
        when the caller stops waiting; `detach_adapter` queued after it takes it off again."""
        done: Future[None] = Future()
        self._queue.put(_Control(lambda: self._attach_adapter(key, config, weights), done))
        return done

    def detach_adapter(self, key: str) -> None:
        """Remove adapter `key` between decode steps, after whatever was queued before."""
        self._queue.put(_Control(lambda: self._detach_adapter(key), Future()))

    def retire(self, variant: Variant) -> Future[None]:
        """Free `variant` once no request uses it any more (requests already submitted on it
        run to their end); the future resolves when it is gone."""
        freed: Future[None] = Future()
        queued: Future[None] = Future()
        self._queue.put(_Control(lambda: self._retiring.append((variant, freed)), queued))

        def failed(f: Future[None]) -> None:  # never queued for freeing: the engine stopped
            error = None if f.cancelled() else f.exception()
            if isinstance(error, Exception):
                _settle(freed, error=error)

        queued.add_done_callback(failed)
        return freed

    def close(self) -> None:
        """Stop the thread and fail everything still in flight or queued with EngineUnavailable.
        Blocks until the thread is gone: call it off the event loop."""
        self._queue.put(_STOP)
        if self._thread is not None:
            self._thread.join()
        self._fail_queued()  # anything queued after the scheduler's last look
        self._peft = None

    # ---- scheduler thread

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                busy = bool(self._groups or self._waiting or self._reading)
                if not self._take(block=not busy):
                    self._shutdown()
                    return
                try:
                    started = time.perf_counter()
                    self._round_rows = self._round_tokens = 0
                    self._round_unpaced = False
                    # Only a round that began with rows decoding read its prompts among them.
                    pacer = self._pacer if self._decoding() else None
                    for group in self._groups.values():
                        self._drop_cancelled(group)
                    self._plan(self._admit())
                    stepped = self._read_prompts()
                    # Round-robin over the groups: one forward pass each per round (a group
                    # that decoded fused with a prompt's chunk has had its pass).
                    for group in list(self._groups.values()):
                        if group.rows and group not in stepped:
                            self._decode(group)
                    self._groups = {w: g for w, g in self._groups.items() if g.rows}
                    if pacer is not None and not self._round_unpaced:
                        pacer.observe(
                            self._round_rows, self._round_tokens, time.perf_counter() - started
                        )
                except Exception as exc:  # a bug of ours, not the model's: keep serving
                    log.exception("embedded engine scheduler error")
                    for r in self._in_flight():
                        self._fail(r, EngineError(_failed("the embedded engine failed", exc)))
                    self._groups, self._reading = {}, deque()
                self._retire()

    def _take(self, *, block: bool) -> bool:
        """Move queued requests to the waiting line and run queued control messages; block
        only when there is nothing else to do. False when the engine is stopping."""
        while True:
            try:
                item = self._queue.get(block=block)
            except queue.Empty:
                return True
            block = False
            if item is _STOP:
                return False
            if isinstance(item, _Control):
                self._control(item)
            else:
                self._waiting.append(item)

    def _control(self, item: _Control) -> None:
        # Runs even when its caller was cancelled meanwhile: an unload must still retire, and
        # a cancelled load queued its own undoing behind it.
        try:
            result = item.run()
        except Exception as exc:
            _settle(item.done, error=exc)
        else:
            _settle(item.done, result)
        self._retire()  # an unload of something idle completes at once

    def _in_flight(self) -> list[Request]:
        """Admitted requests not done: rows of the running batches and prompts being read."""
        return [r for g in self._groups.values() for r in g.rows] + [
            r for unit in self._reading for r in unit.rows
        ]

    def _admit(self) -> list[Request]:
        """Take waiting requests while there is room in the batch."""
        room = self.max_batch_size - len(self._in_flight())
        new: list[Request] = []
        while self._waiting and len(new) < room:
            r = self._waiting.popleft()
            if r.cancelled:
                self._drop(r)
            else:
                new.append(r)
        return new

    def _plan(self, new: list[Request]) -> None:
        """Queue newly admitted requests for reading, in groups read in one pass each: rows of
        one weights (and, for a prefix cache hit, of one cached opening), in arrival order; while
        rows are decoding, as many as fit one chunk padded to their longest prompt, so that a
        long prompt is read on its own and short ones behind it do not wait for its last chunk."""
        now = time.monotonic()
        for r in new:
            r.admitted = now
        self.stats.requests += len(new)
        self.stats.active += len(new)
        budget = self.prefill_chunk_tokens if self._decoding() else 0
        by_kind: dict[tuple[Any, ...], tuple[Hit | None, list[Request]]] = {}
        for r in new:
            hit = self._prefixes.lookup(r.variant.key, r.prompt_ids) if self._prefixes else None
            if hit is None:
                kind: tuple[Any, ...] = (id(r.variant.weights),)
            else:
                self.stats.prefix_hits += 1
                self.stats.prefix_tokens += hit.tokens
                kind = (r.variant.key, hit.entry_id, hit.tokens)
            by_kind.setdefault(kind, (hit, []))[1].append(r)
        for hit, rows in by_kind.values():
            weights = rows[0].variant.weights
            skip = hit.tokens if hit is not None else 0
            unit: list[Request] = []
            for r in rows:
                longest = max([len(r.prompt_ids), *(len(u.prompt_ids) for u in unit)]) - skip
                if unit and budget and longest * (len(unit) + 1) > budget:
                    self._reading.append(_Reading(weights, unit, self._pad_id, hit))
                    unit = []
                unit.append(r)
            self._reading.append(_Reading(weights, unit, self._pad_id, hit))

    def _decoding(self) -> bool:
        """Whether any row is decoding: a prompt read whole would stall it."""
        return any(g.rows for g in self._groups.values())

    def _budget(self) -> int | None:
        """The most prompt tokens (padding included) to read this round; None: no limit."""
        rows = sum(len(g.rows) for g in self._groups.values())
        if not rows:
            return None
        if self._pacer is not None:
            return self._pacer.budget(rows)
        return self.prefill_chunk_tokens or None

    def _read_prompts(self) -> set[_Group]:
        """Read queued prompts, oldest first, up to the round's budget of tokens (some, unless
        the pacer has no room for a long prompt and it may wait); those read to the end sample
        their first token and join their group.
        Returns the groups that decoded this round too (fused with a chunk)."""
        budget = self._budget()
        progressed = False
        stepped: set[_Group] = set()
        while self._reading:
            if budget is None and progressed:
                # Prompts read whole joined the batch: the rest must not stall their rows.
                budget = self._budget()
            unit = self._next_unit()
            if all(r.cancelled for r in unit.rows):
                for r in unit.rows:
                    self._drop(r)
                self._reading.remove(unit)
                continue
            columns = unit.prefill.remaining
            if self._one_chunk(unit):
                # Paced, a prompt that fits one chunk is read at once, as without a pacer,
                # and outside the round's budget: that is for the longer ones. Its round
                # says nothing about what paced chunks cost, and the pacer leaves it out.
                progressed = self._round_unpaced = True
                self._read(unit, columns, stepped)
                continue
            if budget is not None:
                columns = min(columns, budget // len(unit.prefill))
                if columns < 1:
                    if progressed or self._waits(unit, budget):
                        return stepped
                    columns = 1
                budget -= columns * len(unit.prefill)
            progressed = True
            if not self._read(unit, columns, stepped):
                return stepped  # the budget is spent: this unit goes on next round
        return stepped

    def _waits(self, unit: _Reading, budget: int) -> bool:
        """Whether `unit` is left unread this round: the pacer has no room for even one token
        (`budget` 0) and it has not waited `itl_max_wait_s` for room yet."""
        if budget > 0:
            return False
        now = time.monotonic()
        if unit.waiting_since is None:
            unit.waiting_since = now
        return now - unit.waiting_since < self.itl_max_wait_s

    def _one_chunk(self, unit: _Reading) -> bool:
        """Whether `unit`, being paced, is read at once: it fits one chunk (all of it, not
        just what is left of it, so that a long prompt's last chunk is paced too)."""
        # The mask covers every column of every row: all the unit reads, padding included.
        return self._pacer is not None and unit.prefill.mask.numel() <= self.prefill_chunk_tokens

    def _next_unit(self) -> _Reading:
        """The unit to read next: the oldest, except that while pacing, prompts that fit one
        chunk go first (one round each) rather than wait out a long prompt's many paced ones."""
        return next((u for u in self._reading if self._one_chunk(u)), self._reading[0])

    def _read(self, unit: _Reading, columns: int, stepped: set[_Group]) -> bool:
        """One prefill pass over the next `columns` columns of `unit` — fused with the decode
        step of the group it will join when that group is decoding, has not decoded this
        round (`stepped`) and reads with the same LoRA setting; True once the unit has left
        the reading line (read to the end and joined its group, or failed)."""
        rows = unit.rows
        reading = unit.prefill
        start = reading.read
        group = self._groups.get(unit.weights)
        if self.fuse_prefill and group is not None and group.rows and group not in stepped:
            model, extra = self._forward(unit.weights, group.rows + rows)
            if not extra:  # one LoRA setting for all: one plain forward pass
                stepped.add(group)
                return self._read_fused(unit, columns, group, model)
        try:
            model, extra = self._forward(unit.weights, rows)
            logits = reading.step(model, columns, **extra)
            self.stats.prefills += 1
            self.stats.prompt_tokens += int(reading.mask[:, start : reading.read].sum())
            self.stats.max_batch = max(self.stats.max_batch, len(rows))
            self._round_tokens += (reading.read - start) * len(rows)
            keep = None if logits is None else self._advance(rows, logits)
        except Exception as exc:
            log.exception("embedded engine: prefill of %d requests failed", len(rows))
            for r in rows:
                self._fail(
                    r, EngineError(_failed("the model failed while reading the prompt", exc))
                )
            self._reading.remove(unit)
            return True
        return self._joined(unit, keep)

    def _read_fused(
        self, unit: _Reading, columns: int, group: _Group, model: torch.nn.Module
    ) -> bool:
        """`_read` and `_decode(group)` in one forward pass (`reef.engines.fused`)."""
        reading = unit.prefill
        start = reading.read
        batch = group.batch
        assert batch is not None
        try:
            decoded, read = fused.step(
                model, batch, [r.last_token for r in group.rows], reading, columns
            )
            self.stats.steps += 1
            self.stats.prefills += 1
            self.stats.fused += 1
            self.stats.prompt_tokens += int(reading.mask[:, start : reading.read].sum())
            self._round_rows += len(group.rows)
            self._round_tokens += (reading.read - start) * len(unit.rows)
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
                self._fail(r, EngineError(_failed("the model failed while generating", exc)))
            group.batch, group.rows = None, []
            self._reading.remove(unit)
            return True
        return self._joined(unit, keep)

    def _joined(self, unit: _Reading, keep: list[int] | None) -> bool:
        """After a pass over `unit`: once read to the end (`keep`: its rows still running)
        its rows join their group; True when it has left the reading line."""
        rows, reading = unit.rows, unit.prefill
        if keep is None:
            return False
        self._reading.remove(unit)
        batch = reading.batch
        assert batch is not None
        if self._prefixes is not None:
            self._remember(rows, batch)
        if len(keep) < len(rows):
            batch = batch.select(keep)
            if batch is None:
                return True
        group = self._groups.setdefault(unit.weights, _Group(unit.weights))
        group.batch = batch if group.batch is None else group.batch.merge(batch)
        group.rows = group.rows + [rows[i] for i in keep]
        return True

    def _remember(self, rows: list[Request], batch: Batch) -> None:
        """Give the prefix cache each freshly read prompt's keys and values."""
        assert self._prefixes is not None
        for i, r in enumerate(rows):
            if not self._prefixes.wants(r.variant.key, r.prompt_ids):
                continue
            columns = batch.mask[i].nonzero().squeeze(1)  # the row's tokens, not its padding
            layers = [
                (k[i : i + 1].index_select(2, columns), v[i : i + 1].index_select(2, columns))
                for k, v, *_ in batch.cache
            ]
            self._prefixes.store(r.variant.key, r.prompt_ids, layers)

    def _drop_cancelled(self, group: _Group) -> None:
        keep = [i for i, r in enumerate(group.rows) if not r.cancelled]
        if len(keep) == len(group.rows) or group.batch is None:
            return
        for r in group.rows:
            if r.cancelled:
                self._drop(r)
        group.batch, group.rows = group.batch.select(keep), [group.rows[i] for i in keep]

    def _forward(
        self, weights: torch.nn.Module, rows: list[Request]
    ) -> tuple[torch.nn.Module, dict[str, Any]]:
        """What to call for a forward pass over `rows`, and the extra arguments it takes.

        With adapters loaded the base model's layers carry LoRA weights. Rows of several kinds
        (adapters, or adapters and plain base rows) go through the PEFT wrapper, which applies
        each row's own adapter; PEFT then hooks every LoRA layer for that one pass, which costs
        a few milliseconds, so a pass whose rows are all of one kind instead sets the layers
        for that kind (only when it changes) and calls the model as it is.
        """
        if weights is not self._model or self._peft is None:
            return weights, {}
        names = [r.variant.adapter or BASE_ADAPTER for r in rows]
        if len(set(names)) == 1:
            self._lora_layers(names[0])
            return weights, {}
        self._lora_layers(_MIXED)
        return self._peft, {"adapter_names": names}

    def _lora_layers(self, mode: str) -> None:
        """Set what the LoRA layers apply: nothing (BASE_ADAPTER), one adapter, or per row."""
        if mode == self._lora_mode:
            return
        tuner = self._peft.base_model
        if mode == BASE_ADAPTER:
            tuner.disable_adapter_layers()
        else:
            tuner.enable_adapter_layers()
            if mode != _MIXED:
                self._peft.set_adapter(mode, inference_mode=True)
        self._lora_mode = mode

    def _decode(self, group: _Group) -> None:
        rows, batch = group.rows, group.batch
        assert batch is not None
        try:
            model, extra = self._forward(group.weights, rows)
            logits = batch.step(model, [r.last_token for r in rows], **extra)
            self.stats.steps += 1
            self._round_rows += len(rows)
            self.stats.max_batch = max(self.stats.max_batch, len(rows))
            keep = self._advance(rows, logits)
        except Exception as exc:
            # The cache may be half-updated: every row of this step fails, the thread goes on.
            log.exception("embedded engine: decode step over %d rows failed", len(rows))
            for r in rows:
                self._fail(r, EngineError(_failed("the model failed while generating", exc)))
            group.batch, group.rows = None, []
            return
        self._stepped(group, keep)

    def _stepped(self, group: _Group, keep: list[int]) -> None:
        """After a decode step of `group`: only the rows at `keep` go on."""
        if len(keep) < len(group.rows):
            assert group.batch is not None
            group.batch = group.batch.select(keep)
            group.rows = [group.rows[i] for i in keep]

    def _advance(self, rows: list[Request], logits: torch.Tensor) -> list[int]:
        """Sample each row's next token, send it, and return the indices of rows still running."""
        picks = sample_rows(logits, [r.params for r in rows], [r.generator for r in rows])
        now = time.monotonic()
        keep = []
        events: list[tuple[Request, TokenEvent]] = []
        for i, (r, pick) in enumerate(zip(rows, picks, strict=True)):
            if r.cancelled:
                self._drop(r)
                continue
            if r.check_finite and not bool(torch.isfinite(logits[i]).all()):
                self._fail(r, EngineError(f"model '{r.variant.name}' produced non-finite logits"))
                continue
            r.generated += 1
            r.last_token = pick.token_id
            r.first_token = r.first_token or now
            self.stats.tokens_generated += 1
            eos = pick.token_id in self._eos_ids
            text = "" if eos else r.detok.add(pick.token_id)
            finish = None
            if r.detok.stopped or eos:
                finish = "stop"
            elif r.generated >= (r.params.max_tokens or 0):
                finish = "length"
            if finish is not None and not r.detok.stopped:
                text += r.detok.finish()
            entry = self._logprob_entry(pick) if r.params.logprobs else None
            if finish is None:
                keep.append(i)
            else:
                self._leave(r)
                self.stats.finished += 1
            events.append(
                (r, TokenEvent(text, pick.token_id, pick.logprob, entry, finish, pick.capture))
            )
        _post_all(events)
        return keep

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

    def _leave(self, r: Request) -> None:
        """Mark a request done; counted out of `active` before its last event is posted."""
        r.done, r.finished = True, time.monotonic()
        if r.admitted is not None:
            self.stats.active -= 1

    def _drop(self, r: Request) -> None:
        """A cancelled request leaves: nobody reads its events any more."""
        self._leave(r)
        self.stats.cancelled += 1

    def _fail(self, r: Request, exc: ReefError) -> None:
        if r.done:
            return
        self._leave(r)
        self.stats.failed += 1
        r.post(exc)

    def _shutdown(self) -> None:
        for r in self._in_flight() + list(self._waiting):
            self._fail(r, EngineUnavailable("the embedded engine is shutting down"))
        self._groups, self._waiting, self._reading = {}, deque(), deque()
        for _, freed in self._retiring:
            _settle(freed, error=EngineUnavailable("the embedded engine is shutting down"))
        self._retiring = []
        self._fail_queued()

    def _fail_queued(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Control):
                _settle(item.done, error=EngineUnavailable("the embedded engine is shutting down"))
            elif item is not _STOP:
                self._fail(item, EngineUnavailable("the embedded engine is shutting down"))

    # ---- variants (scheduler thread, between decode steps)

    def _attach_adapter(self, key: str, config: Any, weights: dict[str, torch.Tensor]) -> None:
        """Add a LoRA adapter to the base model under `key`; on failure leave it as it was."""
        from peft import PeftModel, set_peft_model_state_dict

        self._lora_mode = None  # adding an adapter may change which one is active
        try:
            if self._peft is None:
                with warnings.catch_warnings():
                    # PEFT reads transformers' deprecated `is_gradient_checkpointing`.
                    warnings.simplefilter("ignore", FutureWarning)
                    self._peft = PeftModel(self._model, config, adapter_name=key)
            else:
                self._peft.add_adapter(key, config)
            loaded: Any = set_peft_model_state_dict(self._peft, weights, adapter_name=key)
            missing = [k for k in loaded.missing_keys if f".{key}." in k]
            if loaded.unexpected_keys or missing:
                raise ValueError(
                    f"tensors it lacks: {missing[:3]}, tensors the model has no place for: "
                    f"{loaded.unexpected_keys[:3]}"
                )
            self._peft.eval()  # new LoRA layers start in training mode (dropout)
        except Exception as exc:
            self._detach_adapter(key)
            raise BadRequest(
                f"the adapter does not fit the base model {self.model_id}: {exc}",
                code="invalid_adapter",
                param="path",
            ) from exc

    def _detach_adapter(self, key: str) -> None:
        """Remove adapter `key`; with the last one gone the base model is plain again."""
        from peft.tuners.tuners_utils import BaseTunerLayer

        peft = self._peft
        self._lora_mode = None
        others = [k for k in peft.peft_config if k != key] if peft is not None else []
        if not others:
            if peft is not None:
                peft.unload()  # puts the base layers back in place of the LoRA ones
            else:  # PeftModel() failed halfway: some layers may be wrapped already
                for name, module in list(self._model.named_modules()):
                    if isinstance(module, BaseTunerLayer):
                        parent, _, child = name.rpartition(".")
                        setattr(self._model.get_submodule(parent), child, module.get_base_layer())
            self._peft = None
            return
        if key in peft.active_adapters:  # PEFT would warn and pick another
            peft.set_adapter(others[0], inference_mode=True)
        if key in peft.peft_config:
            peft.delete_adapter(key)
        for module in peft.modules():  # a failed add_adapter may have wrapped some layers
            if isinstance(module, BaseTunerLayer):
                module.delete_adapter(key)

    def _retire(self) -> None:
        """Free unloaded variants no request uses any more, and tell their unload() so."""
        if not self._retiring:
            return
        busy = {id(r.variant) for r in self._in_flight()}
        busy.update(id(r.variant) for r in self._waiting)
        still = []
        for variant, freed in self._retiring:
            if id(variant) in busy:
                still.append((variant, freed))
                continue
            try:
                if self._prefixes is not None:
                    self._prefixes.forget(variant.key)
                if variant.adapter is not None:
                    self._detach_adapter(variant.adapter)
                _settle(freed)  # a checkpoint goes with the last reference to it
            except Exception as exc:
                log.exception("embedded engine: unloading %s failed", variant.name)
                _settle(freed, error=EngineError(f"unloading '{variant.name}' failed: {exc}"))
        self._retiring = still


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


def _settle(done: Future[Any], result: Any = None, error: Exception | None = None) -> None:
    """Hand a result to the event loop waiting on `done`; nobody waits when it was cancelled."""
    if not done.set_running_or_notify_cancel():
        return
    if error is None:
        done.set_result(result)
    else:
        done.set_exception(error)
