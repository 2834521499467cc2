"""OpenClaw-RL's loss as pure functions on one judged turn's tensors (the OpenClaw-RL paper):
the binary RL term, the hindsight teacher's candidate choice k*, and the top-K OPD term.

Shapes: L response tokens, V vocabulary, K top-K ids per token, C teacher candidates.
`student_logp` is the trained policy's tempered full-vocabulary log-softmax at the response
positions (differentiable); `old` values are the same pass detached (π_old is the trainer's
own recompute and there is one optimizer step per batch, so ρ ≡ 1 and the clip never binds;
the PPO form is kept so the code reads like the method).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch

Selection = Literal["sequence_optimal", "token_optimal", "shortest"]
LOG_RATIO_CLAMP = 20.0


def _ppo(ratio: torch.Tensor, adv: torch.Tensor, eps: float, eps_high: float) -> torch.Tensor:
    """max(−A·ρ, −A·clip(ρ, 1 − ε, 1 + ε_h)) elementwise."""
    return torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - eps, 1.0 + eps_high))


def _ratio(cur: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    return torch.exp((cur - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def rl_loss(
    token_logp: torch.Tensor,
    reward: float,
    mask: torch.Tensor,
    *,
    eps: float = 0.2,
    eps_high: float = 0.28,
) -> torch.Tensor:
    """The binary RL term: the raw turn reward broadcast to every response token as its
    advantage, PPO-clipped surrogate, token mean over `mask`. `token_logp` (L,) is log π_θ of
    the sampled tokens."""
    old = token_logp.detach()
    adv = torch.full_like(token_logp, float(reward))
    per_token = _ppo(_ratio(token_logp, old), adv, eps, eps_high)
    return (per_token * mask).sum() / mask.sum().clamp(min=1.0)


def overlaps(student_ids: torch.Tensor, teacher_ids: torch.Tensor) -> torch.Tensor:
    """O_c(t) = |S^q_t ∩ N^c_t| for every candidate: `student_ids` (L, K), `teacher_ids`
    (C, L, K) -> (C, L)."""
    same = student_ids[None, :, :, None] == teacher_ids[:, :, None, :]  # (C, L, K, K)
    return same.any(-1).sum(-1)


def select_candidate(overlap: torch.Tensor, mode: Selection = "sequence_optimal") -> torch.Tensor:
    """k*(t) for every response token from the overlap matrix (C, L) -> (L,) candidate index.

    shortest: the first candidate (candidates come shortest hint first); token_optimal: the
    argmax over candidates per token; sequence_optimal: one argmax of the summed overlap over
    the whole response (no step spans in a personal-agent turn). Ties go to the earlier
    (shorter) candidate."""
    n_tokens = overlap.shape[1]
    if mode == "shortest":
        return torch.zeros(n_tokens, dtype=torch.long)
    if mode == "token_optimal":
        return _first_argmax(overlap, dim=0)
    if mode == "sequence_optimal":
        best = _first_argmax(overlap.sum(dim=1, keepdim=True), dim=0)
        return best.expand(n_tokens).clone()
    raise ValueError(f"unknown hint selection '{mode}'")


def _first_argmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    """argmax that picks the first of equal maxima (torch.argmax does not promise it)."""
    top = x.max(dim=dim, keepdim=True).values
    n = x.shape[dim]
    index = torch.arange(n).view([-1 if d == dim else 1 for d in range(x.dim())])
    return torch.where(x == top, index, n).min(dim=dim).values.squeeze(dim)


class OPD(NamedTuple):
    loss: torch.Tensor
    advantage_abs_mean: float  # mean |A_t(v)| over the trained entries


def opd_loss(
    student_logp: torch.Tensor,
    student_ids: torch.Tensor,
    teacher_logp_on_s: torch.Tensor,
    mask: torch.Tensor,
    *,
    diff_clip: float = 1.0,
    eps: float = 0.2,
    eps_high: float = 0.28,
) -> OPD:
    """The top-K "select" distillation term on the student set S_t = S^q_t (subset mode
    "student").

    `student_logp` (L, V) is the policy's tempered log-softmax, `student_ids` (L, K) the
    generation-time top-K ids, `teacher_logp_on_s` (L, K) the chosen teacher candidate's
    tempered log-probs gathered at those ids. Weights w are the student's probabilities
    renormalised on S_t (detached); A = w·clip(ℓ_T − ℓ_old, ±diff_clip) (detached; a clip <= 0
    disables it); the PPO surrogate is summed over S_t, then averaged over masked tokens."""
    cur = student_logp.gather(-1, student_ids)  # (L, K)
    old = cur.detach()
    w = torch.softmax(old, dim=-1)
    diff = teacher_logp_on_s - old
    if diff_clip > 0:
        diff = diff.clamp(-diff_clip, diff_clip)
    adv = (w * diff).detach()
    per_token = _ppo(_ratio(cur, old), adv, eps, eps_high).sum(-1)  # sum over top-K
    loss = (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    used = mask.bool()
    mean_abs = float(adv[used].abs().mean()) if bool(used.any()) else 0.0
    return OPD(loss, mean_abs)
