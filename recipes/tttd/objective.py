"""TTT-Discover's math as pure functions (the TTT-Discover paper): the tilted distribution's KL to
uniform, the adaptive β found by bisection, leave-one-out entropic advantages, centred KL
shaping to the frozen base, and the un-clipped token-sum importance-sampling loss.

Group rewards are plain Python floats in float64 (the bisection's 1e-6 target needs it);
the per-token parts are torch tensors of one step's response tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch

TARGET_KL = math.log(2.0)  # D(β) = ln 2: the tilted group is "one bit" away from uniform
BETA_CAP = 1e6  # the upper bracket stops doubling here (best effort, §3.2 b)
BISECTIONS = 60
LOO_EPS = 1e-12  # guards the leave-one-out normaliser (§3.2 c)


def tilted_kl(rewards: Sequence[float], beta: float) -> float:
    """D(β) = KL(q_β ‖ Uniform_k), q_β(i) ∝ exp(β (r_i − max r)); 0 for k < 2."""
    k = len(rewards)
    if k < 2:
        return 0.0
    top = max(rewards)
    e = [math.exp(beta * (r - top)) for r in rewards]
    z = sum(e)
    return sum((x / z) * math.log(x / z) for x in e if x > 0.0) + math.log(k)


def adaptive_beta(rewards: Sequence[float], target: float = TARGET_KL) -> float:
    """β with D(β) = `target`, by bisection (§3.2 b). k < 2: 0. When D never reaches the target
    (half or more of the group ties at the max) the bracket stops at BETA_CAP and β = the cap."""
    if len(rewards) < 2:
        return 0.0
    hi = 1.0
    while tilted_kl(rewards, hi) < target and hi < BETA_CAP:
        hi = min(hi * 2.0, BETA_CAP)
    if tilted_kl(rewards, hi) < target:
        return hi  # the target is out of reach: best effort at the cap
    lo = 0.0
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2.0
        if tilted_kl(rewards, mid) < target:
            lo = mid
        else:
            hi = mid
    return hi


def loo_advantages(rewards: Sequence[float], beta: float) -> list[float]:
    """A_i = e_i / (Z_−i + 1e-12) − 1 with e_i = exp(β (r_i − max r)) and Z_−i the mean of the
    other rollouts' e (§3.2 c): how much more rollout i weighs than its siblings. k = 1: 0."""
    k = len(rewards)
    if k < 2:
        return [0.0] * k
    top = max(rewards)
    e = [math.exp(beta * (r - top)) for r in rewards]
    total = sum(e)
    return [x / ((total - x) / (k - 1) + LOO_EPS) - 1.0 for x in e]


def constant(rewards: Sequence[float]) -> bool:
    """A group whose rewards are all equal carries no signal and is removed (§3.1)."""
    return len(set(rewards)) <= 1


class GroupAdvantages(NamedTuple):
    beta: float
    advantages: list[float]


def group_advantages(rewards: Sequence[float]) -> GroupAdvantages:
    beta = adaptive_beta(rewards)
    return GroupAdvantages(beta, loo_advantages(rewards, beta))


def kl_shaping(
    sampler_logprobs: Sequence[torch.Tensor],
    base_logprobs: Sequence[torch.Tensor],
    masks: Sequence[torch.Tensor],
    coef: float,
) -> tuple[list[torch.Tensor], float]:
    """Per-token advantage offsets λ·m_t·(d̄ − d_t) with d_t = (log q − log π_0)·m_t and d̄ the
    step-wide mean of d over masked tokens (§3.2 d). Returns the offsets per rollout and d̄,
    which is the sampled policy's estimated KL to the base (logged as `kl_to_base`).

    Centring keeps the step's total advantage unchanged: tokens the sampler liked more than the
    base did are pushed back, the others forward, so the policy stays near π_0 without a
    separate loss term."""
    d = [(q - b) * m for q, b, m in zip(sampler_logprobs, base_logprobs, masks, strict=True)]
    total = sum(float(x.sum()) for x in d)
    count = sum(float(m.sum()) for m in masks)
    mean = total / count if count else 0.0
    return [coef * m * (mean - x) for x, m in zip(d, masks, strict=True)], mean


def is_loss(
    logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, advantages: torch.Tensor
) -> torch.Tensor:
    """− Σ_t exp(log π_θ(y_t) − log q(y_t)) · A_t over one rollout's response tokens (§3.2 e):
    un-clipped, summed (not averaged), no loss mask on this term. Summed over every rollout of
    a step it is the step's loss; its gradient at ρ = 1 is −Σ A_t ∇log π_θ."""
    ratio = torch.exp(logprobs - sampler_logprobs.detach())
    return -(ratio * advantages.detach()).sum()
