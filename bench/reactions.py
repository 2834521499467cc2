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

`--seed N` draws another stream: the training answers are sampled with torch seed 1000·N + round
and the LoRA A matrices are initialised from torch seed N (B starts at zero, so every arm still
starts at the frozen model). The questions, the judge's votes for a given reply and the greedy
held-out answers do not depend on it. Seed 0 (the default) is the stream every earlier run used;
comparing arms over a few seeds tells a real gap from one stream's luck.

    .venv/bin/python bench/reactions.py --arms combined,rl --lr 3e-4 --seed 1 --out /tmp/s1
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

from demo.preference import HELD_OUT_KEYS, correct
from demo.reactions import messages, passes, questions, react, report, rule_judge
from reef.engines.base import CAPTURE_TOPK
from reef.judge import Exchange, Judge, dispatch
from reef.models import resolve_model
from reef.recipes.openclaw.learner import OpenClawLearner
from reef.recipes.openclaw.recipe import Mode, OpenClawParams
from reef.recipes.openclaw.turns import JudgedTurn

ARMS = ("combined", "rl", "opd")
# Besides the modes: combined without §2.2's anchor teacher (OpenClawParams.anchor = False).
NO_ANCHOR = "combined-no-anchor"
SEED_STRIDE = 1000  # a --seed's sampling seeds start here: no overlap below 1000 rounds


def load(model: str, cache: Path, seed: int = 0) -> tuple[Any, Any]:
    """The model with a fresh LoRA adapter, its A matrices drawn from torch seed `seed`."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model(model, cache)
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    torch.manual_seed(seed)
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


def held_out(policy: Any, tok: Any, qs: list[str], max_new: int) -> tuple[float, float]:
    """The share of held-out answers (greedy) that suit the user, and that still name the
    question's reference answer (demo.preference's keys): getting short by getting wrong
    shows in the second."""
    answers = generate(policy, tok, qs, max_new, sample=False, seed=0)
    suited = sum(passes(text) for _, _, text in answers) / len(answers)
    right = sum(
        correct(text, keys) for (_, _, text), keys in zip(answers, HELD_OUT_KEYS, strict=True)
    )
    return suited, right / len(answers)


def run_arm(arm: str, args: argparse.Namespace, base: tuple[float, float]) -> dict[str, Any]:
    mode = "combined" if arm == NO_ANCHOR else arm
    policy, tok = load(args.model, args.cache, args.seed)
    p = OpenClawParams(
        mode=cast(Mode, mode),
        batch_size=args.batch,
        learning_rate=args.lr,
        anchor=arm != NO_ANCHOR,
    )
    learner = OpenClawLearner(policy, tok, p.setup())
    judge = Judge(rule_judge, "function:demo.reactions:rule_judge", votes=3)
    train_qs, eval_qs = questions("train"), questions("held_out")
    curve, right, first_replies, t0 = [base[0]], [base[1]], [], time.perf_counter()
    for r in range(args.rounds):
        qs = [train_qs[(r * args.sessions + i) % len(train_qs)] for i in range(args.sessions)]
        turns = []
        for q, (prompt, completion, text) in zip(
            qs,
            generate(policy, tok, qs, args.max_new, sample=True, seed=SEED_STRIDE * args.seed + r),
            strict=True,
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
        suited, still_right = held_out(policy, tok, eval_qs, args.max_new)
        curve.append(suited)
        right.append(still_right)
        print(
            f"{arm} round {r + 1}: held-out {suited:.0%}, {still_right:.0%} still right "
            f"({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    return {
        "mode": arm,
        "channel": args.channel,
        "curve": curve,
        "held_out_correct": right,
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


def across_seeds(paths: list[Path], out: Path) -> int:
    """One JSON and one PNG from runs of several streams (`--seed`): per arm and learning
    rate, each stream's curve and the mean curve, sessions until 3 suited first answers in a
    row and the share of suited first answers (the OpenClaw-RL paper's checks), per stream and
    mean."""
    groups: dict[tuple[str, float | None], list[dict[str, Any]]] = {}
    for path in paths:
        run = json.loads(path.read_text())
        for arm in run["arms"]:
            if arm["mode"] == "frozen":
                key: tuple[str, float | None] = ("frozen", None)
            else:
                mode = "combined" if arm["mode"] == NO_ANCHOR else arm["mode"]
                key = (arm["mode"], run["lr"][mode])
            groups.setdefault(key, []).append({"seed": run["seed"], **arm})
    arms = []
    for (mode, lr), runs in groups.items():
        runs = sorted({r["seed"]: r for r in runs}.values(), key=lambda r: r["seed"])
        mean = [sum(c) / len(runs) for c in zip(*(r["curve"] for r in runs), strict=True)]
        untils = [r.get("sessions_until_3_passes") for r in runs]
        rates = [r.get("train_first_reply_pass_rate") for r in runs]
        arms.append(
            {
                "mode": mode,
                "lr": lr,
                "seeds": [r["seed"] for r in runs],
                "curves": [r["curve"] for r in runs],
                "held_out_correct": [r.get("held_out_correct") for r in runs],
                "mean_curve": mean,
                "sessions_until_3_passes": untils,
                "train_first_reply_pass_rate": rates,
                "mean_sessions_until_3": _mean(untils),
                "mean_first_reply_pass_rate": _mean(rates),
            }
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(
        json.dumps({"runs": [str(p) for p in paths], "arms": arms}, indent=2)
    )
    _plot_seeds(arms, out.with_suffix(".png"))
    for a in arms:
        curve = " ".join(f"{100 * v:.0f}" for v in a["mean_curve"])
        print(f"{a['mode']} lr {a['lr']} seeds {a['seeds']}: mean {curve}")
    return 0


def _mean(values: list[Any]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _plot_seeds(arms: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.2, 4.4))
    for i, a in enumerate(arms):
        color = f"C{i}"
        name = a["mode"] if a["lr"] is None else f"{a['mode']}, lr {a['lr']:g}"
        rounds = range(len(a["mean_curve"]))
        for curve in a["curves"]:
            ax.plot(rounds, [100 * v for v in curve], color=color, alpha=0.25, linewidth=1)
        label = f"{name} (mean of {len(a['seeds'])})"
        ax.plot(rounds, [100 * v for v in a["mean_curve"]], color=color, marker="o", label=label)
    ax.set_xlabel("round (8 sessions each, next-turn reactions only)")
    ax.set_ylabel("held-out one-sentence answers (%)")
    ax.set_ylim(0, 100)
    ax.set_title("openclaw on SmolLM2-135M: arms over several streams")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
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
    ap.add_argument("--arms", default=",".join(ARMS), help=f"of {', '.join(ARMS)}, {NO_ANCHOR}")
    ap.add_argument("--channel", choices=("next_turn", "report"), default="next_turn")
    ap.add_argument("--seed", type=int, default=0, help="sampling stream and LoRA init")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("docs/reactions"))
    ap.add_argument(
        "--across-seeds",
        nargs="+",
        type=Path,
        help="merge these runs' JSON (several --seed) into --out's JSON and PNG; runs nothing",
    )
    args = ap.parse_args(argv)
    if args.across_seeds:
        return across_seeds(args.across_seeds, args.out)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    policy, tok = load(args.model, args.cache)
    base = held_out(policy, tok, questions("held_out"), args.max_new)
    print(f"frozen: held-out {base[0]:.0%}, {base[1]:.0%} right", flush=True)
    del policy
    frozen = {
        "curve": [base[0]] * (args.rounds + 1),
        "held_out_correct": [base[1]] * (args.rounds + 1),
    }
    results = [{"mode": "frozen", **frozen}]
    results += [run_arm(m, args, base) for m in args.arms.split(",")]
    summary = {
        "model": args.model,
        "rounds": args.rounds,
        "sessions_per_round": args.sessions,
        "batch": args.batch,
        "lr": {m: OpenClawParams(mode=cast(Mode, m), learning_rate=args.lr).lr() for m in ARMS},
        "channel": args.channel,
        "seed": args.seed,
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
