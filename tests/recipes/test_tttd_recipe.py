"""The tttd recipe on the tiny model: a grid of rollouts really sampled from it with their
log-probs recorded, one optimizer step per grid that follows the advantages, the adapter saved
with its Adam state and the best program, both carried to the next step."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import torch

from reef.datasets import SCHEMAS
from reef.errors import ReefError
from reef.models import resolve_model
from reef.recipe import TrainJob, load_recipe
from reef.recipes.tttd.grid import grid_metadata
from tests.recipes.test_sao_recipe import rollout_logprob, sample

pytestmark = pytest.mark.filterwarnings(
    "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"
)
G, R = 2, 3
FAST = {"groups_per_step": G, "rollouts_per_group": R, "learning_rate": 1e-2, "lora_r": 8}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return resolve_model("tiny", tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def tiny(tiny_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(tiny_dir)


def grid_rows(tiny: tuple[Any, Any], step: int, rewards: list[list[float]]) -> list[dict]:
    model, tok = tiny
    rows = []
    for g in range(G):
        messages = [{"role": "user", "content": f"Pack circles, parent {g}"}]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt = tok(text, add_special_tokens=False)["input_ids"]
        for r in range(R):
            completion, logprobs = sample(model, prompt, 6, seed=100 * step + 10 * g + r)
            sid = f"rec_{step}_{g}_{r}"
            score = rewards[g][r]
            rows.append(
                {
                    "sample_id": sid,
                    "scenario": "s",
                    "record_ids": [sid],
                    "release_id": "rel_0",
                    "staleness": 0,
                    "report_ids": [f"rpt_{sid}"],
                    "n_tokens": len(prompt) + len(completion),
                    "messages": json.dumps(messages),
                    "completion": f"plan\n```python\nSCORE = {score}\n```\n",
                    "score": score,
                    "report_id": f"rpt_{sid}",
                    "prompt_token_ids": prompt,
                    "completion_token_ids": completion,
                    "completion_mask": [1] * len(completion),
                    "logprobs": logprobs,
                    "report_metadata": json.dumps(grid_metadata(step, g, r, G, R)),
                    "reported_at": f"2026-01-01T00:00:0{r}+00:00",
                }
            )
    return rows


def job(tiny_dir: Path, out: Path, rows: list[dict], parent: Path | None = None) -> TrainJob:
    return TrainJob(
        scenario="s",
        base_model=tiny_dir,
        dataset=pa.Table.from_pylist(rows, schema=SCHEMAS["rollout"]),
        out_dir=out,
        parent_kind="adapter" if parent is not None else "base",
        parent_path=parent,
    )


def test_one_step_per_grid_follows_the_advantages(
    tiny_dir: Path, tiny: Any, tmp_path: Path
) -> None:
    # Group 0 carries the signal; group 1 is constant and is removed.
    rows = grid_rows(tiny, 0, [[0.0, 1.0, 2.0], [0.5, 0.5, 0.5]])
    recipe = load_recipe("tttd", FAST)
    trained = recipe.train(job(tiny_dir, tmp_path / "c1", rows))  # type: ignore[attr-defined]
    m = trained.metrics
    assert trained.kind == "adapter" and (tmp_path / "c1" / "adapter_config.json").is_file()
    assert m["train_constant_groups"] == 1 and m["train_training_groups"] == 1
    assert m["train_rollouts"] == R and m["train_step"] == 0
    # sampled from the base itself: ratio ≈ 1 and no KL to the base yet
    assert abs(m["train_kl_to_base"]) < 1e-4 and abs(m["train_ratio_mean"] - 1) < 1e-3
    assert m["train_beta_mean"] > 0 and m["train_optimizer_continued"] == 0
    # the best rollout gained probability, the worst lost it
    best, worst = rows[2], rows[0]
    assert rollout_logprob(tiny_dir, tmp_path / "c1", best) > rollout_logprob(tiny_dir, None, best)
    assert rollout_logprob(tiny_dir, tmp_path / "c1", worst) < rollout_logprob(
        tiny_dir, None, worst
    )
    saved = json.loads((tmp_path / "c1" / "tttd" / "best.json").read_text())
    assert saved["reward"] == 2.0 and saved["program"] == "SCORE = 2.0\n"
    assert m["tttd_best_reward"] == 2.0
    # the release's metadata: the verified score and the program (hash and capped copy)
    meta = trained.metadata
    assert meta["best_score"] == 2.0 and meta["best_step"] == 0
    assert meta["best_record_id"] == rows[2]["record_ids"][0]
    program = meta["best_program"]
    assert program["text"] == "SCORE = 2.0\n" and program["truncated"] is False
    assert program["sha256"] == hashlib.sha256(b"SCORE = 2.0\n").hexdigest()
    assert program["file"] == "tttd/best.py"
    assert (tmp_path / "c1" / "tttd" / "optimizer.pt").is_file()
    assert set(trained.trained_sample_ids) == {r["sample_id"] for r in rows}

    # The next step continues the adapter and Adam, and keeps the better best program.
    rows2 = grid_rows(tiny, 1, [[0.0, 0.0, 1.0], [0.2, 0.0, 0.1]])
    second = recipe.train(  # type: ignore[attr-defined]
        job(tiny_dir, tmp_path / "c2", rows2, parent=tmp_path / "c1")
    )
    assert second.metrics["train_optimizer_continued"] == 1
    assert second.metrics["train_training_groups"] == 2
    assert second.metrics["tttd_best_reward"] == 2.0 and second.metrics["tttd_best_step"] == 0
    assert second.metadata["best_score"] == 2.0 and second.metadata["best_step"] == 0


def test_an_incomplete_grid_does_not_train(tiny_dir: Path, tiny: Any, tmp_path: Path) -> None:
    rows = grid_rows(tiny, 0, [[0.0, 1.0, 2.0], [0.0, 1.0, 2.0]])[:-1]
    recipe = load_recipe("tttd", FAST)
    with pytest.raises(ReefError, match="no full 2x3 grid"):
        recipe.train(job(tiny_dir, tmp_path / "c", rows))  # type: ignore[attr-defined]
    assert not (tmp_path / "c").exists()


def test_the_release_metadata_caps_a_long_program() -> None:
    from reef.recipes.tttd.learner import METADATA_PROGRAM_CHARS, best_metadata

    program = "x = 1\n" * 3000
    meta = best_metadata({"reward": 1.5, "step": 3, "record_id": "rec_1", "program": program})
    assert meta["best_score"] == 1.5 and meta["best_step"] == 3
    shown = meta["best_program"]
    assert shown["truncated"] is True and shown["chars"] == len(program)
    assert shown["text"] == program[:METADATA_PROGRAM_CHARS]
    assert shown["sha256"] == hashlib.sha256(program.encode()).hexdigest()
