"""Reading a batch's shared prefix once (reef.recipes.shared_prefix): the same loss and
gradients as reading every sequence whole, on the tiny model with LoRA, directly and through
TRL's SFT trainer."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import torch

from reef.datasets import SCHEMAS
from reef.models import resolve_model
from reef.recipe import TrainJob, load_recipe
from reef.recipes import shared_prefix as sp

SYSTEM = "You answer questions about colours, briefly and politely. " * 3
QUESTIONS = ["What colour is the sky?", "Name a warm colour.", "Is grass green?", "Snow?"]
ANSWERS = ["Blue.", "Red, or orange when the sun sets.", "Yes.", "White, mostly, and cold."]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return resolve_model("tiny", tmp_path_factory.mktemp("models"))


@pytest.fixture(autouse=True)
def one_thread() -> Any:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def lora_model(tiny: Path, dropout: float = 0.0) -> tuple[Any, Any]:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=dropout, target_modules="all-linear")
    model = get_peft_model(model, config)
    for name, p in model.named_parameters():  # B starts at 0: move it, so every grad is live
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02)
    return model, tokenizer


def batch(tokenizer: Any) -> dict[str, torch.Tensor]:
    """Right-padded sequences that share the system prompt; labels on the answers only."""
    rows = []
    for q, a in zip(QUESTIONS, ANSWERS, strict=True):
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
        prompt = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        full = tokenizer(prompt + a + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
        rows.append((full, len(p)))
    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id or 0
    ids = [x + [pad] * (width - len(x)) for x, _ in rows]
    labels = [[-100] * n + x[n:] + [-100] * (width - len(x)) for x, n in rows]
    mask = [[1] * len(x) + [0] * (width - len(x)) for x, _ in rows]
    return {
        "input_ids": torch.tensor(ids),
        "attention_mask": torch.tensor(mask),
        "labels": torch.tensor(labels),
    }


def loss_and_grads(model: Any, inputs: dict[str, torch.Tensor]) -> tuple[float, dict[str, Any]]:
    model.zero_grad()
    loss = model(**inputs).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads


def test_a_shared_prefix_gives_the_same_loss_and_gradients(tiny: Path) -> None:
    model, tokenizer = lora_model(tiny)
    inputs = batch(tokenizer)
    shared = sp._trainable_prefix(dict(inputs))
    assert shared >= 30, "the system prompt is read once"
    whole, whole_grads = loss_and_grads(model, inputs)
    with sp.shared_prefix_training(model) as on:
        assert on
        split, split_grads = loss_and_grads(model, inputs)
    assert "forward" not in vars(model), "the model's own forward again"
    assert split == pytest.approx(whole, abs=1e-5)
    assert whole_grads.keys() == split_grads.keys() and len(whole_grads) > 10
    for name, g in whole_grads.items():
        torch.testing.assert_close(split_grads[name], g, rtol=1e-3, atol=1e-6, msg=name)


def test_what_is_not_shared_is_read_whole() -> None:
    """No prefix when a sequence learns from its first tokens, differs early or is padding
    there, and none for a batch of one."""
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 9, 9]])
    mask = torch.ones_like(ids)
    unlabelled = torch.full_like(ids, -100)
    labels = unlabelled.clone()
    labels[:, 6] = 7
    assert sp._trainable_prefix({"input_ids": ids, "attention_mask": mask, "labels": labels}) == 4
    labels[:, 3] = 4  # a label inside the common part: the prefix ends before it
    assert sp._trainable_prefix({"input_ids": ids, "attention_mask": mask, "labels": labels}) == 0
    one = {"input_ids": ids[:1], "attention_mask": mask[:1], "labels": unlabelled[:1]}
    assert sp._trainable_prefix(one) == 0
    padded = mask.clone()
    padded[1, 2] = 0
    assert sp._trainable_prefix({"input_ids": ids, "attention_mask": padded, "labels": labels}) == 0


def test_dropout_turns_it_off(tiny: Path) -> None:
    """Shared tokens would share one dropout mask where each sequence draws its own."""
    model, _ = lora_model(tiny, dropout=0.1)
    with sp.shared_prefix_training(model) as on:
        assert not on
        assert "forward" not in vars(model)


def scored_table() -> pa.Table:
    rows = []
    for i, (q, a) in enumerate(zip(QUESTIONS * 2, ANSWERS * 2, strict=True)):
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
        rows.append(
            {
                "sample_id": f"rec_{i}",
                "scenario": "s",
                "record_ids": [f"rec_{i}"],
                "release_id": "rel_base",
                "staleness": 0,
                "report_ids": [f"rep_{i}"],
                "n_tokens": None,
                "messages": json.dumps(msgs),
                "completion": a,
                "score": 1.0,
                "report_id": f"rep_{i}",
                "feedback": None,
            }
        )
    return pa.Table.from_pylist(rows, schema=SCHEMAS["scored"])


def test_sft_trains_the_same_adapter_with_and_without_it(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through TRL's SFT trainer (its fused LM head, its collator): two runs from one seed, one
    with the shared prefix read once (every batch), one reading every row whole, end with the
    same loss and the same adapter weights."""
    from safetensors.torch import load_file

    recipe = load_recipe("sft", {"epochs": 2})

    def run(out: Path) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
        job = TrainJob(scenario="s", base_model=tiny, dataset=scored_table(), out_dir=out, seed=0)
        trained = recipe.train(job)
        return trained.metrics, load_file(out / "adapter_model.safetensors")

    seen: list[int] = []
    measure = sp._trainable_prefix
    monkeypatch.setattr(sp, "_trainable_prefix", lambda kw: seen.append(measure(kw)) or seen[-1])
    shared_metrics, shared_weights = run(tmp_path / "shared")
    assert len(seen) == 4 and min(seen) >= 30, seen  # 8 rows, batch 4, 2 epochs
    monkeypatch.setattr(sp, "shared_prefix_training", lambda m: contextlib.nullcontext(False))
    whole_metrics, whole_weights = run(tmp_path / "whole")
    assert shared_metrics["train_loss"] == pytest.approx(whole_metrics["train_loss"], rel=1e-4)
    assert shared_weights.keys() == whole_weights.keys()
    for name, w in whole_weights.items():
        # Adam turns float rounding in near-zero gradients into steps of up to ~lr: 4e-5 seen
        torch.testing.assert_close(shared_weights[name], w, rtol=1e-3, atol=1e-4, msg=name)


@pytest.mark.parametrize("lengths", [(3, 9, 1, 6), (5, 5, 5)], ids=["ragged", "even"])
def test_completions_after_one_prompt_read_it_once(tiny: Path, lengths: tuple[int, ...]) -> None:
    """tttd's passes over a group's rollouts: one prompt, several completions. The log-probs
    and the gradient of their sum are those of reading each prompt + completion alone."""
    from reef.recipes.sao.learner import response_logprobs

    model, tokenizer = lora_model(tiny)
    model.train()
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]}]
    text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    completions = [[(7 * k + 3 * j) % 200 + 5 for j in range(n)] for k, n in enumerate(lengths)]

    model.zero_grad()
    alone = [response_logprobs(model, torch.tensor([prompt + c]), len(prompt)) for c in completions]
    torch.stack([a.sum() for a in alone]).sum().backward()
    alone_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    model.zero_grad()
    shared = sp.response_logprobs_after(model, prompt, completions)
    torch.stack([s.sum() for s in shared]).sum().backward()
    for a, s in zip(alone, shared, strict=True):
        torch.testing.assert_close(s, a, rtol=1e-4, atol=1e-5)
    for name, g in alone_grads.items():
        got = dict(model.named_parameters())[name].grad
        scale = float(g.abs().max())  # gradients here reach ~10: rounding scales with them
        torch.testing.assert_close(got, g, rtol=1e-3, atol=1e-5 * scale, msg=name)
