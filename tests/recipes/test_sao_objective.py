"""SAO's math (recipes/sao/objective.py) against hand-computed values (the SAO paper)."""

from __future__ import annotations

import math

import pytest
import torch

from reef.recipes.sao.objective import (
    dis_calibration,
    explained_variance,
    length_adaptive_lambda,
    policy_loss,
    skip_observation_gae,
    value_loss,
)


def t(xs: list[float]) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float64)


def test_length_adaptive_lambda_values() -> None:
    assert length_adaptive_lambda(0) == 0.0
    assert length_adaptive_lambda(1) == pytest.approx(1 - 1 / 1.5)  # 0.333…
    assert length_adaptive_lambda(100) == pytest.approx(0.993333, abs=1e-6)
    assert length_adaptive_lambda(1000) == pytest.approx(0.999333, abs=1e-6)
    # clipped into [0, 1]: α·L < 1 would give a negative λ
    assert length_adaptive_lambda(1, alpha=0.5) == 0.0


def test_gae_lambda_gamma_one_is_reward_minus_value() -> None:
    values = t([0.1, -0.4, 0.7, 0.2])
    mask = torch.tensor([1, 1, 1, 1])
    gae = skip_observation_gae(values, 2.0, mask, gamma=1.0, lam=1.0)
    assert gae.advantages.tolist() == pytest.approx((2.0 - values).tolist())
    assert gae.returns.tolist() == pytest.approx([2.0] * 4)


def test_gae_skips_observation_spans() -> None:
    # action, action, [observation, observation], action, [observation] at the end
    values = t([0.5, 0.25, 9.0, -9.0, 0.125, 7.0])
    mask = torch.tensor([1, 1, 0, 0, 1, 0])
    gae = skip_observation_gae(values, 1.0, mask, gamma=1.0, lam=1.0)
    assert gae.advantages.tolist() == pytest.approx([0.5, 0.75, 0.0, 0.0, 0.875, 0.0])
    assert gae.returns.tolist() == pytest.approx([1.0, 1.0, 0.0, 0.0, 1.0, 0.0])

    # λ = 0: one-step TD. The last token of the first action segment (t = 1) bootstraps from
    # the first token of the next segment (t = 4), never from the observation values 9 / −9;
    # the reward sits on the last *action* token (t = 4), not on the trailing observation.
    gae = skip_observation_gae(values, 1.0, mask, gamma=1.0, lam=0.0)
    assert gae.advantages.tolist() == pytest.approx(
        [0.25 - 0.5, 0.125 - 0.25, 0.0, 0.0, 1.0 - 0.125, 0.0]
    )

    # γ < 1 discounts per action token skipped over, not per observation token
    gae = skip_observation_gae(values, 1.0, mask, gamma=0.5, lam=0.0)
    assert gae.advantages[1].item() == pytest.approx(0.5 * 0.125 - 0.25)


def test_gae_without_action_tokens_is_zero() -> None:
    gae = skip_observation_gae(t([1.0, 2.0]), 1.0, torch.tensor([0, 0]), gamma=1.0, lam=1.0)
    assert gae.advantages.tolist() == [0.0, 0.0]
    assert gae.returns.tolist() == [0.0, 0.0]


def test_dis_calibration_band_is_strict() -> None:
    ratio = t([0.7, 0.7000001, 1.0, 5.9999, 6.0, 0.1, 10.0])
    f = dis_calibration(ratio, eps_low=0.3, eps_high=5.0)
    assert f.tolist() == pytest.approx([0.0, 0.7000001, 1.0, 5.9999, 0.0, 0.0, 0.0])


def test_policy_loss_no_gradient_outside_the_band() -> None:
    # ratios: 1.0 (in), 0.5 (below 0.7), 8.0 (above 6.0), 2.0 (in); the last token is masked out
    behaviour = t([-1.0, -1.0, -1.0, -1.0, -1.0])
    logp = (behaviour + t([0.0, math.log(0.5), math.log(8.0), math.log(2.0), 0.0])).requires_grad_()
    adv = t([1.0, 1.0, -1.0, -0.5, 3.0])
    mask = torch.tensor([1, 1, 1, 1, 0])
    out = policy_loss(logp, behaviour, adv, mask, eps_low=0.3, eps_high=5.0)
    out.loss.backward()
    assert logp.grad is not None
    # ∂ℓ/∂log π_t = −f(ρ_t)·Â_t / (number of trained tokens)
    assert logp.grad.tolist() == pytest.approx([-1.0 / 4, 0.0, 0.0, 0.5 * 2.0 / 4, 0.0])
    assert out.clipfrac == pytest.approx(0.5)
    assert out.ratio_mean == pytest.approx((1.0 + 0.5 + 8.0 + 2.0) / 4)
    assert out.ratio_dev == pytest.approx((0.0 + 0.5 + 7.0 + 1.0) / 4)


def test_policy_loss_on_policy_is_plain_policy_gradient() -> None:
    behaviour = t([-0.5, -2.0])
    logp = behaviour.clone().requires_grad_()
    out = policy_loss(
        logp, behaviour, t([2.0, 2.0]), torch.tensor([1, 1]), eps_low=0.3, eps_high=5.0
    )
    assert out.loss.item() == pytest.approx(-(2.0 * -0.5 + 2.0 * -2.0) / 2)
    assert out.clipfrac == 0.0
    assert out.ratio_mean == pytest.approx(1.0)


def test_value_loss_clips_around_old_values() -> None:
    old = t([0.0, 0.0, 0.0])
    returns = t([1.0, 1.0, -1.0])
    # token 0 moved toward its target beyond the clip: the clipped (larger) error counts and
    # its gradient is zero; token 1 moved within the clip; token 2 moved away from its target.
    values = t([0.5, 0.1, 0.5]).requires_grad_()
    out = value_loss(values, old, returns, torch.tensor([1, 1, 1]), clip=0.2)
    expected = ((1.0 - 0.2) ** 2 + (1.0 - 0.1) ** 2 + (0.5 + 1.0) ** 2) / 3
    assert out.loss.item() == pytest.approx(expected)
    out.loss.backward()
    assert values.grad is not None
    assert values.grad.tolist() == pytest.approx([0.0, 2 * (0.1 - 1.0) / 3, 2 * (0.5 + 1.0) / 3])
    assert out.clipfrac == pytest.approx(1 / 3)


def test_value_loss_ignores_masked_tokens() -> None:
    out = value_loss(t([0.0, 5.0]), t([0.0, 0.0]), t([1.0, 0.0]), torch.tensor([1, 0]), clip=0.2)
    assert out.loss.item() == pytest.approx(1.0)


def test_explained_variance() -> None:
    assert explained_variance([1.0, -1.0], [1.0, -1.0]) == pytest.approx(1.0)
    assert explained_variance([0.0, 0.0], [1.0, -1.0]) == pytest.approx(0.0)
    assert math.isnan(explained_variance([0.3, 0.3], [1.0, 1.0]))
    assert math.isnan(explained_variance([], []))
