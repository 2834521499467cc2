"""Distributed training from the evolve flow's train task (reef.train.processes): SFT on the
tiny model in two gloo ranks under `accelerate launch` trains the same adapter as one process.

Why the two runs must agree: DDP averages the ranks' gradients and transformers normalises the
loss by the token count gathered across ranks, so two ranks with per-device batch 2 take the
same step as one process with batch 4 on the same four rows. Every step here takes the whole
dataset (4 rows, global batch 4), so the sampler's order cannot differ, and LoRA dropout is 0.
What remains is float32 summation order (the gloo all-reduce adds two halves). Adam divides each
gradient by its own running magnitude, which amplifies that noise for elements whose gradient
is near Adam's epsilon, up to a fraction of the learning rate (1e-3) per step: measured, the
adapters differed by 1.4e-6 at most. The tolerance, 1e-5 (1 % of one step's update), is 100x
below the 1e-3 the weights move, so a run that trained on half the data, averaged the wrong
way or skipped a step would fail it.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prefect import flow

from reef.flows import weights
from reef.models import resolve_model
from reef.recipe import Trained, TrainJob, WeightsRecipe, load_recipe
from reef.settings import LoopSettings, TrainSettings
from tests.recipes.test_trl_recipes import GOOD, QUESTIONS, scored

pytestmark = [
    pytest.mark.loop,  # three processes start torch: ~25 s on a busy 2-core machine
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]


def test_two_gloo_ranks_train_the_adapter_one_process_trains(
    prefect_server: None, tmp_path: Path
) -> None:
    import torch
    from safetensors.torch import load_file

    tiny = resolve_model("tiny", tmp_path / "models")
    table = scored([(q, GOOD, 1.0, None) for q in QUESTIONS])  # 4 rows, all kept by sft

    def job(name: str) -> TrainJob:
        return TrainJob("s", tiny, table, tmp_path / name, seed=7)

    def sft(batch_size: int) -> WeightsRecipe:
        recipe = load_recipe("sft", {"batch_size": batch_size, "max_steps": 3})
        assert isinstance(recipe, WeightsRecipe)
        return recipe

    @flow(name="train-distributed")
    def both() -> tuple[Trained, Trained]:
        one = weights.train(sft(4), job("one"), LoopSettings())
        two = weights.train(sft(2), job("two"), LoopSettings(train=TrainSettings(processes=2)))
        return one, two

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as reef.train_threads does in the flow; the ranks get 1 too
    try:
        one, two = both()
    finally:
        torch.set_num_threads(threads)

    assert one.kind == two.kind == "adapter"
    assert two.path == tmp_path / "two" and (two.path / "adapter_config.json").is_file()
    assert two.metrics["train_rows"] == 4.0 and two.metrics["train_epoch"] == 3.0
    assert math.isclose(one.metrics["train_loss"], two.metrics["train_loss"], rel_tol=1e-5)
    a = load_file(one.path / "adapter_model.safetensors")
    b = load_file(two.path / "adapter_model.safetensors")
    assert a.keys() == b.keys()
    moved = max(t.abs().max().item() for k, t in a.items() if "lora_B" in k)  # 0 at init
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    assert moved > 1e-3
    # Each rank reads its rows' shared prefix once (recipes.shared_prefix): its gradients are
    # summed over 2 rows, not 4, so they round differently, and Adam's first steps move an
    # entry by ~lr whatever its gradient's size: rounding in near-zero entries shows as a few
    # % of lr (4e-5 seen, lr 1e-3; the bound was 1e-5 before the prefix was shared).
    assert diff < 1e-4, f"two ranks differ from one process by {diff:.3g} (moved {moved:.3g})"
