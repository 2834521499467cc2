"""What every recipe does around its trainer: load the policy (base model plus the head
release, LoRA or full weights), hand TRL its CPU-safe arguments, report progress, and save
the candidate as an adapter or a checkpoint."""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from reef.errors import NothingToTrain as NothingToTrain  # recipes raise it from here
from reef.experience import correction as correction  # recipes read it from here
from reef.recipe import Progress, ReleaseKind, Trained, TrainJob
from reef.recipes.params import TRLParams

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoraParams:
    """LoRA on every linear layer: attention-only at low rates barely moved SmolLM2 (design
    guide, measured), all-linear r 16 / alpha 32 learned a style from 8 examples."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: str = "all-linear"


# The base model's weights, read once per process: the worker trains and evaluates on the same
# base round after round (path -> (its files' mtimes, the model)).
_BASE: dict[Path, tuple[tuple[int, ...], Any]] = {}
_BASE_LOCK = threading.Lock()


def shared_base(path: Path) -> Any:
    """The base model at `path` for uses that never write its weights (LoRA training, where
    the base is frozen, and evaluation): a model of its own whose weight tensors are shared
    with one copy this process keeps in memory, read from disk once (again when the files
    change). Measured on SmolLM2-135M: 0.1-0.2 s against 0.4-0.5 s for a warm
    `from_pretrained`, which a round paid three times (train, then the head and the candidate
    in evaluation). A full fine-tune or a merge writes the weights in place: those load their
    own copy with `from_pretrained`."""
    import copy

    from transformers import AutoModelForCausalLM

    key = path.resolve()
    if not key.is_dir():  # not local files (e.g. a hub id): nothing to keep
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    stamp = tuple(f.stat().st_mtime_ns for f in sorted(key.iterdir()) if f.is_file())
    with _BASE_LOCK:
        cached = _BASE.get(key)
        if cached is None or cached[0] != stamp:
            _BASE.clear()  # one base at a time: the served model's
            model = AutoModelForCausalLM.from_pretrained(key, dtype=torch.float32)
            model.requires_grad_(False)
            cached = _BASE[key] = (stamp, model)
    kept = cached[1]
    # New Parameter objects over the same tensors (tied weights stay tied): each copy's
    # requires_grad and device moves are its own; the modules and buffers are copied.
    shared = {id(p): torch.nn.Parameter(p.data) for p in kept.parameters()}
    return copy.deepcopy(kept, memo=shared)


def load_policy(job: TrainJob, lora: LoraParams | None) -> tuple[Any, Any]:
    """(model, tokenizer) to train: the head release on top of the base.

    LoRA (`lora` given): a parent adapter is loaded trainable and trained further, so releases
    build on each other; on a checkpoint parent a fresh adapter is trained and merged at save
    time (an adapter is only ever relative to the base model). Full weights (`lora` None): the
    parent checkpoint, or the base with a parent adapter merged in.
    """
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(job.seed)
    tokenizer = AutoTokenizer.from_pretrained(job.base_model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    source = job.parent_path if job.parent_kind == "checkpoint" else job.base_model
    assert source is not None, "a checkpoint parent needs its files"
    if lora is not None and source == job.base_model:
        model = shared_base(job.base_model)  # LoRA leaves the base weights as they are
    else:  # a full fine-tune or a merge writes the weights: a copy of its own
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    if job.parent_kind == "adapter":
        assert job.parent_path is not None
        if lora is not None:
            return PeftModel.from_pretrained(model, job.parent_path, is_trainable=True), tokenizer
        model = PeftModel.from_pretrained(model, job.parent_path).merge_and_unload()
        # PEFT froze the base weights when it wrapped them; a full fine-tune trains them all.
        model.requires_grad_(True)
    if lora is None:
        return model, tokenizer
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config), tokenizer


def save_candidate(model: Any, tokenizer: Any, job: TrainJob) -> ReleaseKind:
    """Write the trained policy to job.out_dir; returns what was written."""
    from peft import PeftModel

    job.out_dir.mkdir(parents=True, exist_ok=True)
    if release_kind(model, job) == "adapter":
        model.save_pretrained(str(job.out_dir))
        return "adapter"
    if isinstance(model, PeftModel):
        model = model.merge_and_unload()
    model.save_pretrained(job.out_dir)
    tokenizer.save_pretrained(job.out_dir)
    return "checkpoint"


def release_kind(model: Any, job: TrainJob) -> ReleaseKind:
    """What `save_candidate` writes for this policy: an adapter (LoRA on the base or on a
    parent adapter), else a checkpoint (full weights, or LoRA merged into a checkpoint)."""
    from peft import PeftModel

    if isinstance(model, PeftModel) and job.parent_kind != "checkpoint":
        return "adapter"
    return "checkpoint"


def trl_args(out_dir: Any, seed: int, **params: Any) -> dict[str, Any]:
    """Keyword arguments every TRL config gets here: CPU, fp32, nothing saved or reported
    behind our back (the flow logs to MLflow itself), a log line per step."""
    return {
        "output_dir": str(out_dir),
        "use_cpu": not torch.cuda.is_available(),
        "bf16": False,
        "fp16": False,
        "report_to": "none",
        "save_strategy": "no",
        "logging_steps": 1,
        "seed": seed,
        "data_seed": seed,
        "dataloader_num_workers": 0,
        **params,
    }


def run_args(p: TRLParams, job: TrainJob, lora: LoraParams | None, **params: Any) -> dict:
    """`trl_args` with the hyper-parameters every TRL recipe shares, from `p`, and the
    recipe's own `params`: the learning rate is `p.learning_rate`, or the recipe's default
    for LoRA or for a full fine-tune."""
    lr = p.learning_rate
    if lr is None:
        lr = p.lora_learning_rate if lora is not None else p.full_learning_rate
    return trl_args(
        job.out_dir,
        job.seed,
        num_train_epochs=p.epochs,
        max_steps=p.max_steps,
        per_device_train_batch_size=p.batch_size,
        gradient_accumulation_steps=p.gradient_accumulation_steps,
        learning_rate=lr,
        # Small models on CPU: recomputing activations costs time and saves little.
        activation_checkpointing=False,
        **params,
    )


def progress_callback(progress: Progress | None) -> Any:
    """A transformers TrainerCallback forwarding each logged step to `progress`."""
    from transformers import TrainerCallback

    class _Forward(TrainerCallback):
        def __init__(self) -> None:
            self.metrics: dict[str, float] = {}

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **_: Any) -> None:
            for key, value in (logs or {}).items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self.metrics[key] = float(value)
            if progress is not None:
                progress(state.global_step, state.max_steps, dict(self.metrics))

    return _Forward()


def final_metrics(log_history: list[Mapping[str, Any]]) -> dict[str, float]:
    """The last value of every numeric metric a trainer logged, prefixed `train_`."""
    out: dict[str, float] = {}
    for entry in log_history:
        for key, value in entry.items():
            if isinstance(value, (int, float)) and math.isfinite(value) and key != "step":
                out[key if key.startswith("train_") else f"train_{key}"] = float(value)
    return out


# Shared by the TRL recipes (sft, kto, dpo, grpo): rows to chat data, the LoRA-or-full choice
# from flat YAML params, and the reference policy the preference methods compare against.


def lora_from(params: Any) -> LoraParams | None:
    """LoraParams from a recipe's flat params (`full`, `lora_r`, `lora_alpha`, `lora_dropout`,
    `lora_target_modules`); None when `full` asks for a full fine-tune."""
    if params.full:
        return None
    return LoraParams(
        r=params.lora_r,
        alpha=params.lora_alpha,
        dropout=params.lora_dropout,
        target_modules=params.lora_target_modules,
    )


def chat_messages(text: str) -> list[dict[str, Any]]:
    """A dataset's `messages` JSON as chat messages a text chat template can render: content
    given as parts is joined to its text (images and audio are not trained on here)."""
    out = []
    for message in json.loads(text):
        message = dict(message)
        content = message.get("content")
        if isinstance(content, list):
            message["content"] = "".join(
                part.get("text", "") for part in content if isinstance(part, dict)
            )
        elif content is None:
            message["content"] = ""
        out.append(message)
    return out


def reference_model(model: Any) -> Any:
    """The frozen reference for DPO/KTO: None for a PEFT policy (TRL copies the adapter it
    starts from, or disables a fresh one), else a copy of the starting weights. TRL would
    otherwise reload the reference from the config's path, which for a merged parent adapter
    is the bare base model, not the head the candidate continues from."""
    import copy

    from peft import PeftModel

    if isinstance(model, PeftModel):
        return None
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def fit(
    trainer: Any, tokenizer: Any, job: TrainJob, ids: Sequence[str], metrics: Mapping[str, float]
) -> Trained:
    """Run a built TRL trainer, drop the reference adapter TRL may have added, save the
    candidate into `job.out_dir`, and report it with the last logged metrics and `metrics`."""
    trainer.train()
    drop_reference_adapter(trainer.model)
    # Under accelerate launch (recipes.distributed) every rank holds the same trained weights
    # and rank 0 alone writes them; a single process is rank 0.
    if trainer.is_world_process_zero():
        kind = save_candidate(trainer.model, tokenizer, job)
    else:
        kind = release_kind(trainer.model, job)
    return Trained(
        kind,
        path=job.out_dir,
        metrics=final_metrics(trainer.state.log_history) | dict(metrics),
        trained_sample_ids=tuple(ids),
    )


def drop_reference_adapter(model: Any) -> None:
    """Remove the frozen "ref" adapter TRL adds next to a pretrained one, so only the trained
    adapter is saved (PEFT would save every adapter of the model)."""
    from peft import PeftModel

    if isinstance(model, PeftModel) and "ref" in model.peft_config:
        model.set_adapter("default")
        model.delete_adapter("ref")
