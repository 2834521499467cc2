"""The embedded engine: a transformers model in this process, decoding concurrent requests together.

Requests are rendered and checked on the event loop, then handed to the scheduler thread
(`reef.engines.scheduler`), which owns the model from then on: it batches them, runs prefill and
decode, and sends each token back to its request's event loop at once, so streams are real token
streams. Everything a recipe needs later (exact prompt and completion token ids, the raw log-prob
of every sampled token) is captured on the way.

The engine serves several releases at once (hot deploy): LoRA adapters on the base model and
full fine-tuned checkpoints, each under its own model name. A request's variant is fixed when it
is submitted. Loading and unloading are control messages the scheduler runs between decode
steps, never during a forward pass.

Which thread owns what here: the event loop owns the names a request may choose (`_variants`,
`_reserved`, `_base`) and the scheduler handle; worker threads (`asyncio.to_thread`) load the
base model once before the scheduler starts, then read adapters and checkpoints from disk; the
tokenizer, renderer and base model's shapes are set while loading and only read afterwards. The
base model's layers change only on the scheduler thread (see `reef.engines.scheduler`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from reef.engines import fused, tool_calls
from reef.engines.base import VERIFY_MESSAGES, VERIFY_TOKENS, Completion
from reef.engines.batch import Batch
from reef.engines.defaults import generation_defaults, sampling_record, with_defaults
from reef.engines.detokenize import Detokenizer, TokenText
from reef.engines.grammar import Constraint, Grammars
from reef.engines.packed import Products, calibrate, pack_linears
from reef.engines.prompt import ChatRenderer
from reef.engines.response import ResponseBuilder, TokenEvent
from reef.engines.sampling import SamplingParams
from reef.engines.scheduler import EngineStats, Request, Scheduler, Variant
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
from reef.settings import EmbeddedSettings

log = logging.getLogger(__name__)

# Prompts with more text than this (characters) are rendered and tokenized on a worker thread;
# shorter ones on the event loop, where that costs less than the hop. Measured on the tiny
# model: 4,000 characters render and tokenize in 0.9 ms, a hop to a thread costs ~40 us, and a
# 4 MB prompt takes 4 s (which on the loop would stall every other request for as long).
INLINE_PROMPT_CHARS = 4096
# Niceness of the threads rendering them (0 is the rest of the process's).
RENDER_NICENESS = 10
# The weights' precisions the engine serves in: what `engine.embedded.dtype` may name.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class EmbeddedEngine:
    """Serves OpenAI chat completions from a local Hugging Face model directory."""

    kind = "embedded"

    def __init__(
        self,
        model_dir: Path,
        model_id: str,
        options: EmbeddedSettings | None = None,
        *,
        default_max_tokens: int = 256,
        sampling_defaults: dict[str, float] | None = None,
    ):
        """`options`: how it batches, reads prompts and computes, the `engine.embedded` section
        (each key described on reef.settings.engine.EmbeddedSettings; default: its defaults).
        `default_max_tokens` and `sampling_defaults`: those of the engine section
        (Settings.default_max_tokens holds the first to the server's cap)."""
        self.model_dir = Path(model_dir)
        self.model_id = model_id
        self.options = options if options is not None else EmbeddedSettings()
        self.default_max_tokens = default_max_tokens
        self._products = Products()  # which product packed layers use, by rows (calibrated)
        self.dtype = DTYPES[self.options.dtype]
        self.sampling_defaults = (
            generation_defaults(self.model_dir)
            if sampling_defaults is None
            else dict(sampling_defaults)
        )
        self.stats = EngineStats()
        self.max_context = 0
        # ---- set while loading (a worker thread), read-only afterwards
        self._model: Any = None  # the base model; the scheduler wraps it in PEFT for adapters
        self._tokenizer: Any = None
        self._grammars: Grammars | None = None
        self._renderer: ChatRenderer | None = None
        self._pad_id = 0
        self._linear_shapes: dict[str, tuple[int, int]] = {}  # base Linear -> (in, out) features
        # ---- event loop side: the scheduler thread, and what a request's `model` may name
        self._scheduler: Scheduler | None = None
        self._base: Variant | None = None
        self._variants: dict[str, Variant] = {}  # loaded variants, in load order
        self._reserved: set[str] = set()  # names being loaded
        self._adapter_keys = 0  # PEFT keys are ours ("a1", "a2"...): release names may hold dots
        # Large prompts are rendered here, off the event loop (made in start()).
        self._render_pool = _render_pool()

    # ---- Engine protocol (event loop side)

    def models(self) -> list[str]:
        return [self.model_id, *self._variants]

    async def start(self) -> None:
        if self._scheduler is not None:
            return
        if self.options.threads:
            torch.set_num_threads(self.options.threads)
        self._render_pool = _render_pool()
        scheduler = await asyncio.to_thread(self._load)
        self._scheduler = scheduler
        scheduler.start()

    async def ready(self) -> bool:
        return (
            self._model is not None and self._scheduler is not None and self._scheduler.is_alive()
        )

    async def complete(
        self, body: dict[str, Any], *, sampling_defaults: dict[str, float] | None = None
    ) -> Completion:
        req = await self._submit(body, sampling_defaults=sampling_defaults)
        done = await self._complete(body, req)
        # `<tool_call>` text in the answer becomes tool calls (reef.engines.tool_calls)
        return tool_calls.completion_with_calls(done) if tool_calls.parses_calls(body) else done

    def stream(
        self, body: dict[str, Any], *, sampling_defaults: dict[str, float] | None = None
    ) -> AsyncIterator[dict[str, Any] | Completion]:
        items = self._stream(body, sampling_defaults)
        return tool_calls.parsed_stream(body, items) if tool_calls.parses_calls(body) else items

    async def _stream(
        self, body: dict[str, Any], sampling_defaults: dict[str, float] | None
    ) -> AsyncIterator[dict[str, Any] | Completion]:
        req = await self._submit(body, sampling_defaults=sampling_defaults)
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
        scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            await asyncio.to_thread(scheduler.close)
        self._render_pool.shutdown(wait=False, cancel_futures=True)
        self._model = self._base = None
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
            scheduler = self._running()
            try:
                await asyncio.wrap_future(scheduler.attach_adapter(key, config, weights))
            except asyncio.CancelledError:
                # The scheduler attaches it all the same; queued after that, this takes it off.
                scheduler.detach_adapter(key)
                raise
            assert self._model is not None
            self._variants[name] = Variant(name, self._model, adapter=key)
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
            self._variants[name] = Variant(name, model)
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
        await asyncio.wrap_future(self._running().retire(variant))
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
        done = await self._complete(body, await self._submit(body, check_finite=True))
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

    def _running(self) -> Scheduler:
        """The scheduler, while its thread runs."""
        if self._scheduler is None or not self._scheduler.is_alive():
            raise EngineUnavailable("the embedded engine is not running")
        return self._scheduler

    # ---- loading (worker threads)

    def _load(self) -> Scheduler:
        """Load the base model and tokenizer; the scheduler that will own the model."""
        started = time.monotonic()
        tokenizer, model = _read_model(self.model_dir, self.dtype)
        packed = pack_linears(model, self._products) if self.options.packed_linear else 0
        config = model.config
        _require_full_attention(config, self.model_dir)
        self._pad_id = next(
            i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0) if i is not None
        )
        self.max_context = int(getattr(config, "max_position_embeddings", 0) or 2048)
        with torch.inference_mode():  # warm-up: the first request should not pay for allocation
            Batch.prefill(model, [[self._pad_id]], self._pad_id)
        if packed:
            ratios = calibrate(model, self._products, self._pad_id)
            log.info(
                "embedded engine: packed over plain products, one-token passes by rows: %s; "
                "calls of up to %d rows take the plain product",
                ", ".join(f"{rows}: {ratio:.2f}x" for rows, ratio in ratios.items()),
                self._products.plain_up_to,
            )
        fuse = self.options.fuse_prefill and fused.supported(model, self._pad_id)
        self._linear_shapes = {
            name: (m.in_features, m.out_features)
            for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear)
        }
        self._tokenizer = tokenizer
        self._grammars = Grammars(tokenizer, config.vocab_size, _eos_ids(tokenizer, model))
        self._renderer = ChatRenderer(tokenizer)
        self._model = model
        self._base = Variant(self.model_id, model)
        self._log_loaded(packed, fuse, time.monotonic() - started)
        o = self.options
        return Scheduler(
            model,
            model_id=self.model_id,
            max_batch_size=o.max_batch_size,
            eos_ids=_eos_ids(tokenizer, model),
            pad_id=self._pad_id,
            token_text=TokenText(tokenizer),
            stats=self.stats,
            prefill_chunk_tokens=o.prefill_chunk_tokens,
            prefix_cache_bytes=o.prefix_cache_mb * 2**20,
            fuse_prefill=fuse,
            itl_target_s=o.itl_target_ms / 1000 if o.itl_target_ms else None,
            itl_headroom=o.itl_headroom,
            itl_max_wait_s=o.itl_max_wait_ms / 1000,
        )

    def _log_loaded(self, packed: int, fuse: bool, seconds: float) -> None:
        log.info(
            "embedded engine loaded %s (%s, %s, %d packed linear layers) in %.1f s: context %d, "
            "batch %d, prefill chunk %d%s%s, %d threads",
            self.model_id,
            self.model_dir,
            str(self.dtype).removeprefix("torch."),
            packed,
            seconds,
            self.max_context,
            self.options.max_batch_size,
            self.options.prefill_chunk_tokens,
            " (fused with decode steps)" if fuse else "",
            self._pacing(),
            torch.get_num_threads(),
        )

    def _pacing(self) -> str:
        """How prompts read among decoding rows are paced, for the log line at load."""
        o = self.options
        limits = []
        if o.itl_target_ms:
            limits.append(f"{o.itl_target_ms:g} ms")
        if o.itl_headroom:
            limits.append(f"{o.itl_headroom:.0%} over a plain round")
        if not limits:
            return ""
        wait = f"; a long prompt waits up to {o.itl_max_wait_ms:g} ms for room"
        return f" paced to rounds within {' and '.join(limits)}{wait}"

    def _read_adapter(self, path: Path) -> tuple[Any, dict[str, torch.Tensor]]:
        return read_adapter(path, self._linear_shapes, self.model_id)

    def _read_checkpoint(self, path: Path) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM

        check_checkpoint(path, self.model_dir, self._model.config.model_type)
        try:
            model = AutoModelForCausalLM.from_pretrained(
                path, dtype=self.dtype, attn_implementation="sdpa"
            ).eval()
            if self.options.packed_linear:
                pack_linears(model, self._products)  # as calibrated on the base model
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

    async def _submit(
        self,
        body: dict[str, Any],
        *,
        check_finite: bool = False,
        sampling_defaults: dict[str, float] | None = None,
    ) -> Request:
        """Validate, render and queue; every BadRequest is raised here, before anything is queued.
        `sampling_defaults`: a scenario's own, over the engine's."""
        renderer = self._renderer
        self._running()
        if renderer is None:
            raise EngineUnavailable("the embedded engine is not running")
        self._variant(body.get("model"))  # an unknown name fails before any rendering
        defaults = self.sampling_defaults if sampling_defaults is None else sampling_defaults
        sampled, filled = with_defaults(body, defaults)
        params = SamplingParams.from_body(sampled)
        constraint = await self._constraint(body.get("response_format"))
        render = partial(self._render, renderer, body, params.max_tokens)
        if _text_chars(body) <= INLINE_PROMPT_CHARS:
            count, prompt_ids = render()
        else:
            loop = asyncio.get_running_loop()
            count, prompt_ids = await loop.run_in_executor(self._render_pool, render)
        if params.max_tokens is None:
            room = self.max_context - count
            params = replace(params, max_tokens=min(self.default_max_tokens, room))
        # Looked up again after rendering, which may have waited: the engine may have stopped,
        # or the variant been unloaded, meanwhile.
        scheduler = self._running()
        variant = self._variant(body.get("model"))
        detok = Detokenizer(self._tokenizer, params.stop)
        loop = asyncio.get_running_loop()
        req = Request(
            prompt_ids,
            params,
            loop,
            detok,
            variant,
            check_finite=check_finite,
            sampling=sampling_record(
                {"temperature": params.temperature, "top_p": params.top_p}, filled
            ),
            constraint=constraint,
        )
        scheduler.submit(req)
        return req

    async def _constraint(self, response_format: Any) -> Constraint | None:
        """The request's structured-output matcher (reef.engines.grammar), compiled off the
        event loop: a large schema takes a while."""
        if response_format is None or self._grammars is None:
            return None
        return await asyncio.to_thread(self._grammars.constraint, response_format)

    def _render(
        self, renderer: ChatRenderer, body: dict[str, Any], max_tokens: int | None
    ) -> tuple[int, list[int]]:
        """The prompt's token count and ids; BadRequest when they and `max_tokens` completion
        tokens (one when None) do not fit the context. Runs on the event loop or a render
        thread."""
        text = renderer.prompt_text(body)
        limit = renderer.max_chars(self.max_context)
        if len(text) > limit:  # too long whatever its tokens: not worth tokenizing
            raise BadRequest(
                f"This model's maximum context length is {self.max_context} tokens. However, "
                f"your messages are {len(text)} characters long, more than {limit} characters "
                f"(the most {self.max_context} tokens can spell). Please reduce the length of "
                "the messages.",
                code="context_length_exceeded",
                param="messages",
            )
        wanted = max_tokens if max_tokens is not None else 1
        count, prompt_ids = renderer.encode(text, self.max_context - wanted)
        if prompt_ids is None:
            asked = f"{count} tokens in the messages"
            if max_tokens is not None:
                asked = (
                    f"{count + wanted} tokens ({count} in the messages, {wanted} in the completion)"
                )
            raise BadRequest(
                f"This model's maximum context length is {self.max_context} tokens. "
                f"However, you requested {asked}. Please reduce the length of the messages "
                "or the completion.",
                code="context_length_exceeded",
                param="messages",
            )
        return count, prompt_ids

    def _variant(self, name: str | None) -> Variant:
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

    async def _complete(self, body: dict[str, Any], req: Request) -> Completion:
        builder = self._builder(body, req)
        try:
            while True:
                event = await self._next(req)
                builder.add(event)
                if event.finish_reason:
                    return builder.completion(req.timings())
        finally:
            self._release(req)

    def _builder(self, body: dict[str, Any], req: Request) -> ResponseBuilder:
        return ResponseBuilder(
            model=req.variant.name,
            prompt_ids=req.prompt_ids,
            logprobs=req.params.logprobs,
            return_token_ids=bool(body.get("return_token_ids")),
            include_usage=bool((body.get("stream_options") or {}).get("include_usage")),
            sampling=req.sampling,
        )

    @staticmethod
    async def _next(req: Request) -> TokenEvent:
        item = await req.events.get()
        if isinstance(item, ReefError):
            raise item
        return item

    @staticmethod
    def _release(req: Request) -> None:
        # Runs when the consumer stops listening for any reason (done, error, cancelled task,
        # closed generator); for an unfinished request it tells the scheduler to drop the row.
        if not req.done:
            req.cancelled = True


def _read_model(model_dir: Path, dtype: torch.dtype) -> tuple[Any, Any]:
    """The tokenizer and the model (in eval mode) in `model_dir`; ConfigError when they cannot
    be read or the tokenizer has no chat template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        # SDPA: torch's fused attention, the fastest exact kernel it has on CPU.
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=dtype, attn_implementation="sdpa"
        )
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load the model in {model_dir}: {exc}") from exc
    if not tokenizer.chat_template:
        raise ConfigError(f"model {model_dir} has no chat template")
    model.eval()
    return tokenizer, model


def _require_full_attention(config: Any, model_dir: Path) -> None:
    """The batch keeps one plain KV cache per layer; sliding-window or linear-attention layers
    would need their own bookkeeping when rows join and leave."""
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"}:
        raise ConfigError(
            f"the embedded engine serves full-attention models only; {model_dir} has "
            f"layers of types {sorted(layer_types)}"
        )


def _eos_ids(tokenizer: Any, model: Any) -> frozenset[int]:
    """Every token that ends an answer: the tokenizer's, the config's and the generation
    config's (each an id or a list of ids)."""
    eos = {tokenizer.eos_token_id}
    config = model.config
    for source in (config.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        eos.update(source if isinstance(source, list) else [source])
    return frozenset(i for i in eos if i is not None)


def _render_pool() -> ThreadPoolExecutor:
    """Threads of their own, so that a burst of large prompts waits for them rather than taking
    the loop's default pool from the store calls of every other request; at a lower CPU
    priority (Linux), so that on a busy machine tokenizing a large prompt yields the cores to
    the event loop and the decoding thread."""
    return ThreadPoolExecutor(
        max_workers=2, thread_name_prefix="reef-render", initializer=_lower_priority
    )


def _lower_priority() -> None:
    if sys.platform == "linux":  # per thread there; elsewhere it would be the whole process
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), RENDER_NICENESS)


def _text_chars(body: dict[str, Any]) -> int:
    """About how much text rendering `body` means: the characters of its messages' text and
    tool-call arguments; any tool definitions count as a lot (their JSON schemas go through
    the template's own JSON filter, whose cost their count does not tell)."""
    if body.get("tools"):
        return INLINE_PROMPT_CHARS + 1
    total = 0
    messages = body.get("messages")
    for m in messages if isinstance(messages, list) else ():
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(str(p.get("text", ""))) for p in content if isinstance(p, dict))
        for call in m.get("tool_calls") or ():
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                total += len(str(fn.get("arguments", "")))
        total += 16  # the template's own text around each message
    return total
