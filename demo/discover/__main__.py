"""`python -m demo.discover`: TTT-Discover on circle packing through Reef's live inference.

    .venv/bin/python -m demo.discover [--n 5] [--groups 2] [--rollouts 4] [--steps 2]
        [--arms ttt,search,random] [--model smollm2] [--archive-store DIR|s3://bucket/prefix]
        [--state-dir DIR] [-c FILE] [--allow-weak-sandbox] [--docs] [--json]

Starts `reef serve` (its evolve worker on, recipe `tttd`, batch = one G×R grid) and runs each
arm in its own scenario at the same rollout budget (steps × G × R): "ttt" reports every
verified score and waits for each step's LoRA release; "search" runs the same PUCT on the
frozen model; "random" samples every rollout from the seeded baseline. Prints one table row
per step and arm, writes discover.png (best archive score, mean rollout reward, KL to base)
and summary.json in the state dir; with --json, one JSON line per step as it finishes. Each
arm's archive, best program and step log are saved after every step in its directory and in
the artifact store (`discover/<scenario>/`): run again with the same --state-dir, or on
another machine with the same --archive-store, and it resumes from the last step done.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from datetime import datetime
from pathlib import Path
from typing import Any

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
            "embedded": {"max_batch_size": cfg.groups * cfg.rollouts, **engine.get("embedded", {})},
        },
        "reef": {
            "recipe": "tttd",
            "batch_size": cfg.groups * cfg.rollouts,  # the barrier: one full grid
            "max_staleness": 0,  # only rollouts of the served release train (§0.2)
            "params": {
                "groups_per_step": cfg.groups,
                "rollouts_per_group": cfg.rollouts,
                **params,
            },
        },
    }


def plot(runs: dict[str, list[StepResult]], baseline: float, path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for arm, results in runs.items():
        steps = [r.step + 1 for r in results]
        axes[0].plot([0, *steps], [baseline, *[r.best for r in results]], marker="o", label=arm)
        axes[1].plot(steps, [r.mean_reward for r in results], marker="o", label=arm)
    ttt = runs.get("ttt", [])
    kl = [(r.step + 1, r.kl_to_base) for r in ttt if r.kl_to_base is not None]
    if kl:
        axes[2].plot([s for s, _ in kl], [k for _, k in kl], marker="o", color="C0", label="ttt")
    axes[0].axhline(baseline, color="grey", ls=":", label="seeded baseline")
    axes[0].set(title="best verified Σr in the archive", xlabel="step")
    axes[1].set(title="mean rollout reward (invalid = 0)", xlabel="step")
    axes[2].set(title="KL of the sampled policy to the base", xlabel="step")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def table(runs: dict[str, list[StepResult]], baseline: float) -> str:
    lines = [
        f"baseline Σr = {baseline:.6f}",
        "| arm | step | best Σr | mean reward | valid | seconds | KL to base |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for arm, results in runs.items():
        for r in results:
            kl = "–" if r.kl_to_base is None else f"{r.kl_to_base:.4g}"
            lines.append(
                f"| {arm} | {r.step} | {r.best:.6f} | {r.mean_reward:.4f} | "
                f"{r.valid_fraction:.0%} | {r.seconds:.1f} | {kl} |"
            )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m demo.discover", description=__doc__)
    p.add_argument("--n", type=int, default=5, help="circles (default 5)")
    p.add_argument("--groups", type=int, default=2, help="G: groups per step")
    p.add_argument("--rollouts", type=int, default=4, help="R: rollouts per group (>= 3)")
    p.add_argument("--steps", type=int, default=2)
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
        env={"OMP_NUM_THREADS": "1"},  # the evolve worker trains on one thread
    )
    artifacts = open_artifacts(
        args.archive_store or state_dir / "reef" / "artifacts", endpoint_url=args.s3_endpoint_url
    )
    try:
        server.start(timeout_s=600)
        say(f"reef serve on {server.url} (state {state_dir}, log {server.log_path})")
        say(f"programs run behind: {boundary}")
        runs, baseline = run_arms(server, arms, args, cfg, state_dir, artifacts, say)
    finally:
        server.stop()
    summary = {
        "n": cfg.n,
        "grid": f"{cfg.groups}x{cfg.rollouts}",
        "steps": cfg.steps,
        "rollouts_per_arm": cfg.steps * cfg.groups * cfg.rollouts,
        "baseline": baseline,
        "best": {arm: rs[-1].best for arm, rs in runs.items() if rs},
        "seconds": round(time.monotonic() - started, 1),
        "model": args.model,
        "params": params,
        "temperature": cfg.temperature,
        "runs": {arm: [asdict(r) for r in rs] for arm, rs in runs.items()},
    }
    (state_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    png = plot(
        runs,
        baseline,
        state_dir / "discover.png",
        f"TTT-Discover, {cfg.n} circles, {args.model}, {cfg.groups}x{cfg.rollouts} per step",
    )
    if args.docs:
        shutil.copyfile(png, ROOT / "docs" / "discover.png")
    if args.json:
        print(json.dumps({"summary": {k: v for k, v in summary.items() if k != "runs"}}))
    else:
        print("\n" + table(runs, baseline), flush=True)
        say(f"best Σr per arm: {summary['best']}; plot {png}")
    return 0


def config(args: argparse.Namespace) -> Config:
    """The run's configuration from the command line (and the weak-sandbox opt-in of -c)."""
    return Config(
        n=args.n,
        groups=args.groups,
        rollouts=args.rollouts,
        steps=args.steps,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        limits=Limits(
            wall_s=args.timeout,
            allow_weak_sandbox=args.allow_weak_sandbox or load(args.config).allow_weak_sandbox,
        ),
        judges=min(2, os.cpu_count() or 1),
    )


def run_arms(
    server: Server,
    arms: list[str],
    args: argparse.Namespace,
    cfg: Config,
    state_dir: Path,
    artifacts: ArtifactStore,
    say: Callable[[str], None],
) -> tuple[dict[str, list[StepResult]], float]:
    """Each arm in its own scenario, one after the other: its steps' results, and the seeded
    baseline's score (0.0 when no arm ran)."""
    runs: dict[str, list[StepResult]] = {}
    baseline = 0.0

    def check() -> None:
        if "evolve failed" in server.log():
            raise RuntimeError(f"the evolve worker failed:\n{server.log()[-6000:]}")

    for arm in arms:
        reef = Reef(server.url, f"discover-{arm}", args.model)
        arm_dir = state_dir / arm
        arm_cfg = replace(cfg, mode=arm)

        def step_line(message: str, arm: str = arm, arm_dir: Path = arm_dir) -> None:
            say(message)
            if args.json and " step " in message:
                last = json.loads((arm_dir / "steps.jsonl").read_text().splitlines()[-1])
                print(json.dumps({"arm": arm, **last}), flush=True)

        store = ArchiveStore(artifacts, reef.scenario)
        try:
            runs[arm] = discover(reef, arm_cfg, arm_dir, step_line, check, store)
        finally:
            reef.close()
        baseline = json.loads((arm_dir / "archive.json").read_text())["states"][0]["reward"]
    return runs, baseline


if __name__ == "__main__":
    sys.exit(main())
