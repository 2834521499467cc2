"""Learning from reactions alone, arm by arm: the openclaw recipe's combined, RL-only and
OPD-only modes against the frozen model, on the same deterministic stream of sessions.

Each round, `sessions` training questions are asked (sampled at T 0.6, top-p 0.95, top-k 20 as
§2.4 serves); the simulated user (demo/reactions.py) reacts in the next turn; the rule judge
votes m = 3 times with hints (reef.judge: plurality, hint filter, dispatch); the recipe's
learner (recipes/openclaw) takes one optimizer step per `batch` judged turns. The held-out
questions are then answered greedily and scored by the user's rule. The top-K capture is taken
by a teacher-forced pass of the serving weights (identical to the engine's own capture,
tests/engines/test_topk_capture.py); this runs in one process so that four arms fit the CPU.

`--channel report` delivers the same reaction as a text-only report instead of the next turn
(`{"feedback": "too long"}` on a failed answer, `{"feedback": "Thanks, ..."}` on a good one):
the judge reads it as the worker reads a scoreless report (flows/judging.py: role "feedback",
the report's text), the seed's report example going all the way to training.

    .venv/bin/python bench/reactions.py --rounds 5 --sessions 8 --out docs/reactions
    .venv/bin/python bench/reactions.py --channel report --arms combined --out docs/reactions_report
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, cast

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from demo.reactions import messages, passes, questions, react, report, rule_judge
from recipes.openclaw.learner import OpenClawLearner
from recipes.openclaw.recipe import Mode, OpenClawParams
from recipes.openclaw.turns import JudgedTurn
from reef.engines.base import CAPTURE_TOPK
from reef.judge import Exchange, Judge, dispatch
from reef.models import resolve_model

ARMS = ("combined", "rl", "opd")


def load(model: str, cache: Path) -> tuple[Any, Any]:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model(model, cache)
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    return get_peft_model(base, lora), tok


@torch.no_grad()
def generate(
    policy: Any, tok: Any, qs: list[str], max_new: int, sample: bool, seed: int
) -> list[tuple[list[int], list[int], str]]:
    """(prompt ids, completion ids, text) per question, the way the engine would serve them."""
    policy.eval()
    prompts = [
        tok(
            tok.apply_chat_template(messages(q), tokenize=False, add_generation_prompt=True),
            add_special_tokens=False,
        ).input_ids
        for q in qs
    ]
    batch = tok.pad({"input_ids": prompts}, return_tensors="pt")
    torch.manual_seed(seed)
    options: dict[str, Any] = {"do_sample": False}
    if sample:
        options = {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20}
    out = policy.generate(**batch, max_new_tokens=max_new, pad_token_id=tok.pad_token_id, **options)
    width = batch["input_ids"].shape[1]
    results = []
    for i, prompt in enumerate(prompts):
        ids = out[i, width:].tolist()
        if tok.eos_token_id in ids:
            ids = ids[: ids.index(tok.eos_token_id) + 1]
        results.append((prompt, ids, tok.decode(ids, skip_special_tokens=True)))
    policy.train()
    return results


@torch.no_grad()
def capture(policy: Any, prompt: list[int], completion: list[int]) -> tuple[tuple[int, ...], ...]:
    """The serving weights' top-K ids at every response position (the engine's capture)."""
    x = torch.tensor([prompt + completion])
    logits = policy(input_ids=x, logits_to_keep=len(completion) + 1).logits[0, :-1]
    return tuple(tuple(r) for r in logits.topk(CAPTURE_TOPK, -1).indices.tolist())


def held_out(policy: Any, tok: Any, qs: list[str], max_new: int) -> float:
    answers = generate(policy, tok, qs, max_new, sample=False, seed=0)
    return sum(passes(text) for _, _, text in answers) / len(answers)


def run_arm(mode: str, args: argparse.Namespace, base_rate: float) -> dict[str, Any]:
    policy, tok = load(args.model, args.cache)
    p = OpenClawParams(mode=cast(Mode, mode), batch_size=args.batch, learning_rate=args.lr)
    learner = OpenClawLearner(policy, tok, p.setup())
    judge = Judge(rule_judge, "function:demo.reactions:rule_judge", votes=3)
    train_qs, eval_qs = questions("train"), questions("held_out")
    curve, first_replies, t0 = [base_rate], [], time.perf_counter()
    for r in range(args.rounds):
        qs = [train_qs[(r * args.sessions + i) % len(train_qs)] for i in range(args.sessions)]
        turns = []
        for q, (prompt, completion, text) in zip(
            qs, generate(policy, tok, qs, args.max_new, sample=True, seed=r), strict=True
        ):
            first_replies.append(passes(text))
            exchange = _exchange(q, text, args.channel)
            j = judge.judge(exchange)
            d = dispatch(j.score, j.hints)
            if d is None or not completion:
                continue
            turns.append(
                JudgedTurn(
                    q,
                    exchange.messages,
                    tuple(prompt),
                    tuple(completion),
                    capture(policy, prompt, completion),
                    d.reward,
                    j.hints if d.teacher == "hints" else (),
                    0,
                )
            )
        for i in range(0, len(turns), args.batch):
            learner.step(turns[i : i + args.batch])
        curve.append(held_out(policy, tok, eval_qs, args.max_new))
        print(
            f"{mode} round {r + 1}: held-out {curve[-1]:.0%} ({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    return {
        "mode": mode,
        "channel": args.channel,
        "curve": curve,
        "sessions_until_3_passes": _until_three(first_replies),
        "train_first_reply_pass_rate": sum(first_replies) / max(len(first_replies), 1),
        "seconds": time.perf_counter() - t0,
    }


def _exchange(question: str, reply: str, channel: str) -> Exchange:
    """What the judge reads: the user's next message, or the text of their report."""
    if channel == "report":
        return Exchange(tuple(messages(question)), reply, "feedback", report(reply)["feedback"])
    return Exchange(tuple(messages(question)), reply, "user", react(reply))


def _until_three(passed: list[bool]) -> int | None:
    run = 0
    for i, ok in enumerate(passed, start=1):
        run = run + 1 if ok else 0
        if run == 3:
            return i
    return None


def plot(results: list[dict[str, Any]], sessions: int, path: Path, channel: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for res in results:
        xs = [i * sessions for i in range(len(res["curve"]))]
        ax.plot(xs, [100 * v for v in res["curve"]], marker="o", label=res["mode"])
    how = "text-only reports" if channel == "report" else "next-turn reactions"
    ax.set_xlabel(f"sessions ({how} only)")
    ax.set_ylabel("held-out one-sentence answers (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"openclaw on SmolLM2-135M: learning from {how}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "reef" / "models")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=None, help="default: the mode's")
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--channel", choices=("next_turn", "report"), default="next_turn")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("docs/reactions"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    policy, tok = load(args.model, args.cache)
    base = held_out(policy, tok, questions("held_out"), args.max_new)
    print(f"frozen: held-out {base:.0%}", flush=True)
    del policy
    results = [{"mode": "frozen", "curve": [base] * (args.rounds + 1)}]
    results += [run_arm(m, args, base) for m in args.arms.split(",")]
    summary = {
        "model": args.model,
        "rounds": args.rounds,
        "sessions_per_round": args.sessions,
        "batch": args.batch,
        "lr": {m: OpenClawParams(mode=cast(Mode, m), learning_rate=args.lr).lr() for m in ARMS},
        "channel": args.channel,
        "max_new_tokens": args.max_new,
        "held_out_questions": len(questions("held_out")),
        "wall_seconds": time.perf_counter() - t0,
        "arms": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(summary, indent=2))
    plot(results, args.sessions, args.out.with_suffix(".png"), args.channel)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
