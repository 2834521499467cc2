"""`python -m demo.discover`: TTT-Discover on circle packing through Reef's live inference.

    .venv/bin/python -m demo.discover [--n 5] [--groups 2] [--rollouts 4] [--steps 2]
        [--action program|edits|api|coords] [--seeds 0,1,2] [--arms ttt,search,random]
        [--model smollm2] [--archive-store DIR|s3://bucket/prefix] [--state-dir DIR] [-c FILE]
        [--allow-weak-sandbox] [--docs] [--json]

Starts `reef serve` (its evolve worker on, recipe `tttd`, batch = one G×R grid) and runs each
arm, for each seed, in its own scenario at the same rollout budget (steps × G × R): "ttt"
reports every verified score and waits for each step's LoRA release; "search" runs the same
PUCT on the frozen model; "random" samples every rollout from the seeded baseline (the
program action) or proposes uniformly random edits in the action's format through the same
PUCT (edit actions; no model). What a rollout answers is `--action` (or `discover.action` in
-c FILE; demo/discover/actions.py): `program` (default) or an edit format for small models.
Prints one table row per step and arm (medians over the seeds, min-max), writes discover.png
(best archive score, mean rollout reward, validity, KL to base) and summary.json in the state
dir; with --json, one JSON line per step as it finishes. Each run's archive, best state and
step log are saved after every step in its directory and in the artifact store
(`discover/<scenario>/`): run again with the same --state-dir, or on another machine with the
same --archive-store, and it resumes from the last step done.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from demo.discover.actions import ACTIONS, STARTS
from demo.discover.harness import ArchiveStore, Config, Reef, StepResult, discover
from demo.discover.sandbox import Limits, SandboxUnavailable, boundary_for
from demo.discover.settings import load
from demo.server import Server
from reef.artifacts import ArtifactStore, open_artifacts

ROOT = Path(__file__).resolve().parents[2]
ARMS = ("ttt", "search", "random")


def server_config(cfg: Config, params: dict[str, Any], engine: dict[str, Any]) -> dict:
    return {
        # every rollout of a step in one batch
        "engine": {
            **engine,
            "embedded": {
                "max_batch_size": cfg.groups * cfg.rollouts,
                # a group's R rollouts share their whole prompt: read it once
                "prefix_cache_mb": 64,
                **engine.get("embedded", {}),
            },
        },
        "reef": {
            "recipe": "tttd",
            "batch_size": cfg.groups * cfg.rollouts,  # the barrier: one full grid
            "max_staleness": 0,  # only rollouts of the served release train (§0.2)
            # the rollouts wait on the step's release (the barrier): training has every core
            "train_threads": os.cpu_count() or 1,
            "params": {
                "groups_per_step": cfg.groups,
                "rollouts_per_group": cfg.rollouts,
                **params,
            },
        },
    }


Runs = dict[str, list[list[StepResult]]]  # arm -> one step list per seed


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _per_step(results: list[list[StepResult]], field: str) -> list[list[float]]:
    """The field's value at each step, across the seeds that reached it."""
    steps = max((len(rs) for rs in results), default=0)
    return [[getattr(rs[k], field) for rs in results if len(rs) > k] for k in range(steps)]


def plot(runs: Runs, baseline: float, path: Path, title: str) -> Path:
    """Per arm, the median over seeds at each step (the band: min to max): best verified Σr in
    the archive, mean rollout reward, valid fraction; and each ttt seed's KL to the base."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    panels = (("best", True), ("mean_reward", False), ("valid_fraction", False))
    for color, (arm, results) in enumerate(runs.items()):
        for ax, (field, from_seed) in zip(axes, panels, strict=False):
            values = _per_step(results, field)
            steps = list(range(1, len(values) + 1))
            lo, mid, hi = ([f(v) for v in values] for f in (min, _median, max))
            if from_seed:
                steps, lo, mid, hi = [0, *steps], [baseline, *lo], [baseline, *mid], [baseline, *hi]
            ax.plot(steps, mid, marker="o", color=f"C{color}", label=f"{arm} (median)")
            ax.fill_between(steps, lo, hi, color=f"C{color}", alpha=0.15)
    for seed, rs in enumerate(runs.get("ttt", [])):
        kl = [(r.step + 1, r.kl_to_base) for r in rs if r.kl_to_base is not None]
        if kl:
            axes[3].plot(*zip(*kl, strict=True), marker="o", color="C0", alpha=0.4 + 0.2 * seed)
    axes[0].axhline(baseline, color="grey", ls=":", label="seeded baseline")
    axes[0].set(title="best verified Σr in the archive", xlabel="step")
    axes[1].set(title="mean rollout reward (invalid = 0)", xlabel="step")
    axes[2].set(title="valid rollouts", xlabel="step", ylim=(-0.05, 1.05))
    axes[3].set(title="ttt: KL of the sampled policy to the base", xlabel="step")
    for ax in axes:
        ax.grid(alpha=0.3)
    for ax in axes[:3]:
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def table(runs: Runs, baseline: float) -> str:
    """One row per arm and step: medians over the seeds (min-max for the best)."""
    lines = [
        f"baseline Σr = {baseline:.6f}",
        "| arm | step | best Σr, median (min-max) | mean reward | valid | seconds | KL to base |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for arm, results in runs.items():
        best = _per_step(results, "best")
        mean = _per_step(results, "mean_reward")
        valid = _per_step(results, "valid_fraction")
        secs = _per_step(results, "seconds")
        kls = _per_step(results, "kl_to_base")
        for k, b in enumerate(best):
            kl = [x for x in kls[k] if x is not None]
            lines.append(
                f"| {arm} | {k} | {_median(b):.6f} ({min(b):.6f}-{max(b):.6f}) | "
                f"{_median(mean[k]):.4f} | {_median(valid[k]):.0%} | {_median(secs[k]):.1f} | "
                + (f"{_median(kl):.4g} |" if kl else "– |")
            )
    return "\n".join(lines)


def summarise(runs: Runs, baseline: float) -> dict[str, Any]:
    """Per arm: each seed's final best, their median and range, how many seeds beat the
    baseline, and the mean validity over every rollout."""
    out: dict[str, Any] = {}
    for arm, results in runs.items():
        finals = [rs[-1].best for rs in results if rs]
        rollouts = [r for rs in results for r in rs]
        out[arm] = {
            "best_per_seed": finals,
            "best_median": _median(finals),
            "best_min": min(finals, default=float("nan")),
            "best_max": max(finals, default=float("nan")),
            "seeds_above_baseline": sum(b > baseline for b in finals),
            "valid_fraction": statistics.fmean(r.valid_fraction for r in rollouts)
            if rollouts
            else float("nan"),
        }
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m demo.discover", description=__doc__)
    p.add_argument("--n", type=int, default=5, help="circles (default 5)")
    p.add_argument("--groups", type=int, default=2, help="G: groups per step")
    p.add_argument("--rollouts", type=int, default=4, help="R: rollouts per group (>= 3)")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument(
        "--action",
        choices=ACTIONS,
        help="what a rollout answers (default: discover.action of -c FILE, else program)",
    )
    p.add_argument(
        "--constrained",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the engine enforces the edits schema while decoding (response_format; default: "
        "discover.constrained of -c FILE, else off)",
    )
    p.add_argument(
        "--start",
        choices=STARTS,
        help="the edit actions' seeded circles (default: discover.start of -c FILE, else grid)",
    )
    p.add_argument("--seeds", default="0", help="comma-separated run seeds (default 0)")
    p.add_argument("--arms", default=",".join(ARMS), help="comma-separated: ttt,search,random")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--max-tokens", type=int, default=256)
    # §3.3 samples at temperature 1; SmolLM2-135M at 1.0 wrote 0 of 4 runnable programs in a
    # probe (rambling text), so the CPU demo samples cooler. [deviation] The recorded log-probs
    # are the untempered model's, which the IS loss treats as the sampler's.
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature")
    p.add_argument("--timeout", type=float, default=20.0, help="program wall limit, seconds")
    p.add_argument("-c", "--config", type=Path, help="YAML file with a `discover:` section")
    p.add_argument(
        "--allow-weak-sandbox",
        action="store_true",
        help="as discover.allow_weak_sandbox: true (no bubblewrap boundary; trusted programs only)",
    )
    p.add_argument("--lr", type=float, default=4e-5, help="tttd learning rate (§3.3: 4e-5)")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--engine", default="embedded", choices=["embedded", "vllm"])
    p.add_argument("--state-dir", type=Path, help="default: .reef-demo/discover-<timestamp>")
    p.add_argument(
        "--archive-store",
        help="where each arm's archive is saved besides its directory, for resuming elsewhere: "
        "a directory or s3://bucket/prefix (default: the server's artifact store)",
    )
    p.add_argument("--s3-endpoint-url", help="an S3-compatible server for --archive-store")
    p.add_argument("--docs", action="store_true", help="also write docs/discover.png")
    p.add_argument("--json", action="store_true", help="one JSON line per finished step")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    if not set(arms) <= set(ARMS):
        p.error(f"--arms: choose from {', '.join(ARMS)}")
    try:
        seeds = [int(x) for x in args.seeds.split(",") if x]
    except ValueError:
        p.error("--seeds: comma-separated integers")
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    state_dir = (args.state_dir or ROOT / ".reef-demo" / f"discover-{stamp}").resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    if state_dir.parent.name == ".reef-demo" and not (state_dir.parent / ".gitignore").exists():
        (state_dir.parent / ".gitignore").write_text("*\n")
    cfg = config(args)
    try:
        boundary = boundary_for(cfg.limits)  # before the server starts: no boundary, no run
    except SandboxUnavailable as e:
        print(f"python -m demo.discover: {e.message}", file=sys.stderr)
        return 2
    started = time.monotonic()

    def say(message: str) -> None:
        if not args.json:
            print(f"[{time.monotonic() - started:6.1f}s] {message}", flush=True)

    engine: dict[str, Any] = {"embedded": {"threads": os.cpu_count() or 1}}
    if args.engine == "vllm":
        engine = {"kind": "vllm"}
    params = {"learning_rate": args.lr, "lora_r": args.lora_r, "lora_alpha": 2 * args.lora_r}
    server = Server(
        state_dir / "reef",
        args.model,
        server_config(cfg, params, engine),
    )
    artifacts = open_artifacts(
        args.archive_store or state_dir / "reef" / "artifacts", endpoint_url=args.s3_endpoint_url
    )
    try:
        server.start(timeout_s=600)
        say(f"reef serve on {server.url} (state {state_dir}, log {server.log_path})")
        say(f"action {cfg.action}; programs run behind: {boundary}")
        runs, baseline = run_arms(server, arms, seeds, args, cfg, state_dir, artifacts, say)
    finally:
        server.stop()
    summary = summary_of(runs, baseline, cfg, seeds, args, params)
    summary["seconds"] = round(time.monotonic() - started, 1)
    report(summary, runs, state_dir, cfg, args, say)
    return 0


def summary_of(
    runs: Runs,
    baseline: float,
    cfg: Config,
    seeds: list[int],
    args: argparse.Namespace,
    params: dict[str, Any],
) -> dict[str, Any]:
    """What summary.json keeps of a finished comparison."""
    arms = summarise(runs, baseline)
    return {
        "n": cfg.n,
        "action": cfg.action,
        "constrained": cfg.constrained,
        "start": cfg.start,
        "grid": f"{cfg.groups}x{cfg.rollouts}",
        "steps": cfg.steps,
        "seeds": seeds,
        "rollouts_per_arm": cfg.steps * cfg.groups * cfg.rollouts,
        "baseline": baseline,
        "best": {arm: arms[arm]["best_median"] for arm in runs},
        "arms": arms,
        "model": args.model,
        "params": params,
        "temperature": cfg.temperature,
        "runs": {arm: [[asdict(r) for r in rs] for rs in results] for arm, results in runs.items()},
    }


def report(
    summary: dict[str, Any],
    runs: Runs,
    state_dir: Path,
    cfg: Config,
    args: argparse.Namespace,
    say: Callable[[str], None],
) -> None:
    """summary.json and the plot in the run's directory (the plot in docs/ with --docs), then
    the table or, with --json, the summary line."""
    baseline = summary["baseline"]
    (state_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    png = plot(
        runs,
        baseline,
        state_dir / "discover.png",
        f"TTT-Discover, {cfg.n} circles, {args.model}, action {cfg.action}"
        f"{' (constrained)' if cfg.constrained else ''}, {cfg.start} start, "
        f"{cfg.groups}x{cfg.rollouts} x {cfg.steps} steps, seeds {args.seeds}",
    )
    if args.docs:
        shutil.copyfile(png, ROOT / "docs" / "discover.png")
    if args.json:
        print(json.dumps({"summary": {k: v for k, v in summary.items() if k != "runs"}}))
    else:
        print("\n" + table(runs, baseline), flush=True)
        say(f"best Σr per arm (median over seeds): {summary['best']}; plot {png}")


def config(args: argparse.Namespace) -> Config:
    """The run's configuration from the command line (and the weak-sandbox opt-in of -c)."""
    settings = load(args.config)
    return Config(
        n=args.n,
        action=args.action or settings.action,
        constrained=settings.constrained if args.constrained is None else args.constrained,
        start=args.start or settings.start,
        groups=args.groups,
        rollouts=args.rollouts,
        steps=args.steps,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        limits=Limits(
            wall_s=args.timeout,
            allow_weak_sandbox=args.allow_weak_sandbox or settings.allow_weak_sandbox,
        ),
        judges=min(2, os.cpu_count() or 1),
    )


def run_arms(
    server: Server,
    arms: list[str],
    seeds: list[int],
    args: argparse.Namespace,
    cfg: Config,
    state_dir: Path,
    artifacts: ArtifactStore,
    say: Callable[[str], None],
) -> tuple[Runs, float]:
    """For each seed, each arm in its own scenario (`discover-<arm>-s<seed>`), one after the
    other: each run's step results, and the seeded baseline's score (0.0 when none ran)."""
    runs: Runs = {arm: [] for arm in arms}
    baseline = 0.0

    def check() -> None:
        if "evolve failed" in server.log():
            raise RuntimeError(f"the evolve worker failed:\n{server.log()[-6000:]}")

    for seed in seeds:
        for arm in arms:
            reef = Reef(server.url, f"discover-{arm}-s{seed}", args.model)
            run_dir = state_dir / f"{arm}-s{seed}"
            run_cfg = replace(cfg, mode=arm, seed=seed)  # type: ignore[arg-type]

            def step_line(
                message: str, arm: str = arm, seed: int = seed, d: Path = run_dir
            ) -> None:
                say(f"[seed {seed}] {message}")
                if args.json and " step " in message:
                    last = json.loads((d / "steps.jsonl").read_text().splitlines()[-1])
                    print(json.dumps({"arm": arm, "seed": seed, **last}), flush=True)

            store = ArchiveStore(artifacts, reef.scenario)
            try:
                runs[arm].append(discover(reef, run_cfg, run_dir, step_line, check, store))
            finally:
                reef.close()
            baseline = json.loads((run_dir / "archive.json").read_text())["states"][0]["reward"]
    return runs, baseline


if __name__ == "__main__":
    sys.exit(main())
