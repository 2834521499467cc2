"""Score-only learning, recipe by recipe: kto, sao and openclaw (mode rl) against the frozen
model, each on the same deterministic stream of thumbs (0/1 scores, no corrections).

The preference is demo/terse.py's (answers of at most ten words; base rate 25 % held-out on
SmolLM2). Each round, per arm: `sessions` training questions are answered by the arm's current
release (sampled at T 0.6, top-p 0.95, top-k 20 as the reactions bench serves), the engine's
records are kept as it keeps them (exact token ids, the raw per-token log-probs of the sampled
tokens, the top-4 capture), each answer is scored 0/1 by the rule (a thumbs signal), and the
arm's recipe trains one candidate on those rows through its own `train(job)` — the same call
the evolve flow makes, continuing from the previous round's adapter (LoRA on SmolLM2). The
held-out questions are then answered greedily by the new release and scored by the same rule.

    .venv/bin/python bench/score_only.py --rounds 10 --out docs/score_only
    .venv/bin/python bench/score_only.py --arms kto --param kto.learning_rate=1e-4 --rounds 3
    .venv/bin/python bench/score_only.py --combine /tmp/so/*.json --out docs/score_only

Each arm's JSON and PNG are written as soon as it finishes; `--combine` merges runs of the same
stream (arms run one at a time on a small machine) into one table and figure. Besides the
preference, the held-out answers are checked for correctness (demo/preference.py's keys): a
recipe that learns "short" by answering wrong shows there.

`--param ARM.FIELD=VALUE` overrides one recipe parameter of one arm (VALUE read as JSON when it
parses, else as a string), through the recipe's own `from_config` validation.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from demo.preference import HELD_OUT_KEYS, correct
from demo.terse import messages, questions, score
from reef.datasets import SCHEMAS
from reef.engines.base import CAPTURE_TOPK
from reef.models import resolve_model
from reef.recipe import Recipe, TrainJob, WeightsRecipe, load_recipe

# arm -> (recipe, the parameters score-only feedback needs: openclaw reads 0/1 scores as
# thumbs, +1 at or above 0.5, -1 below, in its RL-only mode).
ARMS: dict[str, tuple[str, dict[str, Any]]] = {
    "kto": ("kto", {}),
    "sao": ("sao", {}),
    "openclaw-rl": ("openclaw", {"mode": "rl", "thumbs_threshold": 0.5}),
}
KINDS = {"kto": "scored", "sao": "rollout", "openclaw": "rollout"}


@dataclass(frozen=True)
class Answer:
    """One served answer as the engine records it."""

    question: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]  # log-softmax of the raw logits at each sampled token
    topk_ids: list[list[int]]  # the raw distribution's top CAPTURE_TOPK ids per token
    text: str


def policy_for(base: Path, parent: Path | None) -> tuple[Any, Any]:
    """The release `parent` (an adapter) on the base model, as the trainers load it."""
    from reef.recipes.training import LoraParams, load_policy

    job = TrainJob(
        "bench",
        base,
        pa.table({}),
        Path(tempfile.gettempdir()),
        parent_kind="adapter" if parent else "base",
        parent_path=parent,
    )
    policy, tok = load_policy(job, LoraParams())
    tok.padding_side = "left"
    return policy, tok


@torch.no_grad()
def answer(policy: Any, tok: Any, qs: list[str], max_new: int, seed: int | None) -> list[Answer]:
    """Answers to `qs`, sampled (seed given) or greedy (seed None), with the engine's records."""
    policy.eval()
    prompts = [
        tok(
            tok.apply_chat_template(messages(q), tokenize=False, add_generation_prompt=True),
            add_special_tokens=False,
        ).input_ids
        for q in qs
    ]
    batch = tok.pad({"input_ids": prompts}, return_tensors="pt")
    options: dict[str, Any] = {"do_sample": False}
    if seed is not None:
        torch.manual_seed(seed)
        options = {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20}
    out = policy.generate(
        **batch,
        max_new_tokens=max_new,
        pad_token_id=tok.pad_token_id,
        output_logits=True,
        return_dict_in_generate=True,
        **options,
    )
    width = batch["input_ids"].shape[1]
    raw = torch.log_softmax(torch.stack(out.logits, dim=1).float(), dim=-1)  # (B, T, V)
    results = []
    for i, (q, prompt) in enumerate(zip(qs, prompts, strict=True)):
        ids = out.sequences[i, width:].tolist()
        if tok.eos_token_id in ids:
            ids = ids[: ids.index(tok.eos_token_id) + 1]
        lp = raw[i, : len(ids)]
        results.append(
            Answer(
                q,
                prompt,
                ids,
                lp.gather(-1, torch.tensor(ids)[:, None])[:, 0].tolist(),
                lp.topk(CAPTURE_TOPK, dim=-1).indices.tolist(),
                tok.decode(ids, skip_special_tokens=True),
            )
        )
    policy.train()
    return results


def table(kind: str, answers: list[Answer], scores: list[float], r: int) -> pa.Table:
    """The snapshot the evolve flow would hand the recipe: one row per thumbed answer."""
    rows = []
    for i, (a, s) in enumerate(zip(answers, scores, strict=True)):
        row: dict[str, Any] = {
            "sample_id": f"r{r}_{i}",
            "scenario": "bench",
            "record_ids": [f"rec_{r}_{i}"],
            "release_id": f"rel_{r}",
            "staleness": 0,
            "report_ids": [f"rep_{r}_{i}"],
            "n_tokens": len(a.prompt_ids) + len(a.completion_ids),
            "messages": json.dumps(messages(a.question), sort_keys=True),
            "completion": a.text,
            "score": s,
            "report_id": f"rep_{r}_{i}",
        }
        if kind == "scored":
            row["feedback"] = None  # a thumb, no correction
        else:
            row |= {
                "prompt_token_ids": a.prompt_ids,
                "completion_token_ids": a.completion_ids,
                "completion_mask": [1] * len(a.completion_ids),
                "logprobs": a.logprobs,
                "report_metadata": None,
                "reported_at": None,
                "topk_ids": a.topk_ids,
            }
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=SCHEMAS[kind])


def held_out(policy: Any, tok: Any, max_new: int) -> tuple[float, float]:
    """(pass rate, correct rate) of the greedy held-out answers: the preference, and whether
    the answer still names the right thing (demo/preference.py's keys), so a release that
    got short by getting wrong shows it."""
    answers = answer(policy, tok, questions("held_out"), max_new, seed=None)
    passed = sum(score(a.text) for a in answers) / len(answers)
    right = sum(correct(a.text, k) for a, k in zip(answers, HELD_OUT_KEYS, strict=True))
    return passed, right / len(answers)


def recipe_for(arm: str, overrides: Mapping[str, Any]) -> Recipe:
    name, fixed = ARMS[arm]
    return load_recipe(name, {**fixed, **overrides})


def run_arm(
    arm: str,
    overrides: Mapping[str, Any],
    args: argparse.Namespace,
    base: Path,
    base_rate: tuple[float, float],
) -> dict[str, Any]:
    recipe = recipe_for(arm, overrides)
    assert isinstance(recipe, WeightsRecipe)
    kind = KINDS[ARMS[arm][0]]
    train_qs = questions("train")
    work = Path(tempfile.mkdtemp(prefix=f"score_only_{arm}_"))
    parent: Path | None = None
    curve, right, thumbs, metrics = [base_rate[0]], [base_rate[1]], [], []
    t0 = time.perf_counter()
    try:
        for r in range(args.rounds):
            qs = [train_qs[(r * args.sessions + i) % len(train_qs)] for i in range(args.sessions)]
            policy, tok = policy_for(base, parent)
            answers = answer(policy, tok, qs, args.max_new, seed=args.seed + r)
            scores = [score(a.text) for a in answers]
            thumbs.append(int(sum(scores)))
            del policy
            out = work / f"round{r}"
            job = TrainJob(
                "bench",
                base,
                table(kind, answers, scores, r),
                out,
                parent_kind="adapter" if parent else "base",
                parent_path=parent,
                seed=args.seed + r,
            )
            trained = recipe.train(job)
            metrics.append({k: round(v, 5) for k, v in trained.metrics.items()})
            parent = trained.path
            policy, tok = policy_for(base, parent)
            passed, correct_rate = held_out(policy, tok, args.max_new)
            curve.append(passed)
            right.append(correct_rate)
            del policy
            print(
                f"{arm} round {r + 1}: {thumbs[-1]}/{args.sessions} thumbs up, held-out "
                f"{curve[-1]:.0%} (correct {right[-1]:.0%}) ({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "arm": arm,
        "recipe": ARMS[arm][0],
        "params": recipe.describe()["params"],
        "curve": curve,
        "held_out_correct": right,
        "thumbs_up_per_round": thumbs,
        "train_metrics": metrics,
        "seconds": time.perf_counter() - t0,
    }


def label(arm: str, overrides: Mapping[str, Any]) -> str:
    """ "kto (learning_rate 1e-4)", or "kto (defaults)"."""

    def show(v: Any) -> str:
        return f"{v:.0e}".replace("e-0", "e-") if isinstance(v, float) else str(v)

    changed = ", ".join(f"{k} {show(v)}" for k, v in overrides.items())
    return f"{arm} ({changed or 'defaults'})"


def parse_params(items: list[str], arms: list[str]) -> dict[str, dict[str, Any]]:
    """`ARM.FIELD=VALUE` items -> {arm: {field: value}}."""
    out: dict[str, dict[str, Any]] = {a: {} for a in arms}
    for item in items:
        key, _, raw = item.partition("=")
        arm, _, field = key.partition(".")
        if arm not in out or not field or not raw:
            raise SystemExit(f"--param {item!r}: expected ARM.FIELD=VALUE with ARM in {arms}")
        try:
            out[arm][field] = json.loads(raw)
        except json.JSONDecodeError:
            out[arm][field] = raw
    return out


COLORS = {"frozen": "grey", "openclaw-rl": "tab:blue", "sao": "tab:red", "kto": "tab:green"}


def plot(results: list[dict[str, Any]], sessions: int, path: Path) -> None:
    """Two panels: the preference's pass rate, and how many answers stay right (a release that
    got short by getting wrong shows on the right). Solid: the recipe's defaults."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11.0, 4.2), sharex=True)
    for res in results:
        xs = [i * sessions for i in range(len(res["curve"]))]
        style = "--" if res.get("overrides") else "-"
        for ax, key in zip(axes, ("curve", "held_out_correct"), strict=True):
            if key in res:
                ax.plot(
                    xs,
                    [100 * v for v in res[key]],
                    style,
                    marker="o",
                    markersize=3,
                    color=COLORS.get(res["arm"]),
                    label=res["label"],
                )
    axes[0].set_ylabel("held-out answers of at most 10 words (%)")
    axes[1].set_ylabel("held-out answers still correct (%)")
    for ax in axes:
        ax.set_xlabel("thumbed answers (0/1 scores, no corrections)")
        ax.set_ylim(0, 100)
    axes[0].legend(fontsize=8)
    fig.suptitle("score-only learning on SmolLM2-135M + LoRA, same stream per arm")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "reef" / "models")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--param", action="append", default=[], metavar="ARM.FIELD=VALUE")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("docs/score_only"))
    ap.add_argument(
        "--combine",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="train nothing: merge the arms of runs with the same settings into --out",
    )
    args = ap.parse_args(argv)
    if args.combine:
        return combine(args.combine, args.out)
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        ap.error(f"unknown arms {unknown}; known: {list(ARMS)}")
    overrides = parse_params(args.param, arms)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    base = resolve_model(args.model, args.cache)
    policy, tok = policy_for(base, None)
    base_rate = held_out(policy, tok, args.max_new)
    del policy
    print(f"frozen: held-out {base_rate[0]:.0%} (correct {base_rate[1]:.0%})", flush=True)
    results: list[dict[str, Any]] = [
        {
            "arm": "frozen",
            "label": "frozen",
            "curve": [base_rate[0]] * (args.rounds + 1),
            "held_out_correct": [base_rate[1]] * (args.rounds + 1),
        }
    ]
    for arm in arms:
        res = run_arm(arm, overrides[arm], args, base, base_rate)
        res["overrides"] = overrides[arm]
        res["label"] = label(arm, overrides[arm])
        results.append(res)
        write(args, argv, results, t0)  # each finished arm is kept, should a later one stall
    # The base is shared between arms (recipes.training.shared_base): measure it again, so a
    # recipe that wrote its weights would show here instead of inflating the later arms.
    policy, tok = policy_for(base, None)
    results[0]["held_out_after_all_arms"] = held_out(policy, tok, args.max_new)[0]
    del policy
    write(args, argv, results, t0)
    for res in results:
        print(f"{res['label']}: " + " ".join(f"{100 * v:.0f}" for v in res["curve"]))
    return 0


def combine(paths: list[Path], out: Path) -> int:
    """One JSON and one PNG from several runs of the same stream (arms run one at a time
    where a 2-core machine cannot hold a whole bench in one go)."""
    runs = [json.loads(p.read_text()) for p in paths]
    same = ("model", "rounds", "sessions_per_round", "max_new_tokens", "seed")
    for run, path in zip(runs[1:], paths[1:], strict=True):
        if any(run[k] != runs[0][k] for k in same):
            raise SystemExit(f"{path}: not the same stream as {paths[0]} ({same})")
    frozen = [a for run in runs for a in run["arms"] if a["arm"] == "frozen"]
    if len({a["curve"][0] for a in frozen}) != 1:
        raise SystemExit("the runs measured different base rates: not the same model/stream")
    arms = [frozen[0]] + [a for run in runs for a in run["arms"] if a["arm"] != "frozen"]
    for a in arms[1:]:
        a["label"] = label(a["arm"], a["overrides"])
    summary: dict[str, Any] = {k: runs[0][k] for k in (*same, "preference", "held_out_questions")}
    summary |= {
        "commands": [run["command"] for run in runs],
        "wall_seconds": sum(run["wall_seconds"] for run in runs),
        "arms": arms,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(summary, indent=2))
    plot(arms, summary["sessions_per_round"], out.with_suffix(".png"))
    for res in arms:
        print(f"{res['label']}: " + " ".join(f"{100 * v:.0f}" for v in res["curve"]))
    return 0


def write(
    args: argparse.Namespace, argv: list[str] | None, results: list[dict[str, Any]], t0: float
) -> None:
    """The JSON summary and the PNG curve, arms side by side."""
    summary = {
        "model": args.model,
        "preference": "demo/terse.py: at most 10 words",
        "rounds": args.rounds,
        "sessions_per_round": args.sessions,
        "max_new_tokens": args.max_new,
        "held_out_questions": len(questions("held_out")),
        "seed": args.seed,
        "command": "bench/score_only.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "wall_seconds": time.perf_counter() - t0,
        "arms": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(summary, indent=2))
    plot(results, args.sessions, args.out.with_suffix(".png"))


if __name__ == "__main__":
    sys.exit(main())
