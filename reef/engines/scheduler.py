"""The embedded engine's scheduler: one thread that owns the model and decodes every request.

Which thread owns what:

- The event loop (`EmbeddedEngine`) builds each `Request` and hands it over with `submit`; from
  then on it only reads the request's `events` and sets `cancelled` when its consumer goes away.
  It asks for variant changes with `attach_adapter`, `detach_adapter` and `retire`, and awaits
  the `concurrent.futures.Future` they return.
- The scheduler thread (`Scheduler._run`) owns everything else: the waiting line, the rows in
  flight with their batches and KV caches (`reef.engines.runner`), the PEFT wrapper around the
  base model and the mode of its LoRA layers, the variants waiting to be freed
  (`reef.engines.variants`), a request's fields below its line, and the `EngineStats` counters
  (others only read them). Every forward pass runs on it, and so does every change to the base
  model's layers, only between rounds.
- They meet at one thread-safe queue (requests and control messages in); tokens go back through
  each request's own event loop (`call_soon_threadsafe`), control results through the futures.
  After the thread has stopped, `close` (on whichever thread calls it) fails what is left.

A round, between two looks at the queue: admit waiting requests while the batch has room and
put their prompts on the reading line (prompts that open with tokens read before, a scenario's
system prompt and harness text, start from the keys and values the prefix cache kept of them,
`reef.engines.prefixes`); then

1. plan: `reef.engines.planner` decides, from lengths and counts alone, which prompts the round
   reads and how much of each (chunked prefill, `prefill_chunk_tokens`; or paced to an
   inter-token latency target, `reef.engines.pacing`), which reads ride a decode step in the
   same forward pass (`reef.engines.fused`), and which groups decode on their own;
2. execute and advance: the runner carries the plan out pass by pass, sampling and sending each
   row's token as its pass ends, prompts read to their end joining their group's batch,
   finished and cancelled rows leaving; where a pass does not go as the plan assumed (a failure,
   a request that finished on its first token), the rest of the round is planned again;
3. observe: the round's time, rows and prompt tokens go to the pacer.

Rows are grouped by the weights they read: the base model and all its adapters share one batch
(PEFT's mixed-adapter forward, `adapter_names`), each full checkpoint has its own batch, and
every group advances one token per round.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from reef.engines import planner
from reef.engines.detokenize import TokenText
from reef.engines.pacing import Pacer
from reef.engines.planner import Policy, Progress
from reef.engines.prefixes import Hit, PrefixCache
from reef.engines.runner import EngineStats, Request, Runner, Tally, failed
from reef.engines.variants import BASE_ADAPTER, Variant, Variants, settle
from reef.errors import EngineError, EngineUnavailable

__all__ = ["BASE_ADAPTER", "EngineStats", "Request", "Scheduler", "Variant"]

log = logging.getLogger(__name__)

_STOP = object()  # queued by close(): the scheduler fails what is left and exits


@dataclass(frozen=True)
class _Control:
    """Work for the scheduler thread between decode steps; `done` carries its result back."""

    run: Callable[[], Any]
    done: Future[Any]


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
        self.stats = stats  # written by the scheduler thread only
        self._policy = Policy(prefill_chunk_tokens, fuse_prefill, itl_max_wait_s)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        # ---- scheduler thread
        self._variants = Variants(model, model_id)
        self._prefixes = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes else None
        self._runner = Runner(
            self._variants,
            stats,
            eos_ids=eos_ids,
            pad_id=pad_id,
            token_text=token_text,
            prefixes=self._prefixes,
        )
        self._waiting: deque[Request] = deque()  # taken off the queue, not yet admitted
        self._pacer = (
            Pacer(itl_target_s, prefill_chunk_tokens, headroom=itl_headroom)
            if itl_target_s or itl_headroom
            else None
        )

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
        self._queue.put(_Control(lambda: self._variants.attach(key, config, weights), done))
        return done

    def detach_adapter(self, key: str) -> None:
        """Remove adapter `key` between decode steps, after whatever was queued before."""
        self._queue.put(_Control(lambda: self._variants.detach(key), Future()))

    def retire(self, variant: Variant) -> Future[None]:
        """Free `variant` once no request uses it any more (requests already submitted on it
        run to their end); the future resolves when it is gone."""
        freed: Future[None] = Future()
        queued: Future[None] = Future()
        self._queue.put(_Control(lambda: self._variants.retiring.append((variant, freed)), queued))

        def failed(f: Future[None]) -> None:  # never queued for freeing: the engine stopped
            error = None if f.cancelled() else f.exception()
            if isinstance(error, Exception):
                settle(freed, error=error)

        queued.add_done_callback(failed)
        return freed

    def close(self) -> None:
        """Stop the thread and fail everything still in flight or queued with EngineUnavailable.
        Blocks until the thread is gone: call it off the event loop."""
        self._queue.put(_STOP)
        if self._thread is not None:
            self._thread.join()
        self._fail_queued()  # anything queued after the scheduler's last look

    # ---- scheduler thread

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                busy = bool(self._runner.groups or self._waiting or self._runner.reading)
                if not self._take(block=not busy):
                    self._shutdown()
                    return
                try:
                    self._round()
                except Exception as exc:  # a bug of ours, not the model's: keep serving
                    log.exception("embedded engine scheduler error")
                    for r in self._runner.in_flight():
                        self._runner.fail(r, EngineError(failed("the embedded engine failed", exc)))
                    self._runner.clear()
                self._retire()

    def _round(self) -> None:
        """One round: admit, plan, carry the plan out (each pass advancing its rows), observe."""
        started = time.perf_counter()
        # Only a round that began with rows decoding read its prompts among them.
        pacer = self._pacer if self._runner.decoding() else None
        self._runner.drop_cancelled()
        self._queue_reads(self._admit())
        pace = self._pacer.budget if self._pacer is not None else None
        tally = Tally()
        progress: Progress | None = None
        while True:
            now = time.monotonic()
            groups, units = self._runner.view()
            plan = planner.plan(groups, units, self._policy, pace=pace, now=now, progress=progress)
            progress = self._runner.read(plan, now, tally)
            if progress is None:
                break
        self._runner.decode(plan, tally)
        self._runner.tidy()
        if pacer is not None and not tally.unpaced:
            pacer.observe(tally.rows, tally.tokens, time.perf_counter() - started)

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
            settle(item.done, error=exc)
        else:
            settle(item.done, result)
        self._retire()  # an unload of something idle completes at once

    def _admit(self) -> list[Request]:
        """Take waiting requests while there is room in the batch."""
        room = self.max_batch_size - len(self._runner.in_flight())
        new: list[Request] = []
        while self._waiting and len(new) < room:
            r = self._waiting.popleft()
            if r.cancelled:
                self._runner.drop(r)
            else:
                new.append(r)
        return new

    def _queue_reads(self, new: list[Request]) -> None:
        """Queue newly admitted requests for reading, in units read in one pass each: rows of
        one weights (and, for a prefix cache hit, of one cached opening), in arrival order,
        split as `planner.split` says."""
        now = time.monotonic()
        for r in new:
            r.admitted = now
        self.stats.requests += len(new)
        self.stats.active += len(new)
        chunk = self.prefill_chunk_tokens if self._runner.decoding() else 0
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
            skip = hit.tokens if hit is not None else 0
            for unit in planner.split([len(r.prompt_ids) for r in rows], skip, chunk):
                self._runner.queue(rows[0].variant.weights, [rows[i] for i in unit], hit)

    def _retire(self) -> None:
        """Free unloaded variants no request uses any more, and tell their unload() so."""
        if not self._variants.retiring:
            return
        busy = {id(r.variant) for r in self._runner.in_flight()}
        busy.update(id(r.variant) for r in self._waiting)
        self._variants.retire(busy, self._prefixes)

    def _shutdown(self) -> None:
        for r in self._runner.in_flight() + list(self._waiting):
            self._runner.fail(r, EngineUnavailable("the embedded engine is shutting down"))
        self._runner.clear()
        self._waiting = deque()
        self._variants.close(EngineUnavailable("the embedded engine is shutting down"))
        self._fail_queued()

    def _fail_queued(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Control):
                settle(item.done, error=EngineUnavailable("the embedded engine is shutting down"))
            elif item is not _STOP:
                self._runner.fail(item, EngineUnavailable("the embedded engine is shutting down"))
