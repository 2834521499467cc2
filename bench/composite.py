"""Composite against its parts on SmolLM2: do weights trained under the evolved harness beat
the weights alone?

The task is demo/terse.py's: the app's chat says only "You are a helpful assistant.", and its
user wants answers of at most ten words (25 % of the 16 held-out questions pass greedily on
SmolLM2-135M-Instruct). Each answer of a batch of training questions is reported with its 0/1
score and, when it failed, the question's reference answer as the correction (demo/preference.py's
pools; demo/app.py asks and reports through the official openai SDK). The scorer is a rule that
checks the target behaviour itself: the numbers show that the plumbing carries the signal to
each step, not what a judge could tell.

Arms, one scenario each on one in-process Reef (InProcessReef: the app `reef serve` builds, the
embedded engine), each evolved once by the evolve flow in this process (reef.flows.evolve,
force) from the same batch (the same questions, answered greedily by the same base), with the
same seed, then measured on the same held-out questions through the openai SDK (greedy, the
release's harness injected by the server, as it serves):

- base: the head, no change;
- sft: weights alone (LoRA; demo/__main__.py's SmolLM2 parameters);
- harness: the harness recipe alone (GEPA, SmolLM2 itself as the proposer, the rule as scorer);
- composite: order [harness, weights], the same two recipes: the weights train on the batch's
  prompts rendered with the evolved harness's system text, and serve with it.

The gate runs at policy `always` on a task set of training questions nobody reported (so every
candidate serves and is measured, whatever its gate would say); it still computes its numbers,
and the bench reports the verdict the default policy (`improve`, margin 0: the one-sided 90 %
lower bound of the mean improvement must be above 0) gives on the very same numbers, per arm and
per composite step. Had `improve` rejected the composite's harness step, a production run would
have trained its weights under the head's harness instead: the sft arm.

    .venv/bin/python bench/composite.py                   # seeds 0, 1 and 2, SmolLM2
    .venv/bin/python bench/composite.py --epochs 1 --json /tmp/c1.json --figure /tmp/c1.png
    .venv/bin/python bench/composite.py --seeds 0 --model tiny --out /tmp/c  # a smoke run

A seed draws the batch (`--batch` training questions), the gate's task set (`--gate-tasks`
others) and `reef.seed` (the LoRA initialisation and data order, the search's minibatches, the
gate's bootstrap). The base arm's greedy answers are the same for every seed: measured once.

Writes bench/data/composite.json (every arm's numbers, gate, harness text and held-out answers)
and docs/composite.png, and prints the table docs/recipes.md quotes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from demo import terse  # noqa: E402
from demo.__main__ import RECIPE_PARAMS, Clock, measure, right  # noqa: E402
from demo.app import App  # noqa: E402
from demo.preference import HELD_OUT, HELD_OUT_KEYS, TRAIN, correct  # noqa: E402
from reef.gate import GatePolicy, decide  # noqa: E402
from reef.harness import Harness  # noqa: E402
from reef.intervals import wilson  # noqa: E402

ARMS = ("base", "sft", "harness", "composite")
SCORER = "demo.terse:scorer"
# The harness search on two cores: a few low-scored answers, the rule as the episodes' scorer,
# and episodes answered as the app asks, greedily (temperature 0: one repeat says it all). At the
# recipe's default 0.7 its gate saw no change on seed 0 where the app's greedy answers went from
# 25 % to 62 % held-out: it judged answers the app never gets.
HARNESS_PARAMS: dict[str, Any] = {
    "threshold": 0.5,
    "max_examples": 6,
    "repeats": 1,
    "temperature": 0.0,
    "max_tokens": 32,
    "max_metric_calls": 16,
    "proposer_max_tokens": 200,
    "scorer": SCORER,
}
SFT_PARAMS: dict[str, Any] = {**RECIPE_PARAMS, "threshold": 0.5, "use_corrections": True}
# Pairs of arms compared question by question over every seed, with the gate's own test.
PAIRS = (("composite", "sft"), ("composite", "harness"), ("sft", "base"), ("harness", "base"))


@dataclass(frozen=True)
class Plan:
    """One seed's stream: the reported training questions, and the gate's task set (training
    questions nobody reported; never the held-out ones)."""

    seed: int
    batch: list[tuple[str, str]]
    gate_tasks: Path


def plan(seed: int, batch: int, gate_tasks: int, folder: Path) -> Plan:
    order = random.Random(seed).sample(TRAIN, len(TRAIN))
    path = folder / f"gate-tasks-s{seed}.jsonl"
    lines = [
        json.dumps({"id": f"gate-{i}", "messages": terse.messages(q)})
        for i, (q, _) in enumerate(order[batch : batch + gate_tasks])
    ]
    path.write_text("\n".join(lines) + "\n")
    return Plan(seed, order[:batch], path)


def overrides(srv: Any, arm: str, p: Plan, args: argparse.Namespace) -> dict[str, Any]:
    """The evolve run's settings: the arm's recipe, this seed, the bench's gate."""
    sft = {**SFT_PARAMS, "epochs": args.epochs}
    recipe: dict[str, Any] = {
        "sft": {"recipe": "sft", "params": sft},
        "harness": {"recipe": "harness", "params": HARNESS_PARAMS},
        "composite": {
            "recipe": "composite",
            "params": {
                "order": ["harness", "weights"],
                "harness": {"recipe": "harness", "params": HARNESS_PARAMS},
                "weights": {"recipe": "sft", "params": sft},
            },
        },
    }[arm]
    return {
        "server": {"state_dir": str(srv.state_dir), "port": srv.port},
        "engine": engine(args),
        "reef": {**recipe, "batch_size": len(p.batch), "seed": p.seed},
        "gate": {
            "policy": "always",
            "eval_dataset": str(p.gate_tasks),
            "scorer": SCORER,
            "max_tokens": args.max_tokens,
        },
    }


def engine(args: argparse.Namespace) -> dict[str, Any]:
    # all 16 held-out questions in one batch, on every core
    return {"model": args.model, "embedded": {"max_batch_size": len(HELD_OUT), "threads": 2}}


def improve(gate: dict[str, Any] | None) -> str | None:
    """The default gate's verdict (policy improve, bootstrap, margin 0) on the numbers a gate
    computed under `always`: reef.gate.decide's rule, on the same bound (same seed, same
    resamples)."""
    if not gate:
        return None
    low = gate.get("ci_low")
    return "accepted" if low is not None and low > 0.0 else "rejected"


def verdicts(result: dict[str, Any]) -> dict[str, Any]:
    """Per step (composite) or for the run: the gate's numbers and improve's verdict."""

    def one(gate: dict[str, Any] | None, status: str) -> dict[str, Any]:
        keep = ("n", "mean_head", "mean_candidate", "mean_diff", "ci_low", "p_value")
        return {
            "status": status,
            "improve": improve(gate),
            **{k: (gate or {}).get(k) for k in keep},
        }

    if "steps" in result:
        steps = result["steps"]["steps"]
        return {name: one(s.get("gate"), s["status"]) for name, s in steps.items()}
    return {"run": one(result.get("gate"), result["status"])}


def released(app: App, result: dict[str, Any]) -> str:
    """The release the arm serves now: the published one; a pending one promoted (a harness
    that changes executable content waits for an admin); the head when nothing was trained."""
    if result["status"] == "pending":
        r = app.http.post(
            f"/reef/scenarios/{app.scenario}/promote", json={"release_id": result["candidate_id"]}
        )
        r.raise_for_status()
        return str(r.json()["release_id"])
    if result["status"] == "published":
        return str(result["release_id"])
    head = app.head()
    assert head is not None
    return str(head["release_id"])


def served_harness(app: App) -> dict[str, Any]:
    got = app.http.get("/reef/harness", params={"scenario": app.scenario}).json()
    files = {f["path"]: f["content"] for f in got.get("files") or []}
    return {"content_hash": got.get("content_hash"), "system_text": Harness(files).system_text()}


def app_for(srv: Any, arm: str, seed: int, args: argparse.Namespace) -> App:
    return App(srv.url, f"{arm}-s{seed}", args.model, args.max_tokens, terse.messages, terse.score)


def feedback(srv: Any, arms: list[str], p: Plan, args: argparse.Namespace) -> dict[str, Any]:
    """The seed's batch, asked and reported in every trained arm's scenario: each question in
    all of them at once (one engine batch of the same prompt: the same answer in each), one
    question after another (a round's training order is its records' order)."""
    apps = [app_for(srv, arm, p.seed, args) for arm in arms]
    passing, differing = 0, 0
    try:
        for app in apps:
            app.create_scenario(f"bench/composite.py: {app.scenario}")
        with ThreadPoolExecutor(max_workers=len(apps)) as pool:
            for question in p.batch:
                answers = list(pool.map(lambda app, q=question: app.ask(*q), apps))
                for app, answer in zip(apps, answers, strict=True):
                    app.report(answer)
                passing += int(answers[0].score)
                differing += len({a.text for a in answers}) > 1
    finally:
        for app in apps:
            app.close()
    return {"batch_passing": passing, "batch_answers_differing": differing}


def run_arm(srv: Any, arm: str, p: Plan, args: argparse.Namespace, clock: Clock) -> dict[str, Any]:
    """One arm of one seed, its batch reported: evolve once, measure the held-out."""
    from reef.flows.evolve import evolve

    started = time.monotonic()
    app = app_for(srv, arm, p.seed, args)
    out: dict[str, Any] = {"arm": arm, "seed": p.seed}
    try:
        app.create_scenario(f"bench/composite.py: {app.scenario}")
        result: dict[str, Any] = {"status": "base"}
        if arm != "base":
            result = evolve(app.scenario, overrides=overrides(srv, arm, p, args), force=True)
            out["gate"] = verdicts(result)
            if "steps" in result:
                out["weights_trained_under"] = result["steps"].get("weights_trained_under")
        out["status"] = result["status"]
        release = released(app, result)
        rate, _, held = measure(app, release, clock)
        out |= {
            "release_id": release,
            "pass_rate": rate,
            "passed": [int(a.score) for a in held],
            "correct": right(held),
            "answers": [a.text for a in held],
            "harness": served_harness(app),
            "seconds": round(time.monotonic() - started, 1),
        }
    finally:
        app.close()
    clock.say(
        f"{arm} s{p.seed}: {out['status']}, held-out {sum(out['passed'])}/{len(HELD_OUT)} "
        f"pass, {out['correct']}/{len(HELD_OUT)} correct ({out['seconds']:.0f} s)"
    )
    return out


def summary(runs: list[dict[str, Any]], arms: list[str]) -> dict[str, Any]:
    """Per arm: pass rate per seed, median, the pooled rate with its 90 % Wilson interval,
    and correctness; per pair of arms, the gate's paired test over every (seed, question)."""
    n = len(HELD_OUT)
    out: dict[str, Any] = {"arms": {}, "pairs": {}}
    for arm in arms:
        mine = [r for r in runs if r["arm"] == arm]
        passed = sum(sum(r["passed"]) for r in mine)
        total = n * len(mine)
        out["arms"][arm] = {
            "per_seed": [r["pass_rate"] for r in mine],
            "median": statistics.median(r["pass_rate"] for r in mine),
            "pooled": passed / total,
            "wilson90": wilson(passed, total),
            "correct_per_seed": [r["correct"] / n for r in mine],
            "correct_median": statistics.median(r["correct"] / n for r in mine),
        }
    for a, b in PAIRS:
        if a in arms and b in arms:
            out["pairs"][f"{a} vs {b}"] = {
                "pass": paired(runs, a, b, lambda r: r["passed"]),
                "correct": paired(runs, a, b, rights),
            }
    return out


def rights(run: dict[str, Any]) -> list[int]:
    """Per held-out question: whether the arm's answer names the reference (the keys)."""
    return [int(correct(t, k)) for t, k in zip(run["answers"], HELD_OUT_KEYS, strict=True)]


def paired(runs: list[dict[str, Any]], a: str, b: str, per_question: Any) -> dict[str, Any]:
    """Arm `a` against arm `b` over every (seed, question) with the gate's paired tests: the
    mean difference, its two-sided 90 % bootstrap interval (the gate's one-sided 95 % bounds
    either way) and the one-sided sign test in the direction it went."""
    va = [x for r in runs if r["arm"] == a for x in per_question(r)]
    vb = [x for r in runs if r["arm"] == b for x in per_question(r)]
    policy = GatePolicy(policy="improve", confidence=0.95)
    up, down = decide(va, vb, policy), decide(vb, va, policy)
    return {
        "n": up.n,
        "mean_diff": up.mean_diff,
        "low": up.ci_low,
        "high": None if down.ci_low is None else -down.ci_low,
        "p_value": (up if (up.mean_diff or 0.0) >= 0 else down).p_value,
        "wins": up.wins,
        "losses": up.losses,
    }


def pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def gate_cell(r: dict[str, Any]) -> str:
    """What the default gate would have said: per step for the composite."""
    gate = r.get("gate") or {}
    if not gate:
        return "–"
    parts = []
    for name, g in gate.items():
        said = g["improve"] or g["status"]
        label = "" if name == "run" else f"{name} "
        diff = "" if g["mean_diff"] is None else f" ({g['mean_diff']:+.2f}, n={g['n']})"
        parts.append(f"{label}{said}{diff}")
    return "; ".join(parts)


def cell(test: dict[str, Any]) -> str:
    """A paired test as "mean diff [90 % interval], p"."""
    if test["low"] is None or test["high"] is None:
        return f"{test['mean_diff']:+.3f}"
    return (
        f"{test['mean_diff']:+.3f} [{test['low']:+.3f}, {test['high']:+.3f}], "
        f"p {test['p_value']:.2g}"
    )


def table(runs: list[dict[str, Any]], summ: dict[str, Any], arms: list[str]) -> str:
    """The markdown table docs/recipes.md quotes: arms side by side, per seed and median."""
    seeds = sorted({r["seed"] for r in runs})
    head = "| arm | " + " | ".join(f"seed {s}" for s in seeds)
    head += " | median | pooled (90 % Wilson) | correct, median |"
    lines = [head, "|---|" + "---:|" * (len(seeds) + 3)]
    for arm in arms:
        a = summ["arms"][arm]
        low, high = a["wilson90"]
        cells = [pct(x) for x in a["per_seed"]]
        lines.append(
            f"| {arm} | " + " | ".join(cells) + f" | **{pct(a['median'])}** | "
            f"{pct(a['pooled'])} [{pct(low)}, {pct(high)}] | {pct(a['correct_median'])} |"
        )
    lines += [
        "",
        "| arm | seed | the default gate (improve) on the gate's numbers |",
        "|---|---:|---|",
    ]
    lines += [f"| {r['arm']} | {r['seed']} | {gate_cell(r)} |" for r in runs if r["arm"] != "base"]
    lines += [
        "",
        "| paired over seeds × questions | n | ≤ 10 words: mean diff [90 % interval], sign p "
        "| correct: mean diff [90 % interval], sign p |",
        "|---|---:|---|---|",
    ]
    for name, p in summ["pairs"].items():
        lines.append(f"| {name} | {p['pass']['n']} | {cell(p['pass'])} | {cell(p['correct'])} |")
    return "\n".join(lines)


def plot(
    runs: list[dict[str, Any]], summ: dict[str, Any], arms: list[str], epochs: float, path: Path
) -> None:
    """Held-out pass rate and correctness per arm: a dot per seed, the median's bar, the
    pooled 90 % Wilson interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(HELD_OUT)
    fig, axes = plt.subplots(1, 2, figsize=(10.0, 4.0))
    for x, arm in enumerate(arms):
        a = summ["arms"][arm]
        mine = [r for r in runs if r["arm"] == arm]
        axes[0].bar(x, 100 * a["median"], color="#9ecae1")
        low, high = a["wilson90"]
        err = [[100 * max(0.0, a["pooled"] - low)], [100 * max(0.0, high - a["pooled"])]]
        axes[0].errorbar(x, 100 * a["pooled"], yerr=err, fmt="none", color="black", capsize=4)
        rates = [100 * r["pass_rate"] for r in mine]
        axes[0].scatter([x] * len(mine), rates, color="#08519c", zorder=3)
        axes[1].bar(x, 100 * a["correct_median"], color="#c7e9c0")
        rights = [100 * r["correct"] / n for r in mine]
        axes[1].scatter([x] * len(mine), rights, color="#006d2c", zorder=3)
    labels = ("held-out answers of at most 10 words (%)", "held-out answers still correct (%)")
    for ax, label in zip(axes, labels, strict=True):
        ax.set_xticks(range(len(arms)), arms)
        ax.set_ylim(0, 100)
        ax.set_ylabel(label)
    seeds = len({r["seed"] for r in runs})
    fig.suptitle(
        f"SmolLM2-135M, one evolve run per arm from the same batch ({seeds} seeds, "
        f"sft {epochs:g} epoch{'' if epochs == 1 else 's'})\n"
        "bar: median over seeds, dot: a seed, whisker: pooled 90 % Wilson interval",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine() -> str:
    """The CPU's model and core count, for the table's caption."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        name = next(
            line.split(":", 1)[1].strip()
            for line in cpuinfo.splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        name = "unknown CPU"
    return f"{name}, {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--batch", type=int, default=16, help="reported training questions")
    ap.add_argument("--gate-tasks", type=int, default=8, help="the gate's task set")
    ap.add_argument("--epochs", type=float, default=SFT_PARAMS["epochs"], help="sft's epochs")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "data" / "composite.json")
    ap.add_argument("--figure", type=Path, default=ROOT / "docs" / "composite.png")
    ap.add_argument("--out", type=Path, help="write composite.json and .png here instead")
    ap.add_argument(
        "--from",
        dest="source",
        type=Path,
        metavar="JSON",
        help="train nothing: rebuild a run's summary and table (into its JSON) and --figure",
    )
    args = ap.parse_args(argv)
    if args.out is not None:
        args.json, args.figure = args.out / "composite.json", args.out / "composite.png"
    if args.source is not None:
        return rebuild(args.source, args.figure)
    arms = args.arms.split(",")
    if unknown := sorted(set(arms) - set(ARMS)):
        ap.error(f"unknown arms {unknown}; known: {list(ARMS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    clock = Clock()
    with tempfile.TemporaryDirectory(prefix="reef-bench-composite-") as tmp:
        runs = run_all(Path(tmp), seeds, arms, args, clock)
    summ = summary(runs, arms)
    text = table(runs, summ, arms)
    print("\n" + text, flush=True)
    command = "bench/composite.py " + " ".join(argv if argv is not None else sys.argv[1:])
    data = {
        "model": args.model,
        "task": "demo/terse.py: at most 10 words (a rule scorer: it checks the target itself)",
        "command": command.strip(),
        "machine": machine(),
        "load_average_at_end": os.getloadavg()[0],
        "wall_seconds": round(clock(), 1),
        "batch": args.batch,
        "gate_tasks": args.gate_tasks,
        "max_tokens": args.max_tokens,
        "harness_params": HARNESS_PARAMS,
        "sft_params": {**SFT_PARAMS, "epochs": args.epochs},
        "held_out_questions": [q for q, _ in HELD_OUT],
        "summary": summ,
        "table": text,
        "runs": runs,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(data, indent=1, default=str) + "\n")
    plot(runs, summ, arms, args.epochs, args.figure)
    clock.say(f"written {args.json} and {args.figure}; {clock() / 60:.1f} min in all")
    return 0


def rebuild(source: Path, figure: Path) -> int:
    """A run's summary, table and figure made again from its runs (its answers included),
    after a change to what they show; the runs themselves stay as measured."""
    data = json.loads(source.read_text())
    runs = data["runs"]
    arms = list(dict.fromkeys(r["arm"] for r in runs))
    data["summary"] = summary(runs, arms)
    data["table"] = table(runs, data["summary"], arms)
    source.write_text(json.dumps(data, indent=1, default=str) + "\n")
    plot(runs, data["summary"], arms, data["sft_params"]["epochs"], figure)
    print(data["table"])
    return 0


def run_all(
    tmp: Path, seeds: list[int], arms: list[str], args: argparse.Namespace, clock: Clock
) -> list[dict[str, Any]]:
    """Every arm of every seed on one in-process Reef; flows run here (Prefect's temporary
    server, its home in `tmp`)."""
    os.environ.setdefault("PREFECT_HOME", str(tmp / "prefect"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("TQDM_DISABLE", "1")  # the trainers' progress bars: the flow logs steps
    from reef.cli.testing import InProcessReef
    from reef.flows.worker import tie_temporary_server

    tie_temporary_server()
    runs: list[dict[str, Any]] = []
    trained = [a for a in arms if a != "base"]
    with InProcessReef(tmp / "state", engine=engine(args)) as srv:
        clock.say(f"serving {args.model} on {srv.url}/v1 (state in {srv.state_dir})")
        for seed in seeds:
            p = plan(seed, args.batch, args.gate_tasks, tmp)
            fed = feedback(srv, trained, p, args) if trained else {}
            if fed:
                clock.say(
                    f"seed {seed}: {len(p.batch)} questions asked and reported in "
                    f"{len(trained)} scenarios, {fed['batch_passing']} answers pass"
                )
            for arm in arms:
                if arm == "base" and any(r["arm"] == "base" for r in runs):
                    # greedy answers of the same weights: the same for every seed
                    runs.append({**next(r for r in runs if r["arm"] == "base"), "seed": seed})
                    continue
                try:
                    got = run_arm(srv, arm, p, args, clock)
                    runs.append(got if arm == "base" else {**got, **fed})
                except Exception:
                    clock.say(f"{arm} s{seed} failed; the server's log:\n{srv.log()[-3000:]}")
                    raise
    return runs


if __name__ == "__main__":
    try:
        sys.exit(main())
    except httpx.HTTPError as e:
        sys.exit(f"bench/composite.py: {e}")
