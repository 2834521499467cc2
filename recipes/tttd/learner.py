"""One TTT-Discover step on a full grid: advantages per group, KL shaping to the frozen base,
the un-clipped token-sum IS loss, one Adam step; the candidate adapter with its optimizer state
and the best program so far (the TTT-Discover paper)."""

from __future__ import annotations

import hashlib
import json
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from reef.errors import ReefError
from reef.recipe import Progress, Trained, TrainJob
from reef.recipes.shared_prefix import response_logprobs_after
from reef.recipes.training import LoraParams, load_policy, save_candidate
from reef.recipes.tttd.objective import constant, group_advantages, is_loss, kl_shaping
from reef.recipes.tttd.params import TTTDParams

STATE_DIR = "tttd"
OPTIMIZER_FILE = "optimizer.pt"
BEST_FILE = "best.json"
PROGRAM_FILE = "best.py"
# How much of the best program a release's metadata holds (the whole program is the release's
# tttd/best.py): metadata lives in the chain's rows and every release listing returns it.
METADATA_PROGRAM_CHARS = 8192
# Any fenced block: a python program, or an edit action's ```json list (demo/discover/actions.py).
_FENCE = re.compile(r"```[\w+-]*[ \t]*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class GridRollout:
    sample_id: str
    group: int
    reward: float
    prompt_ids: list[int]
    completion_ids: list[int]
    mask: list[int]
    sampler_logprobs: list[float]
    completion: str
    record_id: str


def _rollout(row: dict[str, Any]) -> GridRollout:
    meta = json.loads(row["report_metadata"])
    if row["logprobs"] is None or len(row["logprobs"]) != len(row["completion_token_ids"]):
        raise ReefError(
            f"tttd: rollout {row['sample_id']} has no per-token log-probs: the IS loss needs "
            "the engine's recorded sampling log-probs",
            code="no_logprobs",
        )
    if not row["completion_token_ids"]:
        raise ReefError(f"tttd: rollout {row['sample_id']} is empty", code="empty_rollout")
    return GridRollout(
        sample_id=row["sample_id"],
        group=int(meta["group"]),
        reward=float(row["score"]),
        prompt_ids=list(row["prompt_token_ids"]),
        completion_ids=list(row["completion_token_ids"]),
        mask=[int(m) for m in row["completion_mask"]],
        sampler_logprobs=[float(x) for x in row["logprobs"]],
        completion=row["completion"],
        record_id=row["record_ids"][0],
    )


def last_program(text: str) -> str | None:
    """The last fenced block of a completion (the program the harness ran, or the action it
    applied)."""
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else None


def _groups(rollouts: list[GridRollout]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for i, r in enumerate(rollouts):
        out.setdefault(r.group, []).append(i)
    return dict(sorted(out.items()))


def _reward_stats(rewards: list[float]) -> dict[str, float]:
    return {
        "train_reward_mean": statistics.fmean(rewards),
        "train_reward_std": statistics.pstdev(rewards),
        "train_reward_min": min(rewards),
        "train_reward_max": max(rewards),
        "train_reward_zero_fraction": sum(r == 0.0 for r in rewards) / len(rewards),
    }


def advantages(rollouts: list[GridRollout]) -> tuple[dict[int, float], dict[str, float]]:
    """Per-rollout advantages of the training groups, and the group statistics. Constant
    groups are removed; when every group is constant the first is kept (a zero-signal step)."""
    groups = _groups(rollouts)
    training = {g: ix for g, ix in groups.items() if not constant([rollouts[i].reward for i in ix])}
    if not training:
        first = next(iter(groups))
        training = {first: groups[first]}
    adv: dict[int, float] = {}
    betas = []
    for ix in training.values():
        beta, values = group_advantages([rollouts[i].reward for i in ix])
        betas.append(beta)
        adv |= dict(zip(ix, values, strict=True))
    stats = {
        "train_groups": float(len(groups)),
        "train_constant_groups": float(len(groups) - len(training)),
        "train_training_groups": float(len(training)),
        "train_beta_mean": statistics.fmean(betas),
        "train_beta_max": max(betas),
    }
    return adv, stats


def _load_optimizer(opt: torch.optim.Optimizer, parent: Path | None) -> bool:
    """Continue the parent release's Adam moments (one optimizer across the run, as upstream)."""
    path = parent / STATE_DIR / OPTIMIZER_FILE if parent is not None else None
    if path is None or not path.is_file():
        return False
    try:
        opt.load_state_dict(torch.load(path, weights_only=True))
    except (ValueError, RuntimeError, KeyError):
        return False  # another adapter shape (e.g. a changed rank): start the moments afresh
    return True


def best_so_far(
    parent: Path | None, rollouts: list[GridRollout], step: int
) -> dict[str, Any] | None:
    """The better of the parent release's best program and this grid's best valid one."""
    best: dict[str, Any] | None = None
    if parent is not None and (parent / STATE_DIR / BEST_FILE).is_file():
        best = json.loads((parent / STATE_DIR / BEST_FILE).read_text())
    for r in rollouts:
        program = last_program(r.completion)
        if r.reward > 0.0 and program is not None and (best is None or r.reward > best["reward"]):
            best = {
                "reward": r.reward,
                "step": step,
                "record_id": r.record_id,
                "program": program,
            }
    return best


def best_metadata(best: dict[str, Any]) -> dict[str, Any]:
    """What the release's metadata says about the best program so far: its verified score
    and where it came from, its content hash and a size-capped copy (the full text is the
    release's `tttd/best.py`)."""
    program = str(best["program"])
    return {
        "best_score": float(best["reward"]),
        "best_step": int(best["step"]),
        "best_record_id": best.get("record_id"),
        "best_program": {
            "sha256": hashlib.sha256(program.encode()).hexdigest(),
            "chars": len(program),
            "text": program[:METADATA_PROGRAM_CHARS],
            "truncated": len(program) > METADATA_PROGRAM_CHARS,
            "file": f"{STATE_DIR}/{PROGRAM_FILE}",
        },
    }


def train_grid(
    job: TrainJob,
    p: TTTDParams,
    step: int,
    rows: list[dict[str, Any]],
    progress: Progress | None = None,
) -> Trained:
    rollouts = [_rollout(r) for r in rows]
    adv, metrics = advantages(rollouts)
    metrics |= _reward_stats([r.reward for r in rollouts])
    lora = LoraParams(p.lora_r, p.lora_alpha, p.lora_dropout, p.lora_target_modules)
    policy, tokenizer = load_policy(job, lora)
    params = [q for q in policy.parameters() if q.requires_grad]
    opt = _optimizer(params, p)
    continued = _load_optimizer(opt, job.parent_path)
    policy.train()
    train = sorted(adv)
    sampler = [torch.tensor(rollouts[i].sampler_logprobs, dtype=torch.float32) for i in train]
    masks = [torch.tensor(rollouts[i].mask, dtype=torch.float32) for i in train]
    chosen = [rollouts[i] for i in train]
    groups = _by_prompt(chosen)

    # π_0: the same network with its adapters disabled (§3.2 d), no gradient.
    base: list[Any] = [None] * len(train)
    with torch.no_grad(), policy.disable_adapter():
        for ks in groups:
            for k, lp in zip(ks, _logprobs(policy, chosen, ks), strict=True):
                base[k] = lp
    offsets, kl = kl_shaping(sampler, base, masks, p.kl_coef)

    # One step over the whole grid: the token-sum loss is accumulated prompt by prompt.
    opt.zero_grad(set_to_none=True)
    loss_sum, ratio_sum, ratio_dev, tokens = 0.0, 0.0, 0.0, 0.0
    done = 0
    for ks in groups:
        losses = []
        for k, logprobs in zip(ks, _logprobs(policy, chosen, ks), strict=True):
            # Tokens the environment inserted have no sampling log-prob (Reef records 0.0
            # there), so the IS term covers generated tokens; a single-turn rollout is all
            # generated.
            gen = masks[k] > 0
            losses.append(
                is_loss(logprobs[gen], sampler[k][gen], (adv[train[k]] + offsets[k])[gen])
            )
            ratio = torch.exp(logprobs.detach()[gen] - sampler[k][gen])
            ratio_sum += float(ratio.sum())
            ratio_dev += float((ratio - 1.0).abs().sum())
            tokens += float(gen.sum())
        loss = torch.stack(losses).sum()
        loss.backward()
        loss_sum += loss.item()
        done += len(ks)
        if progress is not None:
            progress(done, len(train), {"loss": loss_sum})
    grad_norm = math.sqrt(sum(float((q.grad**2).sum()) for q in params if q.grad is not None))
    opt.step()

    kind = save_candidate(policy, tokenizer, job)
    metadata = _save_state(job, opt, rollouts, step, metrics)
    metrics |= {
        "train_step": float(step),
        "train_loss": loss_sum,
        "train_kl_to_base": kl,
        "train_ratio_mean": ratio_sum / max(tokens, 1.0),
        "train_ratio_dev": ratio_dev / max(tokens, 1.0),
        "train_tokens": tokens,
        "train_rollouts": float(len(train)),
        "train_grad_norm": grad_norm,
        "train_optimizer_continued": float(continued),
    }
    return Trained(
        kind,
        path=job.out_dir,
        metrics=metrics,
        trained_sample_ids=tuple(r["sample_id"] for r in rows),
        metadata=metadata,
    )


def _by_prompt(rollouts: list[GridRollout]) -> list[list[int]]:
    """The rollouts' indices grouped by prompt, in order: a group's rollouts answer the same
    prompt, which each pass reads once (recipes.shared_prefix), its completions in one batch."""
    out: dict[tuple[int, ...], list[int]] = {}
    for k, r in enumerate(rollouts):
        out.setdefault(tuple(r.prompt_ids), []).append(k)
    return list(out.values())


def _logprobs(model: Any, rollouts: list[GridRollout], ks: list[int]) -> list[torch.Tensor]:
    """The response log-probs of rollouts `ks` (one prompt) under `model`."""
    prompt = rollouts[ks[0]].prompt_ids
    return response_logprobs_after(model, prompt, [rollouts[k].completion_ids for k in ks])


def _optimizer(params: list[torch.nn.Parameter], p: TTTDParams) -> torch.optim.Adam:
    """Adam over the adapter's parameters, as the recipe's params set it (no weight decay)."""
    return torch.optim.Adam(
        params,
        lr=p.learning_rate,
        betas=(p.adam_beta1, p.adam_beta2),
        eps=p.adam_eps,
        weight_decay=0.0,
    )


def _save_state(
    job: TrainJob,
    opt: torch.optim.Optimizer,
    rollouts: list[GridRollout],
    step: int,
    metrics: dict[str, float],
) -> dict[str, Any]:
    """The release's tttd/ state: the optimizer's moments (the next step continues them) and
    the best program so far (the parent's or this grid's), whose score goes into `metrics`;
    the release's metadata."""
    state = job.out_dir / STATE_DIR
    state.mkdir(parents=True, exist_ok=True)
    torch.save(opt.state_dict(), state / OPTIMIZER_FILE)
    best = best_so_far(job.parent_path, rollouts, step)
    if best is None:
        return {}
    metadata = best_metadata(best)
    (state / BEST_FILE).write_text(json.dumps(best, indent=2) + "\n")
    (state / PROGRAM_FILE).write_text(best["program"])
    metrics["tttd_best_reward"] = float(best["reward"])
    metrics["tttd_best_step"] = float(best["step"])
    _log_best(best)
    return metadata


def _log_best(best: dict[str, Any]) -> None:
    """The best program in the flow's MLflow run, when there is one (the evolve flow's)."""
    import mlflow

    if mlflow.active_run() is not None:
        mlflow.log_text(best["program"], f"{STATE_DIR}/{PROGRAM_FILE}")
        mlflow.set_tag("tttd.best_reward", repr(best["reward"]))
