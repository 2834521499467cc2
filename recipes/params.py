"""Hyper-parameters every TRL recipe shares (torch-free, so choosing a recipe stays cheap).

A recipe's Params dataclass subclasses TRLParams and adds its method's own; a field it
redeclares takes that recipe's default. `recipes.training.run_args` turns these into the
TRL config arguments all four TRL recipes pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class TRLParams:
    epochs: float = 3.0  # TrainingArguments' default
    batch_size: int = 4
    gradient_accumulation_steps: int = 1
    # None: `lora_learning_rate` with LoRA, `full_learning_rate` for a full fine-tune.
    learning_rate: float | None = None
    max_steps: int = -1  # > 0 caps the run (smoke tests); -1 trains the full epochs
    # full: true trains every weight and writes a checkpoint; else LoRA writes an adapter.
    full: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target_modules: str = "all-linear"

    # TRL's learning rate 1e-6 is for full fine-tunes, and LoRA wants about ten times a full
    # fine-tune's rate ("LoRA Without Regret", Schulman et al. 2025).
    lora_learning_rate: ClassVar[float] = 1e-5
    full_learning_rate: ClassVar[float] = 1e-6
