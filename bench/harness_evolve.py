"""What a harness change buys, and what its evaluation costs, on SmolLM2 through a real
`reef serve` with its worker.

A simulated user asks capital-city questions and wants only the city's name: every answer is
reported with score 0 and the correction (the city). Then:

1. **An instruction** (`POST /reef/train`, "answer with only the name of the city") becomes a
   candidate; the job's paired evaluation (candidate vs head on the reported questions, N
   repeats, word F1 against the correction) gives the held-out score of each side. The ratio
   candidate / head is the number to read.
2. **A second instruction** against the same head: its head episodes come from the cache. The
   ratio of evaluation seconds (second / first) shows what the cache saves.
3. **The harness recipe** (GEPA, the served SmolLM2 as the proposer) on the same feedback:
   `reef evolve --force`, with the gate's numbers for whatever it proposed.

Writes JSON to bench/results/ and prints a summary.

    .venv/bin/python bench/harness_evolve.py [--model smollm2] [--questions 12]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from demo.server import Server  # noqa: E402
from reef.testing.process import REEF  # noqa: E402
from reef.testing.traffic import traffic  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
S = "bench-harness"
CAPITALS = [
    ("France", "Paris"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Germany", "Berlin"),
    ("Japan", "Tokyo"), ("Egypt", "Cairo"), ("Canada", "Ottawa"), ("Peru", "Lima"),
    ("Greece", "Athens"), ("Norway", "Oslo"), ("Kenya", "Nairobi"), ("Cuba", "Havana"),
    ("Chile", "Santiago"), ("Poland", "Warsaw"), ("Austria", "Vienna"), ("Ireland", "Dublin"),
]  # fmt: skip
ASK = "Answer with only the name of the city, nothing else."


def _job(srv: Server, text: str) -> dict[str, Any]:
    r = httpx.post(
        f"{srv.url}/reef/train", json={"text": text}, headers={"x-reef-scenario": S}, timeout=30
    )
    r.raise_for_status()
    job = r.json()
    started = time.monotonic()
    while job["status"] in ("queued", "running"):
        time.sleep(1.0)
        job = httpx.get(job["url"], timeout=30).json()
    job["wall_s"] = round(time.monotonic() - started, 1)
    if job["status"] != "done":
        raise RuntimeError(f"job failed: {job}\n{srv.log()[-4000:]}")
    return dict(job)


def _wrong_answers_reported(srv: Server, args: argparse.Namespace) -> None:
    """The simulated user's questions, each answer reported with score 0 and the city."""
    traffic(
        srv,
        S,
        args.questions,
        prompt=lambda i: f"What is the capital of {CAPITALS[i][0]}?",
        report=lambda i, rid: {
            "score": 0.0,
            "feedback": {"text": "Only the city, please.", "correction": CAPITALS[i][1]},
        },
        model=args.model,
        max_tokens=16,
        temperature=0,
    )


def _instructions(srv: Server, out: dict[str, Any]) -> None:
    """Two instructions against the same head (the second's head episodes cached): each one's
    gate numbers and evaluation, and the ratio of their evaluation seconds."""
    first = _job(srv, ASK)
    second = _job(srv, "Do not write a full sentence: name the city.")
    for name, job in (("instruct", first), ("instruct_again", second)):
        gate = job["result"]["gate"]
        out[name] = {
            "wall_s": job["wall_s"],
            "mean_head": gate["mean_head"],
            "mean_candidate": gate["mean_candidate"],
            "ratio": (gate["mean_candidate"] / gate["mean_head"]) if gate["mean_head"] else None,
            "gate_advice": gate["reason"],
            **job["result"]["evaluation"],
        }
    out["eval_seconds_ratio_cached_head"] = round(
        second["result"]["evaluation"]["eval_seconds"]
        / first["result"]["evaluation"]["eval_seconds"],
        3,
    )


def _recipe_run(srv: Server, args: argparse.Namespace) -> dict[str, Any]:
    """`reef evolve --force` with the harness recipe on the same feedback: its time, exit code
    and output tail, and the gate's numbers of the candidate it made, if any."""
    started = time.monotonic()
    cmd = [REEF, "evolve", "--scenario", S, "--force", "-c", str(srv.config_path)]
    cmd += ["--model", args.model, "--state-dir", str(srv.state_dir)]
    cmd += ["--port", str(srv.port)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    recipe: dict[str, Any] = {
        "wall_s": round(time.monotonic() - started, 1),
        "rc": done.returncode,
        "result": done.stdout[-3000:],
    }
    cands = httpx.get(f"{srv.url}/reef/scenarios/{S}/candidates").json()["data"]
    recipe_cands = [c for c in cands if c["recipe"] == "harness"]
    if recipe_cands:
        c = recipe_cands[0]
        recipe["gate"] = c["gate"]
        recipe["metrics"] = c["metrics"]
    return recipe


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--questions", type=int, default=12)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    params = {
        "repeats": args.repeats,
        "max_tokens": 16,
        "max_examples": args.questions,
        "temperature": 0.7,
        "proposer_max_tokens": 160,
        "max_metric_calls": 2 * args.questions + 8,
    }
    config = {
        "reef": {"recipe": "harness", "batch_size": 1000, "params": params},
        "gate": {"policy": "improve", "holdout": 0.5},
    }
    out: dict[str, Any] = {
        "model": args.model,
        "params": params,
        "at": datetime.now(UTC).isoformat(),
    }
    with tempfile.TemporaryDirectory(prefix="reef-bench-harness-") as tmp:
        srv = Server(Path(tmp) / "state", args.model, config).start()
        try:
            srv.wait_for_log("evolve worker ready", 300)
            _wrong_answers_reported(srv, args)
            _instructions(srv, out)
            out["recipe"] = _recipe_run(srv, args)
        finally:
            srv.stop()
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"harness-evolve-{out['at'][:19].replace(':', '')}.json"
    path.write_text(json.dumps(out, indent=2, default=str))
    print(json.dumps(out, indent=2, default=str))
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
