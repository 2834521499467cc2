"""TTT-Discover's math (the TTT-Discover paper): the adaptive β reaches KL ln 2 by bisection, the
leave-one-out entropic advantages match hand computation, the KL shaping is centred, and the
IS loss's gradient at ρ = 1 is the plain policy gradient."""

from __future__ import annotations

import math

import pytest
import torch

from reef.recipes.tttd.objective import (
    BETA_CAP,
    TARGET_KL,
    adaptive_beta,
    constant,
    is_loss,
    kl_shaping,
    loo_advantages,
    tilted_kl,
)


@pytest.mark.parametrize(
    "rewards",
    [
        [0.0, 0.0, 1.0],
        [1.0, 2.0, 3.0, 4.0],
        [0.0, 0.8, 0.81, 0.9, 1.1, 0.0, 0.3, 1.0],
        [2.5, 2.6, 2.63],  # small spread: β large
        [0.0, 100.0, 50.0, 25.0],  # large spread: β small
    ],
)
def test_bisection_hits_ln2(rewards: list[float]) -> None:
    beta = adaptive_beta(rewards)
    assert 0.0 < beta < BETA_CAP
    assert abs(tilted_kl(rewards, beta) - TARGET_KL) < 1e-6


def test_spec_examples() -> None:
    # hand-computed: {0,0,1} → β≈2.85, A≈(−0.89, −0.89, 16.3); {1,2,3,4} → β≈1.45.
    beta = adaptive_beta([0.0, 0.0, 1.0])
    assert beta == pytest.approx(2.85, abs=0.01)
    assert loo_advantages([0.0, 0.0, 1.0], beta) == pytest.approx([-0.89, -0.89, 16.3], abs=0.05)
    beta = adaptive_beta([1.0, 2.0, 3.0, 4.0])
    assert beta == pytest.approx(1.45, abs=0.01)
    assert loo_advantages([1.0, 2.0, 3.0, 4.0], beta) == pytest.approx(
        [-0.97, -0.87, -0.34, 8.87], abs=0.01
    )


def test_unreachable_target_takes_the_cap() -> None:
    # Three of four tie at the max: D(β) tends to log(4/3) < ln 2, so β stops at the cap.
    rewards = [0.0, 1.0, 1.0, 1.0]
    assert adaptive_beta(rewards) == BETA_CAP
    assert loo_advantages(rewards, BETA_CAP) == pytest.approx([-1.0, 0.5, 0.5, 0.5], abs=1e-9)


def test_loo_by_hand() -> None:
    # β = ln 2 and rewards (0, 1, 2): e = (1/4, 1/2, 1); Z_−i = mean of the other two.
    beta = math.log(2.0)
    e = [0.25, 0.5, 1.0]
    want = [e[0] / ((e[1] + e[2]) / 2) - 1, e[1] / ((e[0] + e[2]) / 2) - 1, e[2] / 0.375 - 1]
    assert want == pytest.approx([-2 / 3, -0.2, 5 / 3])
    assert loo_advantages([0.0, 1.0, 2.0], beta) == pytest.approx(want, abs=1e-9)
    # β = 0: every weight is 1, every advantage 0 (the mean, no preference).
    assert loo_advantages([0.0, 1.0, 2.0], 0.0) == pytest.approx([0.0, 0.0, 0.0], abs=1e-9)


def test_degenerate_groups() -> None:
    assert adaptive_beta([1.0]) == 0.0 and loo_advantages([1.0], 3.0) == [0.0]
    assert constant([0.5, 0.5, 0.5]) and not constant([0.5, 0.5, 0.6])


def test_kl_shaping_is_centred() -> None:
    sampler = [torch.tensor([-1.0, -2.0, -0.5]), torch.tensor([-0.1, -3.0])]
    base = [torch.tensor([-1.5, -2.0, -0.5]), torch.tensor([-0.1, -1.0])]
    masks = [torch.tensor([1.0, 1.0, 0.0]), torch.tensor([1.0, 1.0])]
    offsets, mean = kl_shaping(sampler, base, masks, coef=0.1)
    d = [0.5, 0.0, -2.0]  # masked d_t: (0.5, 0.0) and (0.0, −2.0)
    assert mean == pytest.approx((0.5 + 0.0 + 0.0 - 2.0) / 4)
    assert offsets[0].tolist() == pytest.approx([0.1 * (mean - d[0]), 0.1 * mean, 0.0])
    assert offsets[1].tolist() == pytest.approx([0.1 * mean, 0.1 * (mean - d[2])])
    # centred: the offsets sum to zero over the trained tokens
    assert float(sum((o * m).sum() for o, m in zip(offsets, masks, strict=True))) == pytest.approx(
        0.0, abs=1e-7
    )


def test_is_loss_is_unclipped_token_sum() -> None:
    logits = torch.tensor([[0.2, -0.1, 0.5], [0.0, 0.3, -0.2]], requires_grad=True)
    tokens = torch.tensor([2, 0])
    logprobs = torch.log_softmax(logits, -1).gather(1, tokens[:, None]).squeeze(1)
    adv = torch.tensor([2.0, -1.0])
    loss = is_loss(logprobs, logprobs.detach(), adv)  # ρ = 1
    assert loss.item() == pytest.approx(-(2.0 - 1.0))  # − Σ ρ A, summed not averaged
    loss.backward()
    plain = logits.detach().clone().requires_grad_(True)
    lp = torch.log_softmax(plain, -1).gather(1, tokens[:, None]).squeeze(1)
    (-(adv * lp).sum()).backward()
    assert logits.grad is not None and plain.grad is not None
    assert torch.allclose(logits.grad, plain.grad)
    # far off-policy: the ratio is not clipped
    far = is_loss(logprobs.detach(), logprobs.detach() - 3.0, torch.tensor([1.0, 0.0]))
    assert far.item() == pytest.approx(-math.exp(3.0), rel=1e-5)
