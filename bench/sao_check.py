"""SAO small-scale check (the SAO paper): a stream of arithmetic problems, each attempted
once in order, scored by an exact-match verifier; SAO learns after every rollout.

Arms, all on the same problem stream:
  base      no training: the starting policy answers every problem;
  sao-lag0  SAO, rollouts sampled by the current weights (policy lag 0: DIS is inert, ρ ≈ 1);
  sao-lagK  SAO, rollouts sampled by a snapshot of the policy refreshed only every K updates,
            so a rollout lags 0..K−1 updates behind the weights it trains (simulated asynchrony).
Behaviour log-probs are recorded while sampling (temperature 1, top-p 1, log-softmax of the
sampling weights), exactly as the embedded engine records them.

    .venv/bin/python bench/sao_check.py --model tiny --rollouts 40 --policy-lr 1e-3
    .venv/bin/python bench/sao_check.py --model smollm2 --rollouts 100

Prints one table row per arm and a one-line summary. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import copy
import random
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reef.models import resolve_model
from reef.recipe import TrainJob
from reef.recipes.sao.critic import CriticLora, load_critic
from reef.recipes.sao.learner import SAOLearner
from reef.recipes.sao.objective import explained_variance
from reef.recipes.sao.recipe import SAOParams
from reef.recipes.sao.rollouts import Rollout
from reef.recipes.training import load_policy, lora_from

INSTRUCTION = "Reply with only the number, nothing else."


@dataclass(frozen=True)
class Problem:
    question: str
    answer: int


def problems(n: int, seed: int) -> list[Problem]:
    """Additions and subtractions of numbers up to 20, a fixed stream for a seed."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        if rng.random() < 0.5:
            out.append(Problem(f"What is {a} + {b}? {INSTRUCTION}", a + b))
        else:
            a, b = max(a, b), min(a, b)
            out.append(Problem(f"What is {a} - {b}? {INSTRUCTION}", a - b))
    return out


def exact_match(text: str, problem: Problem) -> float:
    """The reply is the number (surrounding whitespace and a final period allowed): 1, else 0."""
    m = re.fullmatch(r"\s*(-?\d+)\.?\s*", text)
    return 1.0 if m is not None and int(m.group(1)) == problem.answer else 0.0


def digit_share(text: str, _: Problem) -> float:
    """The share of the reply's visible characters that are digits, in [0, 1]. A dense signal a
    random model can climb (`--task digits`): the tiny model never matches an exact answer, so
    on it the arithmetic task checks the machinery but cannot show learning."""
    chars = [c for c in text if not c.isspace()]
    return sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0


VERIFIERS = {"arithmetic": exact_match, "digits": digit_share}


@torch.no_grad()
def sample(model: Any, prompt: list[int], max_new: int, stop: set[int], gen: torch.Generator):
    """(completion ids, per-token log-probs) at temperature 1, top-p 1, with a KV cache."""
    out = model(input_ids=torch.tensor([prompt]), use_cache=True)
    ids: list[int] = []
    lps: list[float] = []
    for _ in range(max_new):
        logp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
        tok = int(torch.multinomial(logp.exp(), 1, generator=gen))
        ids.append(tok)
        lps.append(float(logp[tok]))
        if tok in stop:
            break
        out = model(input_ids=torch.tensor([[tok]]), cache=out.cache, use_cache=True)
    return ids, lps


@dataclass
class ArmResult:
    arm: str
    rewards: list[float]
    steps: list[dict[str, float]]
    predicted: list[float]
    targets: list[float]
    seconds: float


def run_arm(arm: str, lag: int | None, model_dir: Path, stream: list[Problem], args: Any):
    """lag None: no training; else SAO with the sampling snapshot refreshed every `lag` updates
    (lag 1 = always the current weights)."""
    torch.manual_seed(args.seed)
    params = SAOParams(policy_lr=args.policy_lr, critic_lr=args.critic_lr, full=args.full)
    with tempfile.TemporaryDirectory() as tmp:
        job = TrainJob("bench", model_dir, pa.table({}), Path(tmp))
        policy, tok = load_policy(job, lora_from(params))
    stop = {tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")}
    learner = None
    if lag is not None:
        critic = load_critic(model_dir, None, CriticLora(params.lora_r, params.lora_alpha))
        learner = SAOLearner(policy, critic, params.schedule())
    sampler = copy.deepcopy(policy).eval() if lag is not None and lag > 1 else policy
    gen = torch.Generator().manual_seed(args.seed)
    result = ArmResult(arm, [], [], [], [], 0.0)
    started = time.monotonic()
    for i, p in enumerate(stream):
        messages = [{"role": "user", "content": p.question}]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt = tok(text, add_special_tokens=False)["input_ids"]
        completion, logprobs = sample(sampler, prompt, args.max_new_tokens, stop, gen)
        reward = VERIFIERS[args.task](tok.decode(completion, skip_special_tokens=True), p)
        result.rewards.append(reward)
        if learner is None:
            continue
        assert lag is not None
        rollout = Rollout(
            sample_id=f"p{i}",
            prompt_ids=tuple(prompt),
            completion_ids=tuple(completion),
            action_mask=(1,) * len(completion),
            behaviour_logprobs=tuple(logprobs),
            reward=reward,
            staleness=i % lag,  # updates made since the sampler was refreshed
        )
        result.steps.append(learner.step(rollout))
        result.predicted += learner.last_prediction[0]
        result.targets += learner.last_prediction[1]
        if sampler is not policy and (i + 1) % lag == 0:
            sampler.load_state_dict(policy.state_dict())
        if args.verbose:
            s = result.steps[-1]
            print(
                f"  {arm} {i + 1:4d} r={reward:.2f} lag={s['policy_lag']:.0f} "
                f"clip={s.get('clipfrac', 0):.3f} |ρ-1|={s.get('ratio_dev', 0):.4f} "
                f"V={s['value_mean']:+.3f} {tok.decode(completion)!r}",
                flush=True,
            )
    result.seconds = time.monotonic() - started
    return result


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def row(r: ArmResult) -> list[str]:
    n = len(r.rewards)
    q = max(n // 4, 1)
    steps = r.steps

    def avg(key: str) -> str:
        vals = [s[key] for s in steps if key in s]
        return f"{mean(vals):.4f}" if vals else "-"

    clipped = sum(1 for s in steps if s.get("clipfrac", 0.0) > 0)
    ev = explained_variance(r.predicted, r.targets) if steps else float("nan")
    return [
        r.arm,
        str(n),
        f"{mean(r.rewards):.3f}",
        f"{mean(r.rewards[:q]):.3f}",
        f"{mean(r.rewards[-q:]):.3f}",
        avg("policy_lag"),
        avg("clipfrac"),
        f"{clipped}" if steps else "-",
        avg("ratio_dev"),
        "n/a" if ev != ev else f"{ev:+.3f}",
        f"{r.seconds / max(n, 1):.2f}",
    ]


HEADER = [
    "arm",
    "rollouts",
    "mean reward",
    "first 25%",
    "last 25%",
    "lag",
    "clipfrac",
    "rows clipped",
    "mean |ρ-1|",
    "expl. var",
    "s/rollout",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="tiny", help="tiny, smollm2 or a model directory")
    ap.add_argument("--cache", default="~/.cache/reef/models")
    ap.add_argument("--rollouts", type=int, default=40)
    ap.add_argument("--task", choices=sorted(VERIFIERS), default="arithmetic")
    ap.add_argument("--lag", type=int, default=4, help="K: snapshot refresh period (>= 2)")
    ap.add_argument("--max-new-tokens", type=int, default=12)
    ap.add_argument("--policy-lr", type=float, default=None, help="default: the recipe's")
    ap.add_argument("--critic-lr", type=float, default=SAOParams.critic_lr)
    ap.add_argument("--full", action="store_true", help="full fine-tune instead of LoRA")
    ap.add_argument("--arms", default="base,sao-lag0,sao-lagK")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    if args.lag < 2:
        ap.error("--lag must be >= 2 (lag 1 is the sao-lag0 arm)")

    model_dir = resolve_model(args.model, Path(args.cache))
    stream = problems(args.rollouts, args.seed)
    lags = {"base": None, "sao-lag0": 1, "sao-lagK": args.lag}
    results = []
    for arm in args.arms.split(","):
        r = run_arm(arm.replace("lagK", f"lag{args.lag}"), lags[arm], model_dir, stream, args)
        results.append(r)
        print(f"# {r.arm}: done in {r.seconds:.0f} s", file=sys.stderr, flush=True)

    table = [HEADER, *(row(r) for r in results)]
    widths = [max(len(line[c]) for line in table) for c in range(len(HEADER))]
    lr = SAOParams(policy_lr=args.policy_lr, full=args.full).schedule().policy_lr
    print(
        f"model={args.model} task={args.task} rollouts={args.rollouts} lag={args.lag} "
        f"policy_lr={lr:g} critic_lr={args.critic_lr:g}"
    )
    for line in table:
        print("  ".join(cell.rjust(w) for cell, w in zip(line, widths, strict=True)))

    by = {r.arm: r for r in results}
    parts = [f"base {mean(by['base'].rewards):.3f}"] if "base" in by else []
    parts += [
        f"{r.arm} {mean(r.rewards):.3f} (clipfrac {mean([s.get('clipfrac', 0) for s in r.steps]):.4f})"
        for r in results
        if r.steps
    ]
    lag0 = [r for r in results if r.arm == "sao-lag0"]
    lagged = [r for r in results if r.steps and r.arm != "sao-lag0"]
    inert = all(s.get("clipfrac", 0) == 0 for r in lag0 for s in r.steps) if lag0 else "n/a"
    active = any(s.get("clipfrac", 0) > 0 for r in lagged for s in r.steps) if lagged else "n/a"
    print(
        f"summary: cumulative mean reward {', '.join(parts)}; "
        f"clipfrac zero at lag 0: {inert}; clipfrac > 0 with lag: {active}"
    )


if __name__ == "__main__":
    main()
