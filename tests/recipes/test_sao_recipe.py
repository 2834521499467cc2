"""The SAO recipe on the tiny model: rollouts really sampled from it with their log-probs
recorded, one update per rollout, the policy adapter and the critic saved and continued."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import torch

from reef.datasets import SCHEMAS
from reef.errors import ConfigError
from reef.models import resolve_model
from reef.recipe import TrainJob, load_recipe, recipe_class
from reef.settings import LoopSettings

# peft 0.21 asks transformers 5 for a renamed attribute when it wraps a model.
pytestmark = pytest.mark.filterwarnings(
    "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"
)

ROOT = Path(__file__).resolve().parents[2]
SEED_CONFIG = {"recipe": "reef.recipes.sao.recipe:SAORecipe", "batch_size": 1, "max_staleness": 18}
# The default LoRA rate (1e-5) is sized for hundreds of updates; one update should show here.
FAST = {"policy_lr": 1e-3}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return resolve_model("tiny", tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def tiny(tiny_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(tiny_dir)


def sample(model: Any, prompt: list[int], max_new: int, seed: int) -> tuple[list[int], list[float]]:
    """Sample at temperature 1, top-p 1 and record log-softmax of the same weights for each
    picked token, as the embedded engine records them."""
    gen = torch.Generator().manual_seed(seed)
    ids, out, lps = list(prompt), [], []
    with torch.no_grad():
        for _ in range(max_new):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
            logp = torch.log_softmax(logits, dim=-1)
            tok = int(torch.multinomial(logp.exp(), 1, generator=gen))
            ids.append(tok)
            out.append(tok)
            lps.append(float(logp[tok]))
            if tok == model.config.eos_token_id:
                break
    return out, lps


def make_row(
    tiny: tuple[Any, Any],
    question: str,
    score: float,
    *,
    seed: int,
    staleness: int = 0,
    observation: str | None = None,
) -> dict[str, Any]:
    """A rollout row as reef.datasets writes it. With `observation`, a tool result is spliced
    into the middle (mask 0, log-prob 0.0) and the model continues after it."""
    model, tok = tiny
    messages = [{"role": "user", "content": question}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt = tok(text, add_special_tokens=False)["input_ids"]
    completion, logprobs = sample(model, prompt, 6, seed)
    mask = [1] * len(completion)
    if observation is not None:
        inserted = tok(observation, add_special_tokens=False)["input_ids"]
        more, more_lps = sample(model, prompt + completion + inserted, 4, seed + 1)
        completion += inserted + more
        mask += [0] * len(inserted) + [1] * len(more)
        logprobs += [0.0] * len(inserted) + more_lps
    sid = f"rec_{seed}"
    return {
        "sample_id": sid,
        "scenario": "s",
        "record_ids": [sid],
        "release_id": "rel_0",
        "staleness": staleness,
        "report_ids": [f"rep_{seed}"],
        "n_tokens": len(prompt) + len(completion),
        "messages": json.dumps(messages),
        "completion": tok.decode(completion),
        "score": score,
        "report_id": f"rep_{seed}",
        "prompt_token_ids": prompt,
        "completion_token_ids": completion,
        "completion_mask": mask,
        "logprobs": logprobs,
    }


def table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=SCHEMAS["rollout"])


def job(
    tiny_dir: Path, out: Path, rows: list[dict[str, Any]], parent: Path | None = None
) -> TrainJob:
    return TrainJob(
        scenario="s",
        base_model=tiny_dir,
        dataset=table(rows),
        out_dir=out,
        parent_kind="adapter" if parent is not None else "base",
        parent_path=parent,
    )


def rollout_logprob(base_dir: Path, adapter: Path | None, row: dict[str, Any]) -> float:
    """Σ log π(y_t) over the row's generated tokens under base (+ adapter)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from reef.recipes.sao.learner import response_logprobs

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    ids = torch.tensor([row["prompt_token_ids"] + row["completion_token_ids"]])
    with torch.no_grad():
        lp = response_logprobs(model.eval(), ids, len(row["prompt_token_ids"]))
    return float((lp * torch.tensor(row["completion_mask"])).sum())


def test_seed_config_and_light_import() -> None:
    settings = LoopSettings(**SEED_CONFIG)
    recipe = load_recipe(settings.recipe, settings.params)
    assert recipe_class("sao") is type(recipe)
    assert (recipe.name, recipe.kind) == ("sao", "rollout")
    assert recipe.contract.single_receipt and recipe.contract.score
    code = "import sys, recipes.sao.recipe; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.split() == ["False"], out.stderr


def test_params_from_yaml_and_refusals() -> None:
    recipe = load_recipe("sao", {"eps_low": 0.8, "eps_high": 3, "full": True})
    assert recipe.params.eps_high == 3.0
    assert recipe.params.schedule().policy_lr == 2e-6  # the full fine-tune default
    assert load_recipe("sao").params.schedule().policy_lr == 1e-5
    with pytest.raises(ConfigError, match="critic_steps_per_actor"):
        load_recipe("sao", {"critic_steps_per_actor": 0})
    with pytest.raises(ConfigError, match="lambda_critic"):
        load_recipe("sao", {"lambda_critic": 1.5})


def test_rows_that_cannot_train_are_dropped_and_counted(tiny: tuple[Any, Any]) -> None:
    from reef.recipes.sao.rollouts import rollouts_from

    good = make_row(tiny, "What is 2 + 2?", 1.0, seed=1)
    rows = [
        good,
        good | {"sample_id": "a", "logprobs": None},
        good | {"sample_id": "b", "staleness": -1},
        good | {"sample_id": "c", "completion_mask": good["completion_mask"][:-1]},
        good | {"sample_id": "d", "completion_mask": [0] * len(good["completion_mask"])},
        good | {"sample_id": "e", "score": math.nan},
    ]
    kept, dropped = rollouts_from(table(rows))
    assert [r.sample_id for r in kept] == [good["sample_id"]]
    assert kept[0].completion_ids == tuple(good["completion_token_ids"])
    assert dict(dropped) == {
        "no_logprobs": 1,
        "negative_staleness": 1,
        "length_mismatch": 1,
        "no_action_tokens": 1,
        "bad_score": 1,
    }


def test_nothing_to_train_without_logprobs(tiny_dir: Path, tiny: Any, tmp_path: Path) -> None:
    from reef.recipes.training import NothingToTrain

    row = make_row(tiny, "Hello!", 1.0, seed=2) | {"logprobs": None}
    with pytest.raises(NothingToTrain, match="no_logprobs: 1"):
        load_recipe("sao").train(job(tiny_dir, tmp_path / "c", [row]))


@pytest.mark.parametrize("score", [1.0, -1.0])
def test_one_update_follows_the_reward(
    score: float, tiny_dir: Path, tiny: Any, tmp_path: Path
) -> None:
    row = make_row(tiny, "What is the capital of France?", score, seed=3, staleness=2)
    seen: list[tuple[int, int]] = []
    trained = load_recipe("sao", FAST).train(
        job(tiny_dir, tmp_path / "c", [row]), progress=lambda i, n, _m: seen.append((i, n))
    )
    assert trained.kind == "adapter"
    assert trained.trained_sample_ids == (row["sample_id"],)
    assert seen == [(1, 1)]
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (trained.path / name).is_file()
    for name in ("adapter_model.safetensors", "value_head.safetensors", "critic.json"):
        assert (trained.path / "critic" / name).is_file()

    m = trained.metrics
    assert all(math.isfinite(v) for v in m.values())
    # Rollouts recorded from the very weights that train: ρ ≈ 1, nothing outside the band.
    assert m["train_ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert m["train_clipfrac"] == 0.0
    assert m["train_rows_used"] == 1.0 and m["train_rows_dropped"] == 0.0
    assert m["train_policy_lag_mean"] == 2.0 and m["train_effective_token_rate"] == 1.0
    assert m["train_actor_updates"] == 1.0
    assert {"train_policy_loss", "train_value_loss", "train_lambda_policy"} <= set(m)

    before = rollout_logprob(tiny_dir, None, row)
    after = rollout_logprob(tiny_dir, trained.path, row)
    assert after > before if score > 0 else after < before


def test_the_next_release_continues_the_critic(tiny_dir: Path, tiny: Any, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from reef.recipes.sao.critic import CriticLora, critic_path, load_critic

    rows = [
        make_row(tiny, "What is 3 + 4?", 1.0, seed=4),
        make_row(tiny, "Say hello.", 0.0, seed=5, observation="<tool_response> 7 </tool_response>"),
    ]
    # A critic-only warm-up of 2 rollouts, counted over the critic's life: the first release
    # trains only the critic, the second (continuing it) trains the actor too.
    recipe = load_recipe("sao", FAST | {"num_critic_only_steps": 2})
    first = recipe.train(job(tiny_dir, tmp_path / "c1", rows))
    assert first.metrics["train_actor_updates"] == 0.0
    assert "train_explained_variance" in first.metrics  # targets 1 and 0 vary across the job
    state = json.loads((first.path / "critic" / "critic.json").read_text())
    assert state == {"rollouts_seen": 2, "updates": 4}

    second = recipe.train(job(tiny_dir, tmp_path / "c2", rows, parent=first.path))
    assert second.metrics["train_actor_updates"] == 2.0
    assert second.metrics["train_effective_token_rate"] < 1.0  # the spliced tool result
    state = json.loads((second.path / "critic" / "critic.json").read_text())
    assert state == {"rollouts_seen": 4, "updates": 8}
    # What the second job started from is exactly what the first one saved.
    saved = first.path / "critic"
    assert critic_path(first.path) == saved
    critic = load_critic(tiny_dir, saved, CriticLora())
    head1 = load_file(saved / "value_head.safetensors")
    assert head1["weight"].abs().sum() > 0  # it learned from the rewards, starting at zero
    assert torch.equal(critic.head.weight, head1["weight"])
    assert torch.equal(critic.head.bias, head1["bias"])
    lora = {k: v for k, v in critic.backbone.state_dict().items() if "lora_B" in k}
    assert lora and any(v.abs().sum() > 0 for v in lora.values())
    assert critic.rollouts_seen == 2


def test_full_fine_tune_writes_a_checkpoint_and_its_critic(
    tiny_dir: Path, tiny: Any, tmp_path: Path
) -> None:
    row = make_row(tiny, "Name a colour.", 1.0, seed=6)
    trained = load_recipe("sao", {"full": True}).train(job(tiny_dir, tmp_path / "c", [row]))
    assert trained.kind == "checkpoint"
    assert (trained.path / "config.json").is_file()
    assert (trained.path / "critic" / "value_head.safetensors").is_file()
