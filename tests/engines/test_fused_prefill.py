"""Fused prefill (reef.engines.fused): a decode step and a prompt chunk in one forward pass
compute what the two separate passes compute, and the engine that fuses them answers what the
engine that does not answers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from reef.engines import fused
from reef.engines.base import Completion
from reef.engines.batch import Batch, Prefill
from tests.engines.conftest import running_engine
from tests.engines.test_chunked_prefill import answers
from tests.engines.test_embedded_releases import lora
from tests.engines.test_prefix_cache import QUESTIONS
from tests.engines.test_prefix_cache import body as prefixed

PAD = 0


def _ids(gen: torch.Generator, n: int) -> list[int]:
    return torch.randint(1, 200, (n,), generator=gen).tolist()


def _run(model: torch.nn.Module, fuse: bool, chunk: int) -> tuple[list[torch.Tensor], Batch]:
    """Three rows decoding while two prompts of unequal length (padding in their chunks) are
    read `chunk` columns a pass; then the prompts join and everyone decodes two more tokens.
    Every pass's logits, and the final batch."""
    gen = torch.Generator().manual_seed(3)
    running = [_ids(gen, n) for n in (7, 3, 12)]
    prompts = [_ids(gen, 23), _ids(gen, 9)]
    out: list[torch.Tensor] = []
    with torch.inference_mode():
        batch, logits = Batch.prefill(model, running, PAD)
        tokens = logits.argmax(-1).tolist()
        reading = Prefill(prompts, PAD)
        read = None
        while read is None:
            if fuse:
                logits, read = fused.step(model, batch, tokens, reading, chunk)
            else:
                logits, read = batch.step(model, tokens), reading.step(model, chunk)
            out.append(logits)
            tokens = logits.argmax(-1).tolist()
        out.append(read)
        assert reading.batch is not None
        batch = batch.merge(reading.batch)
        tokens += read.argmax(-1).tolist()
        for _ in range(2):
            logits = batch.step(model, tokens)
            out.append(logits)
            tokens = logits.argmax(-1).tolist()
    return out, batch


@pytest.mark.parametrize("chunk", [1, 5, 23])
def test_a_fused_pass_computes_what_separate_passes_compute(tiny_dir: Path, chunk: int) -> None:
    model = AutoModelForCausalLM.from_pretrained(
        tiny_dir, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    separate, apart = _run(model, False, chunk)
    together, joined = _run(model, True, chunk)
    assert len(separate) == len(together) == -(-23 // chunk) + 3
    for a, b in zip(separate, together, strict=True):
        assert torch.allclose(a, b, atol=1e-4), (a - b).abs().max()
    # The caches, masks and lengths the later steps read are the same too.
    assert torch.equal(apart.mask, joined.mask) and torch.equal(apart.lengths, joined.lengths)
    for (ka, va, *_), (kb, vb, *_) in zip(apart.cache, joined.cache, strict=True):
        assert torch.allclose(ka, kb, atol=1e-4) and torch.allclose(va, vb, atol=1e-4)
    # The model's own attention is back to what it was.
    assert model.config._attn_implementation == "sdpa"
    assert fused.supported(model, PAD)


def test_the_engine_fuses_and_answers_as_it_does_unfused(tiny_dir: Path) -> None:
    """One request decoding while six prompts (one of ~600 tokens) are read in chunks of 16:
    with fused passes, the same tokens and log-probs as with separate ones, in fewer passes."""
    apart, apart_stats = answers(tiny_dir, 16, fuse_prefill=False)
    together, together_stats = answers(tiny_dir, 16)
    assert apart_stats.fused == 0
    assert together_stats.fused > 30  # the long prompt's chunks rode the decode steps
    passes = together_stats.steps + together_stats.prefills - together_stats.fused
    assert passes < apart_stats.steps + apart_stats.prefills
    for a, b in zip(apart, together, strict=True):
        assert isinstance(a, Completion) and isinstance(b, Completion)
        assert a.completion_token_ids == b.completion_token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_fused_passes_read_prefix_hits_and_adapters_as_separate_ones_do(
    tiny_dir: Path, tmp_path: Path
) -> None:
    """While an adapter's request decodes, prompts of that adapter that open with a cached
    system prompt are read fused with its steps: the same answers as separate passes."""
    adapter = tmp_path / "a1"
    lora(AutoModelForCausalLM.from_pretrained(tiny_dir).eval(), 1, adapter, scale=0.3)

    def run(fuse: bool) -> tuple[list[Completion], Any]:
        with running_engine(
            tiny_dir,
            max_batch_size=8,
            prefill_chunk_tokens=8,
            prefix_cache_mb=64,
            fuse_prefill=fuse,
        ) as engine:

            async def ask() -> list[Completion]:
                await engine.load_adapter("a1", adapter)
                first = await engine.complete(prefixed("a1", QUESTIONS[0]))  # caches the opening
                running = asyncio.create_task(
                    engine.complete({**prefixed("a1", "hi"), "max_tokens": 120})
                )
                while engine.stats.tokens_generated < len(first.completion_token_ids or []) + 2:
                    await asyncio.sleep(0.001)
                rest = await asyncio.gather(
                    *(engine.complete(prefixed("a1", q)) for q in QUESTIONS[1:])
                )
                return [first, *rest, await running]

            return asyncio.run(ask()), engine.stats

    apart, apart_stats = run(False)
    together, stats = run(True)
    assert apart_stats.fused == 0 and stats.fused > 0
    assert stats.prefix_hits >= len(QUESTIONS) - 1
    for a, b in zip(apart, together, strict=True):
        assert a.completion_token_ids == b.completion_token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
