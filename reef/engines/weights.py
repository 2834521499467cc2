"""Checks on a release's weights before an engine takes them: a LoRA adapter against the base
model's linear layers, a full checkpoint against the base model's tensors (names, shapes and
dtypes, read from safetensors headers without loading a tensor). Nothing moves until they pass."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reef.errors import BadRequest

if TYPE_CHECKING:  # the vLLM engine checks headers only and never loads torch
    import torch


def read_adapter(
    path: Path, linear_shapes: dict[str, tuple[int, int]], model_id: str
) -> tuple[Any, dict[str, torch.Tensor]]:
    """Read a LoRA adapter directory and check its tensors against `linear_shapes` (module name
    -> (in features, out features)) of the base model; returns (LoraConfig, tensors)."""
    from peft import LoraConfig, PeftConfig, load_peft_weights

    def bad(why: str) -> BadRequest:
        return BadRequest(f"adapter {path}: {why}", code="invalid_adapter", param="path")

    if not (path / "adapter_config.json").is_file():
        raise bad("no adapter_config.json")
    if not any((path / f).is_file() for f in ("adapter_model.safetensors", "adapter_model.bin")):
        raise bad("no adapter_model.safetensors")
    try:
        config = PeftConfig.from_pretrained(str(path))
        weights = load_peft_weights(str(path), device="cpu")
    except Exception as exc:  # peft and safetensors raise many kinds on a broken directory
        raise bad(f"cannot be read: {exc}") from exc
    if not isinstance(config, LoraConfig):
        raise bad(f"a {config.peft_type} adapter; only LoRA is served")
    if config.bias != "none":  # it trained the base model's biases, which all rows share
        raise bad(f"trains biases (bias={config.bias!r}); only bias='none' can be served")
    if not weights:
        raise bad("holds no tensors")
    # lora_A is [rank, in features] and lora_B [out features, rank] of the layer it adapts;
    # PEFT's own load would say the same later, but only after changing the model.
    for key, tensor in weights.items():
        module, _, leaf = key.removeprefix("base_model.model.").rpartition(".lora_")
        if leaf not in ("A.weight", "B.weight"):
            continue  # embeddings, DoRA magnitudes...: PEFT's load checks those
        if module not in linear_shapes:
            raise bad(f"adapts '{module}', which the base model {model_id} lacks")
        features_in, features_out = linear_shapes[module]
        want = features_in if leaf == "A.weight" else features_out
        got = tensor.shape[1] if leaf == "A.weight" else tensor.shape[0]
        if tensor.dim() != 2 or got != want:
            raise bad(
                f"{key} has shape {list(tensor.shape)}, but the base model's '{module}' "
                f"maps {features_in} to {features_out} features"
            )
    return config, weights


def check_adapter_specs(
    path: Path, base_dir: Path, model_id: str, max_rank: int | None = None
) -> None:
    """A LoRA adapter directory checked against the base model's safetensors headers only (no
    tensor is loaded): for an engine that loads the adapter itself, such as vLLM, which serves
    ranks up to `max_rank`."""

    def bad(why: str) -> BadRequest:
        return BadRequest(f"adapter {path}: {why}", code="invalid_adapter", param="path")

    try:
        config = json.loads((path / "adapter_config.json").read_text())
        specs = tensor_specs(path)
    except (OSError, ValueError) as exc:
        raise bad(f"cannot be read: {exc}") from exc
    if str(config.get("peft_type", "")).upper() != "LORA":
        raise bad(f"a {config.get('peft_type')} adapter; only LoRA is served")
    if config.get("bias", "none") != "none":
        raise bad(f"trains biases (bias={config.get('bias')!r}); only bias='none' can be served")
    if not specs:
        raise bad("no adapter_model.safetensors")
    rank = config.get("r")
    if max_rank is not None and isinstance(rank, int) and rank > max_rank:
        raise bad(f"rank {rank} is above the engine's largest LoRA rank {max_rank}")
    base = tensor_specs(base_dir)
    for key, (_, shape) in specs.items():
        module, _, leaf = key.removeprefix("base_model.model.").rpartition(".lora_")
        if leaf not in ("A.weight", "B.weight"):
            continue
        weight = base.get(f"{module}.weight")
        if weight is None or len(weight[1]) != 2:
            raise bad(f"adapts '{module}', which the base model {model_id} lacks")
        features_out, features_in = weight[1]
        want, got = (features_in, shape[-1]) if leaf == "A.weight" else (features_out, shape[0])
        if len(shape) != 2 or got != want:
            raise bad(
                f"{key} has shape {list(shape)}, but the base model's '{module}' "
                f"maps {features_in} to {features_out} features"
            )


def check_checkpoint(path: Path, base_dir: Path, model_type: str) -> None:
    """A full checkpoint must be the base model's architecture with the same tensors."""

    def bad(why: str) -> BadRequest:
        return BadRequest(f"checkpoint {path}: {why}", code="invalid_checkpoint", param="path")

    if not (path / "config.json").is_file():
        raise bad("no config.json")
    try:
        theirs_type = json.loads((path / "config.json").read_text()).get("model_type")
        theirs = tensor_specs(path)
    except (OSError, ValueError) as exc:
        raise bad(f"cannot be read: {exc}") from exc
    if theirs_type != model_type:
        raise bad(f"a {theirs_type} model; the base model is {model_type}")
    if not theirs:
        raise bad("no .safetensors weights")
    ours = tensor_specs(base_dir)
    differences = [
        f"{name}: {theirs.get(name, 'missing')} where the base has {ours.get(name, 'none')}"
        for name in sorted(ours.keys() | theirs.keys())
        if theirs.get(name) != ours.get(name)
    ]
    if differences:
        more = f" (and {len(differences) - 3} more)" if len(differences) > 3 else ""
        raise bad("tensors differ from the base model's: " + "; ".join(differences[:3]) + more)


def tensor_specs(directory: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Name -> (dtype, shape) of every tensor in a directory's safetensors files, read from
    their headers without loading a tensor."""
    from safetensors import safe_open

    specs: dict[str, tuple[str, tuple[int, ...]]] = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), framework="numpy") as f:
            for name in f.keys():  # noqa: SIM118 (a safetensors handle is not a dict)
                tensor = f.get_slice(name)
                specs[name] = (tensor.get_dtype(), tuple(tensor.get_shape()))
    return specs
