"""One OpenClaw-RL optimizer step per batch of judged turns (the OpenClaw-RL paper).

The policy is a PEFT LoRA model; its teacher is the same model with the adapters disabled, the
frozen initial weights (exactly §2.5's "same PEFT model with adapters disabled"), run
forward-only on each candidate: the hint-enhanced prompt (re-rendered through the chat
template) followed by the turn's native response ids, so teacher and student positions line
up token for token. The anchor candidate is the recorded prompt ids themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from reef.judge import append_hint
from reef.recipes.openclaw.objective import (
    Selection,
    opd_loss,
    overlaps,
    rl_loss,
    select_candidate,
)
from reef.recipes.openclaw.turns import JudgedTurn


@dataclass(frozen=True)
class Setup:
    """What the learner needs from OpenClawParams."""

    lr: float
    weight_decay: float
    betas: tuple[float, float]
    temperature: float
    w_rl: float
    w_opd: float
    diff_clip: float
    eps: float
    eps_high: float
    selection: Selection
    max_grad_norm: float | None
    anchor: bool = True  # unhinted ±1 turns distil toward the base on the plain prompt


def response_logits(model: Any, ids: list[int], prompt_len: int, temperature: float) -> Any:
    """Tempered log-softmax over the vocabulary at every response position, (L, V)."""
    length = len(ids) - prompt_len
    x = torch.tensor([ids], dtype=torch.long)
    logits = model(input_ids=x, logits_to_keep=length + 1).logits[0, :-1].float()
    return torch.log_softmax(logits / temperature, dim=-1)


class OpenClawLearner:
    def __init__(self, policy: Any, tokenizer: Any, setup: Setup):
        self.policy = policy
        self.tokenizer = tokenizer
        self.s = setup
        params = [p for p in policy.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(
            params, lr=setup.lr, weight_decay=setup.weight_decay, betas=setup.betas
        )
        self.policy.train()

    def candidates(self, turn: JudgedTurn) -> list[list[int]]:
        """Each teacher candidate's prompt ids (the response ids are appended by the caller):
        one per hint, or the recorded prompt itself (the anchor)."""
        if not turn.hints:
            return [list(turn.prompt_ids)]
        out = []
        for hint in turn.hints:
            text = self.tokenizer.apply_chat_template(
                append_hint(turn.messages, hint), tokenize=False, add_generation_prompt=True
            )
            out.append(list(self.tokenizer(text, add_special_tokens=False).input_ids))
        return out

    @torch.no_grad()
    def teacher(self, turn: JudgedTurn) -> tuple[torch.Tensor, torch.Tensor]:
        """(ℓ_T^{k*} gathered on S^q (L, K), k* per token (L,)) from the frozen initial
        weights on every candidate."""
        s_ids = torch.tensor(turn.topk_ids, dtype=torch.long)
        k = s_ids.shape[1]
        on_s, top = [], []
        with self.policy.disable_adapter():
            for prompt in self.candidates(turn):
                lsm = response_logits(
                    self.policy, prompt + list(turn.completion_ids), len(prompt), self.s.temperature
                )
                on_s.append(lsm.gather(-1, s_ids))
                top.append(lsm.topk(k, dim=-1).indices)
        kstar = select_candidate(overlaps(s_ids, torch.stack(top)), self.s.selection)
        chosen = torch.stack(on_s)[kstar, torch.arange(len(kstar))]
        return chosen, kstar

    def step(self, batch: list[JudgedTurn]) -> dict[str, float]:
        """One optimizer step on the batch: per-turn losses (token means), batch mean."""
        s = self.s
        self.opt.zero_grad(set_to_none=True)
        totals = {"loss": 0.0, "rl_loss": 0.0, "opd_loss": 0.0, "opd_advantage_abs": 0.0}
        for turn in batch:
            distil = s.w_opd and (turn.hints or s.anchor)
            teacher_on_s = self.teacher(turn) if distil else None
            ids = list(turn.prompt_ids) + list(turn.completion_ids)
            lsm = response_logits(self.policy, ids, len(turn.prompt_ids), s.temperature)
            y = torch.tensor(turn.completion_ids, dtype=torch.long)
            mask = torch.ones(len(y))
            loss = torch.zeros(())
            if s.w_rl:
                rl = rl_loss(
                    lsm.gather(-1, y[:, None])[:, 0],
                    turn.reward,
                    mask,
                    eps=s.eps,
                    eps_high=s.eps_high,
                )
                loss = loss + s.w_rl * rl
                totals["rl_loss"] += rl.item() / len(batch)
            if teacher_on_s is not None:
                opd = opd_loss(
                    lsm,
                    torch.tensor(turn.topk_ids, dtype=torch.long),
                    teacher_on_s[0],
                    mask,
                    diff_clip=s.diff_clip,
                    eps=s.eps,
                    eps_high=s.eps_high,
                )
                loss = loss + s.w_opd * opd.loss
                totals["opd_loss"] += opd.loss.item() / len(batch)
                totals["opd_advantage_abs"] += opd.advantage_abs_mean / len(batch)
            if loss.requires_grad:  # opd mode without the anchor: an unhinted turn adds nothing
                (loss / len(batch)).backward()
            totals["loss"] += loss.item() / len(batch)
        if s.max_grad_norm is not None:
            params = [p for g in self.opt.param_groups for p in g["params"]]
            torch.nn.utils.clip_grad_norm_(params, s.max_grad_norm)
        self.opt.step()
        totals["reward"] = sum(t.reward for t in batch) / len(batch)
        totals["hinted"] = float(sum(bool(t.hints) for t in batch))
        return totals
