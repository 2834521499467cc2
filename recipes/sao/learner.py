"""One SAO update per scored rollout: K critic steps, then one actor step (the SAO paper).

The learner holds the policy, the critic and their two optimizers (the critic's learning rate
is scoped separately: the paper's "faster value updates"). `step` takes one rollout, so the
next rollout is judged by the weights this one produced; it returns that update's numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from reef.recipes.sao.critic import Critic
from reef.recipes.sao.objective import (
    length_adaptive_lambda,
    policy_loss,
    skip_observation_gae,
    value_loss,
)
from reef.recipes.sao.rollouts import Rollout


@dataclass(frozen=True)
class Schedule:
    """What the learner needs from SAOParams (kept separate so the bench can build one)."""

    policy_lr: float
    critic_lr: float
    critic_steps_per_actor: int
    num_critic_only_steps: int
    gamma: float
    lambda_critic: float
    length_adaptive_lambda: bool
    lambda_alpha: float
    lambda_policy: float
    eps_low: float
    eps_high: float
    value_clip: float
    max_grad_norm: float | None


def response_logprobs(model: Any, input_ids: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """log π(y_t | x, y_<t) for every response token, teacher-forced on the exact ids.

    Logits are computed only where they predict a response token (`logits_to_keep`), and the
    log-softmax is taken as gather − logsumexp so no second vocabulary-sized tensor is built.
    """
    length = input_ids.shape[1] - prompt_len
    logits = model(input_ids=input_ids, logits_to_keep=length + 1).logits[0, :-1].float()
    targets = input_ids[0, prompt_len:]
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


class SAOLearner:
    def __init__(self, policy: Any, critic: Critic, schedule: Schedule):
        self.policy = policy
        self.critic = critic
        self.s = schedule
        # Adam, constant learning rate (§1.3); no weight decay, no entropy or KL term (§1.2 e).
        policy_params = [p for p in policy.parameters() if p.requires_grad]
        self.policy_opt = torch.optim.Adam(policy_params, lr=schedule.policy_lr)
        self.critic_opt = torch.optim.Adam(critic.trainable(), lr=schedule.critic_lr)
        self.policy.train()
        self.critic.train()
        # The last step's pre-update critic predictions and their targets on action tokens
        # (explained variance is measured across a job, see recipe._Tally).
        self.last_prediction: tuple[list[float], list[float]] = ([], [])

    def step(self, rollout: Rollout) -> dict[str, float]:
        """K critic updates, then (after the warm-up) one actor update on this rollout."""
        s = self.s
        p_len, length = len(rollout.prompt_ids), len(rollout.completion_ids)
        ids = torch.tensor([rollout.prompt_ids + rollout.completion_ids], dtype=torch.long)
        action = torch.tensor(rollout.action_mask, dtype=torch.bool)

        # Critic. The value of response token t is read where y_t is predicted (position
        # P − 1 + t), as its log-prob is: the state before the token was chosen.
        def critic_values() -> torch.Tensor:
            return self.critic(ids)[p_len - 1 : p_len - 1 + length]

        values = critic_values()
        # Targets and the clip anchor come from the pre-update pass (§1.2 f); with
        # λ_critic = γ = 1 the target is the Monte-Carlo return, G_t = R on every action token.
        old_values = values.detach()
        returns = skip_observation_gae(
            old_values, rollout.reward, action, gamma=s.gamma, lam=s.lambda_critic
        ).returns
        for k in range(s.critic_steps_per_actor):
            if k > 0:
                values = critic_values()
            vl = value_loss(values, old_values, returns, action, clip=s.value_clip)
            self.critic_opt.zero_grad(set_to_none=True)
            vl.loss.backward()
            _clip(self.critic.trainable(), s.max_grad_norm)
            self.critic_opt.step()
            self.critic.updates += 1

        lam = (
            length_adaptive_lambda(length, s.lambda_alpha)
            if s.length_adaptive_lambda
            else s.lambda_policy
        )
        out = {
            "value_loss": vl.loss.item(),
            "value_clipfrac": vl.clipfrac,
            "value_mean": float(old_values[action].mean()),
            "lambda_policy": lam,
            "response_tokens": float(length),
            "action_tokens": float(action.sum()),
            "policy_lag": float(rollout.staleness),
            "reward": rollout.reward,
        }
        # For explained variance across the job: the pre-update prediction against its target.
        self.last_prediction = (old_values[action].tolist(), returns[action].tolist())

        warming_up = self.critic.rollouts_seen < s.num_critic_only_steps
        self.critic.rollouts_seen += 1
        if warming_up:
            return out

        # Actor. Advantages use λ_policy on the values of the last critic pass (§1.2 g): the
        # K-th forward, after K − 1 critic updates (no extra forward after the last update).
        # The behaviour log-probs are the recorded ones, never recomputed (§1.2 e).
        advantages = skip_observation_gae(
            values.detach(), rollout.reward, action, gamma=s.gamma, lam=lam
        ).advantages
        logprobs = response_logprobs(self.policy, ids, p_len)
        behaviour = torch.tensor(rollout.behaviour_logprobs, dtype=logprobs.dtype)
        pl = policy_loss(
            logprobs, behaviour, advantages, action, eps_low=s.eps_low, eps_high=s.eps_high
        )
        self.policy_opt.zero_grad(set_to_none=True)
        pl.loss.backward()
        _clip([q for g in self.policy_opt.param_groups for q in g["params"]], s.max_grad_norm)
        self.policy_opt.step()
        return out | {
            "policy_loss": pl.loss.item(),
            "clipfrac": pl.clipfrac,
            "ratio_mean": pl.ratio_mean,
            "ratio_dev": pl.ratio_dev,
            "advantage_mean": float(advantages[action].mean()),
        }


def _clip(params: list[torch.nn.Parameter], max_norm: float | None) -> None:
    if max_norm is not None:
        torch.nn.utils.clip_grad_norm_(params, max_norm)
