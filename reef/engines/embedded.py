"""The embedded engine: a transformers model in this process, decoding concurrent requests together.

One scheduler thread owns the model. Requests are rendered and checked on the event loop, then
queued; between decode steps the scheduler admits queued requests (prefilled together, then
merged into the running batch), drops finished and cancelled rows, and advances every row by
one token per forward pass. Each token travels back to its request's event loop at once, so
streams are real token streams. Everything a recipe needs later (exact prompt and completion
token ids, the raw log-prob of every sampled token) is captured on the way.

The engine serves several releases at once (hot deploy): LoRA adapters on the base model and
full fine-tuned checkpoints, each under its own model name. A request's variant is fixed when it
is submitted. Rows are grouped by the weights they read: the base model and all its adapters
share one batch (PEFT's mixed-adapter forward, `adapter_names`), each full checkpoint has its own
batch, and every group advances one token per scheduler round. Loading and unloading are control
messages the scheduler runs between decode steps, never during a forward pass.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import warnings
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from reef.engines.base import VERIFY_MESSAGES, VERIFY_TOKENS, Completion
from reef.engines.batch import Batch
from reef.engines.detokenize import Detokenizer, TokenText
from reef.engines.prompt import ChatRenderer
from reef.engines.response import ResponseBuilder, TokenEvent
from reef.engines.sampling import Sampled, SamplingParams, sample_rows
from reef.engines.weights import check_checkpoint, read_adapter
from reef.errors import (
    BadRequest,
    ConfigError,
    Conflict,
    EngineError,
    EngineUnavailable,
    ReefError,
    UnknownModel,
)

log = logging.getLogger(__name__)

_STOP = object()  # queued by aclose(): the scheduler fails what is left and exits
BASE_ADAPTER = "__base__"  # PEFT's adapter name for rows of a mixed batch that take no adapter
_MIXED = "__mixed__"  # LoRA layers enabled, each row's adapter named in the forward call
# verify() decodes a few greedy tokens of this prompt on a freshly loaded variant.


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
    tokens_generated: int = 0
    max_batch: int = 0  # most rows in one forward pass
    active: int = 0  # admitted and not yet done


@dataclass(eq=False)
class _Variant:
    """A model the engine answers to: the base, a LoRA adapter on it, or a full checkpoint.

    `weights` is the model whose parameters a forward pass reads: the base model for the base
    and every adapter (which then share a batch), a model of its own for a checkpoint.
    """

    name: str
    weights: torch.nn.Module
    adapter: str | None = None  # the PEFT adapter's key inside the base model


class _Request:
    """One request in flight. Fields below the line belong to the scheduler thread."""

    def __init__(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        loop: asyncio.AbstractEventLoop,
        detok: Detokenizer,
        variant: _Variant,
        *,
        check_finite: bool = False,
    ):
        self.prompt_ids = prompt_ids
        self.params = params
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
        self.rows: list[_Request] = []


class EmbeddedEngine:
    """Serves OpenAI chat completions from a local Hugging Face model directory."""

    kind = "embedded"

    def __init__(
        self,
        model_dir: Path,
        model_id: str,
        *,
        max_batch_size: int = 8,
        default_max_tokens: int = 256,
        threads: int | None = None,
    ):
        if max_batch_size < 1 or default_max_tokens < 1:
            raise ConfigError("max_batch_size and default_max_tokens must be at least 1")
        self.model_dir = Path(model_dir)
        self.model_id = model_id
        self.max_batch_size = max_batch_size
        self.default_max_tokens = default_max_tokens
        self.threads = threads
        self.stats = EngineStats()
        self.max_context = 0
        self._model: Any = None  # the base model, never wrapped: adapters go in `_peft`
        self._tokenizer: Any = None
        self._renderer: ChatRenderer | None = None
        self._token_text: TokenText | None = None
        self._eos_ids: frozenset[int] = frozenset()
        self._pad_id = 0
        self._linear_shapes: dict[str, tuple[int, int]] = {}  # base Linear -> (in, out) features
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        # ---- event loop side: what a request's `model` may name
        self._base: _Variant | None = None
        self._variants: dict[str, _Variant] = {}  # loaded variants, in load order
        self._reserved: set[str] = set()  # names being loaded
        self._adapter_keys = 0  # PEFT keys are ours ("a1", "a2"...): release names may hold dots
        # ---- scheduler thread
        self._peft: Any = None  # PeftModel around `_model` while an adapter is loaded
        self._lora_mode: str | None = None  # what its LoRA layers apply now (see _lora_layers)
        self._groups: dict[torch.nn.Module, _Group] = {}
        self._waiting: deque[_Request] = deque()  # taken off the queue, not yet admitted
        self._retiring: list[tuple[_Variant, Future[None]]] = []  # unloaded, maybe still in use

    # ---- Engine protocol (event loop side)

    def models(self) -> list[str]:
        return [self.model_id, *self._variants]

    async def start(self) -> None:
        if self._thread is not None:
            return
        if self.threads:
            torch.set_num_threads(self.threads)
        await asyncio.to_thread(self._load)
        self._thread = threading.Thread(
            target=self._run, name=f"reef-engine-{self.model_id}", daemon=True
        )
        self._thread.start()

    async def ready(self) -> bool:
        return self._model is not None and self._thread is not None and self._thread.is_alive()

    async def complete(self, body: dict[str, Any]) -> Completion:
        return await self._complete(body, self._submit(body))

    async def stream(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any] | Completion]:
        req = self._submit(body)
        builder = self._builder(body, req)
        try:
            # Wait for the first token before the role chunk, so a failure in prefill raises
            # here like it would from complete() instead of breaking an open stream.
            event = await self._next(req)
            yield builder.role_chunk()
            while True:
                builder.add(event)
                chunk = builder.content_chunk(event)
                if chunk is not None:
                    yield chunk
                if event.finish_reason:
                    break
                event = await self._next(req)
            yield builder.finish_chunk()
            usage = builder.usage_chunk()
            if usage is not None:
                yield usage
            yield builder.completion(req.timings())
        finally:
            self._release(req)

    async def aclose(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(_STOP)
            await asyncio.to_thread(thread.join)
            self._fail_queued()  # anything queued after the scheduler's last look
        self._model = self._peft = self._base = None
        self._variants.clear()

    # ---- Deployable (event loop side)

    def variants(self) -> list[str]:
        """Names of the loaded adapters and checkpoints, in load order (not the base model)."""
        return list(self._variants)

    async def load_adapter(self, name: str, path: Path) -> None:
        """Serve the PEFT LoRA adapter in directory `path` (as `save_pretrained` writes it) as
        model `name`. Conflict (adapter_exists) when the name is taken; BadRequest when the
        directory is not an adapter for this base model, and then nothing has changed."""
        self._reserve(name, "adapter_exists")
        try:
            config, weights = await asyncio.to_thread(self._read_adapter, Path(path))
            self._adapter_keys += 1
            key = f"a{self._adapter_keys}"
            try:
                await self._call(lambda: self._attach_adapter(key, config, weights))
            except asyncio.CancelledError:
                # The scheduler attaches it all the same; queued after that, this takes it off.
                self._queue.put(_Control(lambda: self._detach_adapter(key), Future()))
                raise
            assert self._model is not None
            self._variants[name] = _Variant(name, self._model, adapter=key)
        finally:
            self._reserved.discard(name)
        log.info("embedded engine: serving adapter %s from %s", name, path)

    async def load_weights(self, name: str, path: Path) -> None:
        """Serve the full checkpoint in directory `path` (a Hugging Face model directory of the
        base model's architecture) as model `name`. Conflict (model_exists) when the name is
        taken; BadRequest unless its tensor names, shapes and dtypes are the base model's.

        The checkpoint becomes a model object of its own (as much memory as the base), read and
        warmed up on a worker thread; no weights in use change, so serving goes on meanwhile.
        """
        self._reserve(name, "model_exists")
        try:
            model = await asyncio.to_thread(self._read_checkpoint, Path(path))
            self._variants[name] = _Variant(name, model)
        finally:
            self._reserved.discard(name)
        log.info("embedded engine: serving checkpoint %s from %s", name, path)

    async def unload(self, name: str) -> None:
        """Stop serving variant `name` and free it.

        The name leaves `models()` at once, so no new request can choose it; requests already
        submitted on it run to their end, and this returns once the last of them is done and
        its weights are gone.
        """
        if name == self.model_id:
            raise BadRequest(
                f"'{name}' is the base model, which cannot be unloaded", code="base_model"
            )
        variant = self._variants.pop(name, None)
        if variant is None:
            raise UnknownModel(f"no adapter or checkpoint named '{name}' is loaded")
        freed: Future[None] = Future()
        await self._call(lambda: self._retiring.append((variant, freed)))
        await asyncio.wrap_future(freed)
        log.info("embedded engine: unloaded %s", name)

    async def verify(self, name: str) -> dict[str, Any]:
        """Decode a few greedy tokens of a fixed chat prompt on model `name`, through the same
        scheduler as any request. EngineError when that fails or a logit is not finite."""
        body = {
            "model": name,
            "messages": VERIFY_MESSAGES,
            "temperature": 0,
            "max_tokens": VERIFY_TOKENS,
        }
        started = time.monotonic()
        done = await self._complete(body, self._submit(body, check_finite=True))
        tokens = len(done.completion_token_ids or [])
        if not tokens:
            raise EngineError(f"verifying '{name}': the model produced no token")
        choice = done.response["choices"][0]
        return {
            "model": name,
            "tokens": tokens,
            "seconds": round(time.monotonic() - started, 4),
            "text": choice["message"]["content"],
            "finish_reason": choice["finish_reason"],
        }

    def _reserve(self, name: str, code: str) -> None:
        if not isinstance(name, str) or not name.strip():
            raise BadRequest("a model name must be a non-empty string", param="name")
        if name == self.model_id or name in self._variants or name in self._reserved:
            raise Conflict(f"a model named '{name}' is already loaded", code=code)
        self._reserved.add(name)

    async def _call(self, run: Callable[[], Any]) -> Any:
        """Run `run` on the scheduler thread between decode steps and return its result."""
        if self._thread is None or not self._thread.is_alive():
            raise EngineUnavailable("the embedded engine is not running")
        done: Future[Any] = Future()
        self._queue.put(_Control(run, done))
        return await asyncio.wrap_future(done)

    # ---- loading (worker threads)

    def _load(self) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        started = time.monotonic()
        try:
            tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
            model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot load the model in {self.model_dir}: {exc}") from exc
        if not tokenizer.chat_template:
            raise ConfigError(f"model {self.model_dir} has no chat template")
        model.eval()
        config = model.config
        # The batch keeps one plain KV cache per layer; sliding-window or linear-attention
        # layers would need their own bookkeeping when rows join and leave.
        layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
        if layer_types != {"full_attention"}:
            raise ConfigError(
                f"the embedded engine serves full-attention models only; {self.model_dir} has "
                f"layers of types {sorted(layer_types)}"
            )
        eos = {tokenizer.eos_token_id}
        for source in (config.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
            eos.update(source if isinstance(source, list) else [source])
        self._eos_ids = frozenset(i for i in eos if i is not None)
        self._pad_id = next(
            i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0) if i is not None
        )
        self.max_context = int(getattr(config, "max_position_embeddings", 0) or 2048)
        with torch.inference_mode():  # warm-up: the first request should not pay for allocation
            Batch.prefill(model, [[self._pad_id]], self._pad_id)
        self._linear_shapes = {
            name: (m.in_features, m.out_features)
            for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear)
        }
        self._tokenizer = tokenizer
        self._renderer = ChatRenderer(tokenizer)
        self._token_text = TokenText(tokenizer)
        self._model = model
        self._base = _Variant(self.model_id, model)
        log.info(
            "embedded engine loaded %s (%s) in %.1f s: context %d, batch %d, %d threads",
            self.model_id,
            self.model_dir,
            time.monotonic() - started,
            self.max_context,
            self.max_batch_size,
            torch.get_num_threads(),
        )

    def _read_adapter(self, path: Path) -> tuple[Any, dict[str, torch.Tensor]]:
        return read_adapter(path, self._linear_shapes, self.model_id)

    def _read_checkpoint(self, path: Path) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM

        check_checkpoint(path, self.model_dir, self._model.config.model_type)
        try:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
            with torch.inference_mode():  # warm-up, as for the base model
                Batch.prefill(model, [[self._pad_id]], self._pad_id)
        except Exception as exc:
            raise BadRequest(
                f"checkpoint {path}: cannot be loaded: {exc}",
                code="invalid_checkpoint",
                param="path",
            ) from exc
        return model

    # ---- request intake

    def _submit(self, body: dict[str, Any], *, check_finite: bool = False) -> _Request:
        """Validate, render and queue; every BadRequest is raised here, before anything is queued."""
        if self._renderer is None or self._thread is None or not self._thread.is_alive():
            raise EngineUnavailable("the embedded engine is not running")
        variant = self._variant(body.get("model"))
        params = SamplingParams.from_body(body)
        prompt_ids = self._renderer.prompt_ids(body)
        room = self.max_context - len(prompt_ids)
        wanted = params.max_tokens if params.max_tokens is not None else 1
        if wanted > room:
            asked = f"{len(prompt_ids)} tokens in the messages"
            if params.max_tokens is not None:
                asked = (
                    f"{len(prompt_ids) + wanted} tokens ({len(prompt_ids)} in the messages, "
                    f"{wanted} in the completion)"
                )
            raise BadRequest(
                f"This model's maximum context length is {self.max_context} tokens. "
                f"However, you requested {asked}. Please reduce the length of the messages "
                "or the completion.",
                code="context_length_exceeded",
                param="messages",
            )
        if params.max_tokens is None:
            params = replace(params, max_tokens=min(self.default_max_tokens, room))
        detok = Detokenizer(self._tokenizer, params.stop)
        loop = asyncio.get_running_loop()
        req = _Request(prompt_ids, params, loop, detok, variant, check_finite=check_finite)
        self._queue.put(req)
        return req

    def _variant(self, name: str | None) -> _Variant:
        """The variant a request's `model` names; the base model when it names none."""
        assert self._base is not None
        if name is None or name == self.model_id:
            return self._base
        variant = self._variants.get(name)
        if variant is None:  # unloaded after the API resolved the name
            known = ", ".join(self.models())
            raise UnknownModel(
                f"The model '{name}' does not exist on this server; available: {known}",
                param="model",
            )
        return variant

    async def _complete(self, body: dict[str, Any], req: _Request) -> Completion:
        builder = self._builder(body, req)
        try:
            while True:
                event = await self._next(req)
                builder.add(event)
                if event.finish_reason:
                    return builder.completion(req.timings())
        finally:
            self._release(req)

    def _builder(self, body: dict[str, Any], req: _Request) -> ResponseBuilder:
        return ResponseBuilder(
            model=req.variant.name,
            prompt_ids=req.prompt_ids,
            logprobs=req.params.logprobs,
            return_token_ids=bool(body.get("return_token_ids")),
            include_usage=bool((body.get("stream_options") or {}).get("include_usage")),
        )

    @staticmethod
    async def _next(req: _Request) -> TokenEvent:
        item = await req.events.get()
        if isinstance(item, ReefError):
            raise item
        return item

    @staticmethod
    def _release(req: _Request) -> None:
        # Runs when the consumer stops listening for any reason (done, error, cancelled task,
        # closed generator); for an unfinished request it tells the scheduler to drop the row.
        if not req.done:
            req.cancelled = True

    # ---- scheduler thread

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                busy = bool(self._groups or self._waiting)
                if not self._take(block=not busy):
                    self._shutdown()
                    return
                new: list[_Request] = []
                try:
                    for group in self._groups.values():
                        self._drop_cancelled(group)
                    new = self._admit()
                    self._join(new)
                    # Round-robin over the groups: one forward pass each per round.
                    for group in list(self._groups.values()):
                        if group.rows:
                            self._decode(group)
                    self._groups = {w: g for w, g in self._groups.items() if g.rows}
                except Exception as exc:  # a bug of ours, not the model's: keep serving
                    log.exception("embedded engine scheduler error")
                    for r in [r for g in self._groups.values() for r in g.rows] + new:
                        self._fail(r, EngineError(f"embedded engine error: {exc}"))
                    self._groups = {}
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

    def _admit(self) -> list[_Request]:
        """Take waiting requests while there is room in the batch."""
        room = self.max_batch_size - sum(len(g.rows) for g in self._groups.values())
        new: list[_Request] = []
        while self._waiting and len(new) < room:
            r = self._waiting.popleft()
            if r.cancelled:
                self._drop(r)
            else:
                new.append(r)
        return new

    def _join(self, new: list[_Request]) -> None:
        """Prefill new requests, one forward pass per group, and merge them into their group."""
        by_weights: dict[torch.nn.Module, list[_Request]] = {}
        for r in new:
            by_weights.setdefault(r.variant.weights, []).append(r)
        for weights, rows in by_weights.items():
            joined = self._prefill(weights, rows)
            if joined is None:
                continue
            group = self._groups.setdefault(weights, _Group(weights))
            batch, kept = joined
            group.batch = batch if group.batch is None else group.batch.merge(batch)
            group.rows = group.rows + kept

    def _drop_cancelled(self, group: _Group) -> None:
        keep = [i for i, r in enumerate(group.rows) if not r.cancelled]
        if len(keep) == len(group.rows) or group.batch is None:
            return
        for r in group.rows:
            if r.cancelled:
                self._drop(r)
        group.batch, group.rows = group.batch.select(keep), [group.rows[i] for i in keep]

    def _forward(
        self, weights: torch.nn.Module, rows: list[_Request]
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

    def _prefill(
        self, weights: torch.nn.Module, new: list[_Request]
    ) -> tuple[Batch, list[_Request]] | None:
        now = time.monotonic()
        for r in new:
            r.admitted = now
        self.stats.requests += len(new)
        self.stats.active += len(new)
        try:
            model, extra = self._forward(weights, new)
            batch, logits = Batch.prefill(model, [r.prompt_ids for r in new], self._pad_id, **extra)
            self.stats.prefills += 1
            self.stats.prompt_tokens += sum(len(r.prompt_ids) for r in new)
            self.stats.max_batch = max(self.stats.max_batch, len(new))
            keep = self._advance(new, logits)
        except Exception as exc:
            log.exception("embedded engine: prefill of %d requests failed", len(new))
            for r in new:
                self._fail(r, EngineError(f"the model failed while reading the prompt: {exc}"))
            return None
        if len(keep) < len(new):
            selected = batch.select(keep)
            if selected is None:
                return None
            batch = selected
        return batch, [new[i] for i in keep]

    def _decode(self, group: _Group) -> None:
        rows, batch = group.rows, group.batch
        assert batch is not None
        try:
            model, extra = self._forward(group.weights, rows)
            logits = batch.step(model, [r.last_token for r in rows], **extra)
            self.stats.steps += 1
            self.stats.max_batch = max(self.stats.max_batch, len(rows))
            keep = self._advance(rows, logits)
        except Exception as exc:
            # The cache may be half-updated: every row of this step fails, the thread goes on.
            log.exception("embedded engine: decode step over %d rows failed", len(rows))
            for r in rows:
                self._fail(r, EngineError(f"the model failed while generating: {exc}"))
            group.batch, group.rows = None, []
            return
        if len(keep) < len(rows):
            group.batch, group.rows = batch.select(keep), [rows[i] for i in keep]

    def _advance(self, rows: list[_Request], logits: torch.Tensor) -> list[int]:
        """Sample each row's next token, send it, and return the indices of rows still running."""
        picks = sample_rows(logits, [r.params for r in rows], [r.generator for r in rows])
        now = time.monotonic()
        keep = []
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
            r.post(TokenEvent(text, pick.token_id, pick.logprob, entry, finish))
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

    def _leave(self, r: _Request) -> None:
        """Mark a request done; counted out of `active` before its last event is posted."""
        r.done, r.finished = True, time.monotonic()
        if r.admitted is not None:
            self.stats.active -= 1

    def _drop(self, r: _Request) -> None:
        """A cancelled request leaves: nobody reads its events any more."""
        self._leave(r)
        self.stats.cancelled += 1

    def _fail(self, r: _Request, exc: ReefError) -> None:
        if r.done:
            return
        self._leave(r)
        self.stats.failed += 1
        r.post(exc)

    def _shutdown(self) -> None:
        for r in [r for g in self._groups.values() for r in g.rows] + list(self._waiting):
            self._fail(r, EngineUnavailable("the embedded engine is shutting down"))
        self._groups, self._waiting = {}, deque()
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
        busy = {id(r.variant) for g in self._groups.values() for r in g.rows}
        busy.update(id(r.variant) for r in self._waiting)
        still = []
        for variant, freed in self._retiring:
            if id(variant) in busy:
                still.append((variant, freed))
                continue
            try:
                if variant.adapter is not None:
                    self._detach_adapter(variant.adapter)
                _settle(freed)  # a checkpoint goes with the last reference to it
            except Exception as exc:
                log.exception("embedded engine: unloading %s failed", variant.name)
                _settle(freed, error=EngineError(f"unloading '{variant.name}' failed: {exc}"))
        self._retiring = still


def _settle(done: Future[Any], result: Any = None, error: Exception | None = None) -> None:
    """Hand a result to the event loop waiting on `done`; nobody waits when it was cancelled."""
    if not done.set_running_or_notify_cancel():
        return
    if error is None:
        done.set_result(result)
    else:
        done.set_exception(error)
