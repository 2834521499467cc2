"""TTT-Discover's hyper-parameters (the TTT-Discover paper), apart so the learner and the recipe
both read them without importing each other."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TTTDParams:
    """Defaults from the TTT-Discover paper (the paper-fidelity run); the CPU demo overrides the
    grid and the LoRA rank (§3.6). Every departure is marked [deviation]."""

    groups_per_step: int = 8  # G: parents (initial states) per step
    rollouts_per_group: int = 64  # R: sibling rollouts per parent; never 2 (§3.2 b)
    learning_rate: float = 4e-5  # Adam, constant
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    kl_coef: float = 0.1  # λ of the centred KL shaping to the frozen base; must be > 0
    lora_r: int = 32
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    # QKV, attention output, MLP gate/up and down: every linear layer but the LM head.
    lora_target_modules: str = "all-linear"
    full: bool = False  # LoRA only: the frozen base is the model under the adapter

    def __post_init__(self) -> None:
        if self.groups_per_step < 1:
            raise ValueError("groups_per_step must be >= 1")
        if self.rollouts_per_group < 3:
            # k = 2 drives the bisection to β·Δr ≈ 41 and a 1e12 advantage (§3.2 b).
            raise ValueError("rollouts_per_group must be >= 3 (R = 2 gives unusable advantages)")
        if self.kl_coef <= 0.0:
            raise ValueError("kl_coef must be > 0 (the paper's setting is 0.1)")
        if self.learning_rate <= 0.0:
            raise ValueError("learning_rate must be > 0")
        if self.full:
            raise ValueError("tttd trains a LoRA adapter (full: false)")
