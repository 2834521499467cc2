"""SAO's value model: the base backbone, frozen, with its own LoRA and a zero-initialised scalar
head on the last hidden states; saved with every candidate so it never cold-starts.

Why frozen base + LoRA rather than a second trainable copy (§1.2 a allows both; Reef 0.1.3
does this when the actor is LoRA): for SmolLM2-135M a trainable fp32 copy with Adam's two
moments and its gradients is ~2 GB of RAM, and since the critic is checkpointed with every
release it would add a 517 MB file to each one. A LoRA critic costs one more frozen copy of the
base (517 MB, no optimizer state) and a few MB per release. Its base is always `job.base_model`,
whatever the policy's parent is, so the saved adapter stays valid on a full-weights chain too.
The forward and backward compute is the same either way.

On disk (`<candidate>/critic/`): the PEFT adapter files, `value_head.safetensors`, and
`critic.json` (how many rollouts and updates it has seen, for the critic-only warm-up).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

CRITIC_DIR = "critic"
HEAD_FILE = "value_head.safetensors"
STATE_FILE = "critic.json"


@dataclass(frozen=True)
class CriticLora:
    r: int = 16
    alpha: int = 32
    target_modules: str = "all-linear"


class Critic(torch.nn.Module):
    """V(s_t) for every position of a token sequence."""

    def __init__(self, backbone: Any, head: torch.nn.Linear, rollouts_seen: int = 0):
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.rollouts_seen = rollouts_seen  # persisted: the warm-up counts across releases
        self.updates = 0

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(1, T) ids -> (T,) values; position i values the state after tokens 0..i."""
        hidden = self.backbone(input_ids=input_ids).last_hidden_state  # (1, T, H), final norm
        return self.head(hidden.to(self.head.weight.dtype)).squeeze(-1).squeeze(0)

    def trainable(self) -> list[torch.nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def save(self, out_dir: Path) -> Path:
        from safetensors.torch import save_file

        path = out_dir / CRITIC_DIR
        path.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(path)
        save_file(
            {k: v.detach().contiguous() for k, v in self.head.state_dict().items()},
            path / HEAD_FILE,
        )
        (path / STATE_FILE).write_text(
            json.dumps({"rollouts_seen": self.rollouts_seen, "updates": self.updates}, indent=2)
            + "\n"
        )
        return path


def critic_path(parent: Path | None) -> Path | None:
    """The parent release's saved critic, when it has one."""
    if parent is None:
        return None
    path = Path(parent) / CRITIC_DIR
    return path if (path / HEAD_FILE).is_file() else None


def load_critic(base_model: Path, saved: Path | None, lora: CriticLora) -> Critic:
    """The saved critic (trainable) when `saved` is given, else a fresh one whose LoRA and head
    start at zero, so it predicts V = 0 everywhere until it has seen a reward."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    # The backbone without the LM head: the critic never needs the vocabulary projection.
    # (Loaded as the causal LM it was saved as, so transformers does not report the head's
    # weights as unexpected, then unwrapped.)
    base: Any = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32).base_model
    head = torch.nn.Linear(int(base.config.hidden_size), 1, dtype=torch.float32)
    if saved is not None:
        backbone = PeftModel.from_pretrained(base, saved, is_trainable=True)
        head.load_state_dict(load_file(saved / HEAD_FILE))
        state = (
            json.loads((saved / STATE_FILE).read_text()) if (saved / STATE_FILE).is_file() else {}
        )
        critic = Critic(backbone, head, rollouts_seen=int(state.get("rollouts_seen", 0)))
        critic.updates = int(state.get("updates", 0))
        return critic
    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, target_modules=lora.target_modules)
    backbone = get_peft_model(base, config)
    # Zero head (weight and bias): V ≡ 0 at the start (§1.2 a, critic_value_head_zero_init).
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.zeros_(head.bias)
    return Critic(backbone, head)
