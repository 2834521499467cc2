"""The evolve worker's fixed costs per round, old way against new, alternating in one process so
that both see the same load (bench/evolve_latency.py measures the whole round, but on two shared
cores its run-to-run noise is larger than these savings):

- full garbage collection with the worker's imports (torch, TRL, Great Expectations, MLflow,
  Prefect) in sight of the collector, against after `gc.freeze()` as the worker now does once
  they are imported; accelerate runs one `gc.collect()` at the end of every training;
- evaluate's work (the head = the base and the candidate = base + adapter, each loaded and
  scored on 2 held-out samples by replay), with the base read by `from_pretrained` each time
  against `recipes.training.shared_base` (read once, its tensors shared).

    .venv/bin/python bench/evolve_fixed_costs.py [--model smollm2] [--rounds 5]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def collections(rounds: int) -> dict[str, list[float]]:
    """Seconds per gc.collect() with the worker's imports, before and after gc.freeze()."""
    from reef.flows import evolve  # noqa: F401
    from reef.flows.worker import preload

    preload()  # imports, then freezes them: unfreeze to measure the old way first
    gc.unfreeze()
    out: dict[str, list[float]] = {"old": [], "new": []}
    for _ in range(rounds):
        t = time.monotonic()
        gc.collect()
        out["old"].append(time.monotonic() - t)
    gc.freeze()
    for _ in range(rounds):
        t = time.monotonic()
        gc.collect()
        out["new"].append(time.monotonic() - t)
    return out


def evaluations(base: Path, rounds: int) -> dict[str, list[float]]:
    """Seconds of evaluate's loads and replay scores, from_pretrained against shared_base."""
    import pyarrow as pa
    import torch
    from transformers import AutoModelForCausalLM

    from reef.recipe import TrainJob, WeightsRecipe, load_recipe
    from reef.recipes import evaluate as ev
    from reef.recipes import training

    def question(i: int) -> list[dict[str, Any]]:
        return [{"role": "user", "content": f"Bench question {i}: name a colour."}]

    rows = [
        {
            "sample_id": f"s{i}",
            "messages": json.dumps(question(i)),
            "completion": "Red",
            "score": 1.0,
            "feedback": json.dumps({"correction": "Teal."}),
        }
        for i in range(6)
    ]
    adapter = Path(tempfile.mkdtemp(prefix="reef-bench-fixed-")) / "candidate"
    recipe = load_recipe("sft", {"epochs": 1.0, "batch_size": 4, "max_length": 128})
    assert isinstance(recipe, WeightsRecipe)
    recipe.train(TrainJob("bench", base, pa.Table.from_pylist(rows), adapter))
    held_out = [ev.EvalSample(f"h{i}", question(i), "Teal.", 1.0) for i in (6, 7)]

    def from_disk(path: Path) -> Any:
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)

    def evaluate(loader: Any) -> float:
        ev.shared_base = loader  # what recipes.evaluate.load_model builds the base with
        started = time.monotonic()
        for kind, path in (("base", None), ("adapter", adapter)):
            model, tokenizer = ev.load_model(base, kind, path)
            ev.replay_scores(model, tokenizer, held_out)
            del model
        return time.monotonic() - started

    out: dict[str, list[float]] = {"old": [], "new": []}
    try:
        for _ in range(rounds):
            out["old"].append(evaluate(from_disk))
            out["new"].append(evaluate(training.shared_base))
    finally:
        ev.shared_base = training.shared_base
        shutil.rmtree(adapter.parent, ignore_errors=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="smollm2", help="a model name reef resolves (tiny, smollm2)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch threads (reef.train_threads)")
    args = p.parse_args()
    import torch

    from reef.models import resolve_model
    from reef.settings import load_settings

    torch.set_num_threads(args.threads)
    base = resolve_model(args.model, load_settings(None).engine.model_cache)
    results = {
        "gc.collect": collections(args.rounds),
        "evaluate (2 models, 2 samples)": evaluations(base, args.rounds),
    }
    print(f"{args.model}, {args.rounds} rounds, load average {os.getloadavg()[0]:.1f}")
    print("| cost | old p50 s | new p50 s | new ÷ old |\n|---|---:|---:|---:|")
    for name, r in results.items():
        old, new = statistics.median(r["old"]), statistics.median(r["new"])
        print(f"| {name} | {old:.3f} | {new:.3f} | {new / old:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
