"""The embedded engine: a transformers model in this process, decoding concurrent requests together.

One scheduler thread owns the model. Requests are rendered and checked on the event loop, then
queued; between decode steps the scheduler admits queued requests (prefilled together, then
merged into the running batch), drops finished and cancelled rows, and advances every row by
one token per forward pass. Each token travels back to its request's event loop at once, so
streams are real token streams. Everything a recipe needs later (exact prompt and completion
token ids, the raw log-prob of every sampled token) is captured on the way.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from reef.engines.base import Completion
from reef.engines.batch import Batch
from reef.engines.detokenize import Detokenizer, TokenText
from reef.engines.prompt import ChatRenderer
from reef.engines.response import ResponseBuilder, TokenEvent
from reef.engines.sampling import Sampled, SamplingParams, sample_rows
from reef.errors import BadRequest, ConfigError, EngineError, EngineUnavailable, ReefError

log = logging.getLogger(__name__)

_STOP = object()  # queued by aclose(): the scheduler fails what is left and exits


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


class _Request:
    """One request in flight. Fields below the line belong to the scheduler thread."""

    def __init__(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        loop: asyncio.AbstractEventLoop,
        detok: Detokenizer,
    ):
        self.prompt_ids = prompt_ids
        self.params = params
        self.loop = loop
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
        self._model: Any = None
        self._tokenizer: Any = None
        self._renderer: ChatRenderer | None = None
        self._token_text: TokenText | None = None
        self._eos_ids: frozenset[int] = frozenset()
        self._pad_id = 0
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    # ---- Engine protocol (event loop side)

    def models(self) -> list[str]:
        return [self.model_id]

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
        req = self._submit(body)
        builder = self._builder(body, req)
        try:
            while True:
                event = await self._next(req)
                builder.add(event)
                if event.finish_reason:
                    return builder.completion(req.timings())
        finally:
            self._release(req)

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
        self._model = None

    # ---- request intake

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
        self._tokenizer = tokenizer
        self._renderer = ChatRenderer(tokenizer)
        self._token_text = TokenText(tokenizer)
        self._model = model
        log.info(
            "embedded engine loaded %s (%s) in %.1f s: context %d, batch %d, %d threads",
            self.model_id,
            self.model_dir,
            time.monotonic() - started,
            self.max_context,
            self.max_batch_size,
            torch.get_num_threads(),
        )

    def _submit(self, body: dict[str, Any]) -> _Request:
        """Validate, render and queue; every BadRequest is raised here, before anything is queued."""
        if self._renderer is None or self._thread is None or not self._thread.is_alive():
            raise EngineUnavailable("the embedded engine is not running")
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
        req = _Request(prompt_ids, params, asyncio.get_running_loop(), detok)
        self._queue.put(req)
        return req

    def _builder(self, body: dict[str, Any], req: _Request) -> ResponseBuilder:
        return ResponseBuilder(
            model=self.model_id,
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
            batch: Batch | None = None
            rows: list[_Request] = []
            while True:
                new, stopping = self._admit(block=not rows, room=self.max_batch_size - len(rows))
                if stopping:
                    self._shutdown(rows + new)
                    return
                try:
                    batch, rows = self._drop_cancelled(batch, rows)
                    if new:
                        joined = self._prefill(new)
                        if joined is not None:
                            batch = joined[0] if batch is None else batch.merge(joined[0])
                            rows = rows + joined[1]
                    if rows and batch is not None:
                        batch, rows = self._decode(batch, rows)
                except Exception as exc:  # a bug of ours, not the model's: keep serving
                    log.exception("embedded engine scheduler error")
                    for r in rows + new:
                        self._fail(r, EngineError(f"embedded engine error: {exc}"))
                    batch, rows = None, []

    def _admit(self, *, block: bool, room: int) -> tuple[list[_Request], bool]:
        """Take queued requests while there is room; block only when nothing is running."""
        new: list[_Request] = []
        while len(new) < room:
            try:
                item = self._queue.get(block=block and not new)
            except queue.Empty:
                break
            if item is _STOP:
                return new, True
            if item.cancelled:
                self._drop(item)
                continue
            new.append(item)
        return new, False

    def _drop_cancelled(
        self, batch: Batch | None, rows: list[_Request]
    ) -> tuple[Batch | None, list[_Request]]:
        keep = [i for i, r in enumerate(rows) if not r.cancelled]
        if len(keep) == len(rows) or batch is None:
            return batch, rows
        for r in rows:
            if r.cancelled:
                self._drop(r)
        return batch.select(keep), [rows[i] for i in keep]

    def _prefill(self, new: list[_Request]) -> tuple[Batch, list[_Request]] | None:
        now = time.monotonic()
        for r in new:
            r.admitted = now
        self.stats.requests += len(new)
        self.stats.active += len(new)
        try:
            batch, logits = Batch.prefill(self._model, [r.prompt_ids for r in new], self._pad_id)
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

    def _decode(self, batch: Batch, rows: list[_Request]) -> tuple[Batch | None, list[_Request]]:
        try:
            logits = batch.step(self._model, [r.last_token for r in rows])
            self.stats.steps += 1
            self.stats.max_batch = max(self.stats.max_batch, len(rows))
            keep = self._advance(rows, logits)
        except Exception as exc:
            # The cache may be half-updated: every row of this step fails, the thread goes on.
            log.exception("embedded engine: decode step over %d rows failed", len(rows))
            for r in rows:
                self._fail(r, EngineError(f"the model failed while generating: {exc}"))
            return None, []
        if len(keep) == len(rows):
            return batch, rows
        return batch.select(keep), [rows[i] for i in keep]

    def _advance(self, rows: list[_Request], logits: torch.Tensor) -> list[int]:
        """Sample each row's next token, send it, and return the indices of rows still running."""
        picks = sample_rows(logits, [r.params for r in rows], [r.generator for r in rows])
        now = time.monotonic()
        keep = []
        for i, (r, pick) in enumerate(zip(rows, picks, strict=True)):
            if r.cancelled:
                self._drop(r)
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

    def _shutdown(self, rows: list[_Request]) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                rows.append(item)
        for r in rows:
            self._fail(r, EngineUnavailable("the embedded engine is shutting down"))
