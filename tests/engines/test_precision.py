"""How the embedded engine computes: in bfloat16 (engine.embedded.dtype), the base model and a
LoRA adapter in one batch, each recorded log-prob the one a teacher-forced forward pass of the
same bfloat16 weights gives; and through oneDNN's packed linear layers
(engine.embedded.packed_linear), what plain nn.Linear layers give."""

from __future__ import annotations

import asyncio
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from reef.engines.base import Completion
from reef.engines.packed import CALIBRATION_ROWS, Products, calibrate, pack_linears
from reef.errors import ConfigError
from reef.settings import EmbeddedSettings, load_settings
from tests.engines.conftest import running_engine
from tests.engines.test_embedded_releases import lora

QUESTIONS = ["What is the capital of France?", "hi", "Tell me a joke about numbers"]
# bfloat16 keeps 8 bits of mantissa: a decode step and a whole-sequence pass round differently.
# Measured (tiny model, base and adapter rows in mixed batches): mean 0.01-0.03, largest up to
# 0.18; float32 agrees to 1e-4. SmolLM2 in bench/embedded_batching.py --precision: largest 0.17.
BF16_MEAN_GAP = 0.05
BF16_MAX_GAP = 0.3


def body(model: str, question: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "temperature": 0.8,
        "seed": 11,
        "max_tokens": 12,
        "logprobs": True,
    }


def teacher_forced(model: torch.nn.Module, c: Completion) -> list[float]:
    prompt, ids = c.prompt_token_ids or [], c.completion_token_ids or []
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
    picked = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(ids)[:, None])
    return picked.squeeze(1).tolist()


def test_bfloat16_serves_base_and_adapter_with_their_own_logprobs(
    tiny_dir: Path, tmp_path: Path
) -> None:
    adapter = tmp_path / "a1"
    lora(AutoModelForCausalLM.from_pretrained(tiny_dir).eval(), 1, adapter, scale=0.3)
    with running_engine(tiny_dir, dtype="bfloat16", prefill_chunk_tokens=16) as engine:
        assert next(engine._model.parameters()).dtype == torch.bfloat16

        async def ask() -> list[Completion]:
            await engine.load_adapter("a1", adapter)
            plan = [(m, q) for q in QUESTIONS for m in ("tiny", "a1")]
            return await asyncio.gather(*(engine.complete(body(m, q)) for m, q in plan))

        answers = asyncio.run(ask())
        assert engine.stats.failed == 0 and engine.stats.max_batch >= 2

    base = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.bfloat16).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # PEFT reads a deprecated attribute
        tuned = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.bfloat16), adapter
        ).eval()
    gaps = []
    for c in answers:
        truth = tuned if c.response["model"] == "a1" else base
        expected = torch.tensor(teacher_forced(truth, c))
        gaps.append((torch.tensor(c.logprobs or []) - expected).abs())
    every = torch.cat(gaps)
    print(f"bfloat16 log-prob gap: mean {float(every.mean()):.4f} max {float(every.max()):.4f}")
    assert float(every.mean()) < BF16_MEAN_GAP and float(every.max()) < BF16_MAX_GAP
    by_model = {m: [c for c in answers if c.response["model"] == m] for m in ("tiny", "a1")}
    assert [c.completion_token_ids for c in by_model["tiny"]] != [
        c.completion_token_ids for c in by_model["a1"]
    ]


def test_dtype_is_a_setting_and_an_unknown_one_is_refused() -> None:
    assert EmbeddedSettings().dtype == "float32"
    assert EmbeddedSettings(dtype="bfloat16").dtype == "bfloat16"
    with pytest.raises(ValueError):
        EmbeddedSettings(dtype="float16")
    with pytest.raises(ConfigError, match=r"engine\.embedded\.dtype"):
        load_settings(engine={"embedded": {"dtype": "int4"}})


def test_packed_linear_layers_compute_what_plain_ones_do(tiny_dir: Path) -> None:
    """oneDNN with packed weights (engine.embedded.packed_linear, the default) against plain
    nn.Linear: the same greedy tokens, log-probs equal to float32 rounding."""

    def answers(packed: bool) -> list[Completion]:
        with running_engine(tiny_dir, packed_linear=packed) as engine:
            linears = [m for m in engine._model.modules() if isinstance(m, torch.nn.Linear)]
            assert linears and all(("forward" in vars(m)) == packed for m in linears)

            async def ask() -> list[Completion]:
                bodies = [{**body("tiny", q), "temperature": 0} for q in QUESTIONS]
                return await asyncio.gather(*(engine.complete(b) for b in bodies))

            return asyncio.run(ask())

    for a, b in zip(answers(False), answers(True), strict=True):
        assert a.completion_token_ids == b.completion_token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_calls_of_few_rows_take_the_plain_product_where_it_was_faster(tiny_dir: Path) -> None:
    """Calls of up to `plain_up_to` rows compute exactly what nn.Linear does; larger ones go
    through the packed weight (equal to float32 rounding); `calibrate` picks `plain_up_to` from
    timed passes of the model: a prefix of the row counts it tried."""
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    layer = model.lm_head
    plain_layer = torch.nn.Linear(layer.in_features, layer.out_features, bias=False)
    plain_layer.weight = layer.weight
    products = Products(plain_up_to=2)
    assert pack_linears(model, products) > 0
    with torch.inference_mode():
        for rows in (1, 2, 3, 8):
            x = torch.randn(rows, layer.in_features)
            got, want = layer(x), plain_layer(x)
            if rows <= 2:
                assert torch.equal(got, want)
            else:
                assert torch.allclose(got, want, atol=1e-5)
                products.plain_up_to = 0
                assert torch.equal(layer(x), got)  # the packed product, whatever the setting
                products.plain_up_to = 2
        x = torch.randn(1, 2, layer.in_features)  # rows are every token of the call
        assert torch.equal(layer(x), plain_layer(x))
    ratios = calibrate(model, products, token_id=0)
    assert set(ratios) == set(CALIBRATION_ROWS) and all(r > 0 for r in ratios.values())
    tried = [0, *CALIBRATION_ROWS]
    assert products.plain_up_to in tried
    faster_plain = [rows for rows in CALIBRATION_ROWS if rows <= products.plain_up_to]
    assert all(ratios[rows] > 1.0 for rows in faster_plain)
    nxt = tried[tried.index(products.plain_up_to) + 1 :]
    assert not nxt or ratios[nxt[0]] <= 1.0
