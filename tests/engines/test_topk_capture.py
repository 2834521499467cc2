"""The embedded engine records the generation-time top-K (K = 4) of every generated token:
the ids are the sampler's top-K, its log-probs the raw distribution's, and a teacher-forced
forward pass of the same weights reproduces them (what the openclaw recipe relies on)."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import torch

from reef.engines.base import CAPTURE_TOPK
from tests.engines.conftest import running_engine


def test_every_generated_token_has_its_top_k(tiny_dir: Path) -> None:
    body: dict[str, Any] = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": 10,
        "temperature": 0.7,
        "seed": 3,
    }
    with running_engine(tiny_dir, default_max_tokens=16) as engine:
        done = asyncio.run(engine.complete(body))
    assert done.topk is not None and done.topk["k"] == CAPTURE_TOPK
    ids, lps = done.topk["ids"], done.topk["logprobs"]
    completion = done.completion_token_ids or []
    assert len(ids) == len(lps) == len(completion) > 0
    assert all(len(row) == CAPTURE_TOPK for row in ids)
    assert all(a >= b for row in lps for a, b in itertools.pairwise(row))  # sorted
    # The client did not ask for log-probs: the capture stays off the wire.
    assert done.response["choices"][0]["logprobs"] is None

    # Teacher-forced on prompt + completion, the same weights give the same top-4 and values.
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    prompt = done.prompt_token_ids or []
    seq = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=seq).logits[0, len(prompt) - 1 : -1].float()
    top = torch.log_softmax(logits, -1).topk(CAPTURE_TOPK, -1)
    assert top.indices.tolist() == ids
    assert torch.allclose(top.values, torch.tensor(lps), atol=1e-4)
    # The sampled token's own log-prob is the recorded one.
    picked = torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0]
    assert torch.allclose(picked, torch.tensor(done.logprobs), atol=1e-4)
