"""The embedded engine's prefix cache: prompts that open like earlier ones (a scenario's system
prompt) start from the kept keys and values and answer what a full read answers, per variant."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from reef.engines.base import Completion
from reef.engines.prefixes import BLOCK, PrefixCache
from tests.engines.conftest import running_engine
from tests.engines.test_embedded_releases import lora

SYSTEM = "You are the harbour master. " + " ".join(f"Rule {i}: log every ship." for i in range(20))
QUESTIONS = ["Which ship came in?", "hi", "Name three colors.", "2+2=?", "Tell me a joke"]


def body(model: str, question: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": question},
        ],
        "temperature": 0,
        "max_tokens": 10,
        "logprobs": True,
    }


def answers(tiny_dir: Path, adapter: Path, cache_mb: int) -> tuple[list[Completion], Any]:
    """One request alone, then the base model and an adapter on every question at once."""
    with running_engine(tiny_dir, max_batch_size=16, prefix_cache_mb=cache_mb) as engine:

        async def ask() -> list[Completion]:
            await engine.load_adapter("a1", adapter)
            first = await engine.complete(body("tiny", QUESTIONS[0]))
            plan = [(m, q) for q in QUESTIONS for m in ("tiny", "a1")]
            rest = await asyncio.gather(*(engine.complete(body(m, q)) for m, q in plan))
            return [first, *rest]

        return asyncio.run(ask()), engine.stats


def test_a_cached_opening_answers_what_a_full_read_answers(tiny_dir: Path, tmp_path: Path) -> None:
    adapter = tmp_path / "a1"
    lora(AutoModelForCausalLM.from_pretrained(tiny_dir).eval(), 1, adapter, scale=0.3)
    plain, plain_stats = answers(tiny_dir, adapter, 0)
    cached, stats = answers(tiny_dir, adapter, 64)
    assert plain_stats.prefix_hits == 0
    # Every base request after the first found the system prompt; the adapter's rows found
    # the keys and values the adapter computed, never the base model's.
    assert stats.prefix_hits >= len(QUESTIONS)
    assert stats.prefix_tokens >= stats.prefix_hits * 4 * BLOCK
    assert stats.prompt_tokens < plain_stats.prompt_tokens - 4 * BLOCK * len(QUESTIONS)
    for a, b in zip(plain, cached, strict=True):
        assert a.response["model"] == b.response["model"]
        assert a.completion_token_ids == b.completion_token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    tuned = [c.completion_token_ids for c in cached if c.response["model"] == "a1"]
    base = [c.completion_token_ids for c in cached[1:] if c.response["model"] == "tiny"]
    assert tuned != base


def kv(tokens: int, fill: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
    t = torch.full((1, 2, tokens, 4), fill)
    return [(t, t.clone()), (t.clone(), t.clone())]


def test_the_cache_finds_the_longest_opening_and_keeps_to_its_budget() -> None:
    base, other = (1, None), (1, "a1")
    cache = PrefixCache(max_bytes=kv(3 * BLOCK, 0.0)[0][0].nbytes * 4 * 2)  # two 3-block entries
    a = list(range(3 * BLOCK + 5))
    cache.store(base, a, kv(len(a), 1.0))
    assert cache.lookup(other, a) is None  # another variant's keys and values never answer
    assert cache.lookup(base, a[:BLOCK]) is None  # the last token is always read
    hit = cache.lookup(base, [*a[: 2 * BLOCK], 999, 998])
    assert hit is not None and hit.tokens == 2 * BLOCK
    assert (
        hit.layers[0][0].shape == (1, 2, 2 * BLOCK, 4) and float(hit.layers[0][0][0, 0, 0, 0]) == 1
    )
    hit = cache.lookup(base, a)
    assert hit is not None and hit.tokens == 3 * BLOCK
    b = [7, *a[1:]]  # differs in the first block: shares nothing
    assert cache.lookup(base, b) is None
    cache.store(base, b, kv(len(b), 2.0))
    cache.store(other, a, kv(len(a), 3.0))  # over budget: the least recently used goes
    assert len(cache) == 2 and cache.nbytes <= cache.max_bytes
    assert cache.lookup(base, a) is None and cache.lookup(base, b) is not None
    cache.forget(base)
    assert len(cache) == 1 and cache.lookup(base, b) is None and cache.lookup(other, a) is not None
