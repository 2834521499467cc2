"""SAO's math as pure functions on one rollout's tensors: length-adaptive λ, skip-observation
GAE, the DIS trust band, the policy loss and the clipped value loss (the SAO paper).

Every tensor here is one rollout's response, shape (L,): position t is response token y_t.
`action_mask` is 1 on tokens the model generated and 0 on environment tokens spliced into the
response; `loss_mask` is 1 on tokens that train (SAO's invariant: a trained token is an action).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch


def length_adaptive_lambda(length: int, alpha: float = 1.5) -> float:
    """λ_policy(L) = clip_[0,1](1 − 1/(α·L)), and 0 for an empty response (§1.2 d).

    L is the whole response length, observation tokens included (Reef's reading, which the
    spec flags: the paper may count generated tokens only). Long responses get λ near 1 (low
    bias over a long horizon), a one-token answer gets 1 − 1/α.
    """
    if length <= 0:
        return 0.0
    return min(1.0, max(0.0, 1.0 - 1.0 / (alpha * length)))


class GAE(NamedTuple):
    advantages: torch.Tensor  # Â_t on action tokens, 0 on observation tokens
    returns: torch.Tensor  # G_t = Â_t + V_t on action tokens (the critic's target), 0 elsewhere


def skip_observation_gae(
    values: torch.Tensor,
    reward: float,
    action_mask: torch.Tensor,
    *,
    gamma: float,
    lam: float,
) -> GAE:
    """GAE over the action tokens only (§1.2 b, c; the paper's Eqs. 4-5 as Reef cites them).

    The scalar reward sits on the last action token. Walking backwards, observation tokens
    are skipped rather than valued: the TD residual of the last token of one action segment
    bootstraps from the first token of the next action segment, so the critic is never asked
    to value text the environment wrote. With γ = λ = 1 this gives Â_t = R − V_t.
    """
    v = values.detach().to(torch.float64).tolist()
    acting = [bool(a) for a in action_mask.tolist()]
    adv = [0.0] * len(v)
    ret = [0.0] * len(v)
    v_next = 0.0  # the value after the final action token: the episode is over
    g = 0.0
    terminal = True
    for t in range(len(v) - 1, -1, -1):
        if not acting[t]:
            continue
        r = reward if terminal else 0.0
        terminal = False
        delta = r + gamma * v_next - v[t]
        g = delta + gamma * lam * g
        adv[t] = g
        ret[t] = g + v[t]
        v_next = v[t]
    return GAE(
        torch.tensor(adv, dtype=values.dtype, device=values.device),
        torch.tensor(ret, dtype=values.dtype, device=values.device),
    )


def trust_band(ratio: torch.Tensor, eps_low: float, eps_high: float) -> torch.Tensor:
    """True where 1 − ε_low < ρ < 1 + ε_high (strict on both sides, §1.2 e)."""
    return (ratio > 1.0 - eps_low) & (ratio < 1.0 + eps_high)


def dis_calibration(ratio: torch.Tensor, eps_low: float, eps_high: float) -> torch.Tensor:
    """f(ρ): ρ inside the trust band, exactly 0 outside it (a hard mask, not PPO's clip)."""
    return torch.where(trust_band(ratio, eps_low, eps_high), ratio, torch.zeros_like(ratio))


class PolicyLoss(NamedTuple):
    loss: torch.Tensor  # scalar, differentiable through `logprobs`
    clipfrac: float  # fraction of trained tokens outside the trust band (f = 0)
    ratio_mean: float  # mean ρ over trained tokens
    ratio_dev: float  # mean |ρ − 1| over trained tokens: how far off-policy the rollout was


def policy_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
) -> PolicyLoss:
    """DIS surrogate ℓ_t = −sg(f(ρ_t))·Â_t·log π_θ(y_t), token mean over the loss mask.

    ρ_t = π_θ(y_t)/q(y_t) against the *recorded* sampling log-probs q. A token outside the band
    contributes no gradient in either direction; the mean still counts it, as Slime's per-sample
    token mean over the loss mask does (§1.2 e, reduction).
    """
    mask = loss_mask.to(logprobs.dtype)
    n = mask.sum().clamp(min=1.0)
    ratio = torch.exp(logprobs.detach() - behaviour_logprobs.to(logprobs.dtype))
    f = dis_calibration(ratio, eps_low, eps_high)
    loss = (-(f * advantages.detach()) * logprobs * mask).sum() / n
    outside = (~trust_band(ratio, eps_low, eps_high)).to(mask.dtype) * mask
    return PolicyLoss(
        loss,
        float(outside.sum() / n),
        float((ratio * mask).sum() / n),
        float(((ratio - 1.0).abs() * mask).sum() / n),
    )


class ValueLoss(NamedTuple):
    loss: torch.Tensor  # scalar, differentiable through `values`
    clipfrac: float  # fraction of trained tokens where the clipped term was the larger


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    clip: float,
) -> ValueLoss:
    """Slime's clipped value regression (§1.2 f), token mean over the loss mask:
    max((V_old + clip(V − V_old, ±c) − G)², (V − G)²)."""
    mask = loss_mask.to(values.dtype)
    n = mask.sum().clamp(min=1.0)
    old = old_values.detach()
    clipped = old + (values - old).clamp(-clip, clip)
    unclipped_sq = (values - returns) ** 2
    clipped_sq = (clipped - returns) ** 2
    loss = (torch.maximum(clipped_sq, unclipped_sq) * mask).sum() / n
    frac = ((clipped_sq > unclipped_sq).to(mask.dtype) * mask).sum() / n
    return ValueLoss(loss, float(frac))


def explained_variance(predicted: list[float], target: list[float]) -> float:
    """1 − Var(G − V)/Var(G) over action tokens; NaN when the targets do not vary (a single
    rollout with λ_critic = γ = 1 has G_t = R on every token)."""
    n = len(target)
    if n == 0:
        return math.nan
    mean_g = sum(target) / n
    var_g = sum((g - mean_g) ** 2 for g in target) / n
    if var_g <= 0.0:
        return math.nan
    resid = [g - v for g, v in zip(target, predicted, strict=True)]
    mean_r = sum(resid) / n
    var_r = sum((r - mean_r) ** 2 for r in resid) / n
    return 1.0 - var_r / var_g
