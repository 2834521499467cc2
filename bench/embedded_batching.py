"""What continuous batching buys in the embedded engine: concurrency 4 and 8 against one at a time.

One run, in this process: for each model, start an EmbeddedEngine, warm it up, then serve the
same N greedy requests (temperature 0, fixed prompts, max_tokens capped) sequentially and with
4 and 8 in flight. Reports completion tokens/s, requests/s, p50 time to first token and total
latency (engine timings, from submission), the engine's largest batch, and tokens/s as a ratio
of the sequential run. Checks that batching does not change greedy answers: the completion
token ids at the highest concurrency must equal the sequential ones, prompt for prompt (a
mismatch is reported, not fatal). Writes JSON to bench/results/.

    .venv/bin/python bench/embedded_batching.py [--models tiny,smollm2]
    .venv/bin/python bench/embedded_batching.py --models smollm2 --n-smollm2 32 --max-tokens 64

The machine these numbers come from has two shared cores: absolute numbers are a floor and
the load average is printed with each run; the ratio to concurrency 1 is what to watch.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from reef.engines.embedded import EmbeddedEngine
from reef.models import resolve_model

RESULTS = Path(__file__).resolve().parent / "results"
CACHE = Path("~/.cache/reef/models")

# Different lengths on purpose: batched rows are padded, and answers must not depend on it.
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "List three prime numbers greater than ten.",
    "Hello! How are you today?",
    "Give me a short Python function that adds two numbers, and explain it briefly.",
    "What is 7 times 6?",
    "Summarize the plot of a story about a fox who learns to fly, in one paragraph.",
]


def body(i: int, max_tokens: int) -> dict[str, Any]:
    prompt = PROMPTS[i % len(PROMPTS)]
    return {
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": max_tokens,
    }


async def one_pass(
    engine: EmbeddedEngine, n: int, concurrency: int, max_tokens: int
) -> dict[str, Any]:
    """Serve n requests with at most `concurrency` in flight; concurrency 1 awaits one by one."""
    engine.stats.max_batch = 0  # the engine is idle between passes, so this is safe
    steps, generated = engine.stats.steps, engine.stats.tokens_generated
    sem = asyncio.Semaphore(concurrency)

    async def run(i: int) -> Any:
        async with sem:
            return await engine.complete(body(i, max_tokens))

    started = time.monotonic()
    if concurrency == 1:
        done = [await run(i) for i in range(n)]
    else:
        done = await asyncio.gather(*(run(i) for i in range(n)))
    wall = time.monotonic() - started
    tokens = sum(len(c.completion_token_ids or []) for c in done)
    return {
        "concurrency": concurrency,
        "requests": n,
        "wall_s": round(wall, 3),
        "completion_tokens": tokens,
        "tokens_per_s": round(tokens / wall, 2),
        "requests_per_s": round(n / wall, 3),
        "p50_ttft_ms": round(statistics.median(c.timings["ttft_ms"] for c in done), 1),
        "p50_total_ms": round(statistics.median(c.timings["total_ms"] for c in done), 1),
        "max_batch": engine.stats.max_batch,
        "decode_steps": engine.stats.steps - steps,
        "engine_tokens": engine.stats.tokens_generated - generated,
        "finish_reasons": sorted({c.response["choices"][0]["finish_reason"] for c in done}),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "_ids": [c.completion_token_ids for c in done],
    }


async def bench_model(spec: str, n: int, levels: list[int], max_tokens: int) -> dict[str, Any]:
    model_dir = resolve_model(spec, CACHE)
    engine = EmbeddedEngine(model_dir, spec, max_batch_size=max(levels))
    print(f"[{spec}] loading {model_dir}", flush=True)
    t0 = time.monotonic()
    await engine.start()
    print(
        f"[{spec}] loaded in {time.monotonic() - t0:.1f} s, torch threads {torch.get_num_threads()}",
        flush=True,
    )
    try:
        print(f"[{spec}] warm-up", flush=True)
        await one_pass(engine, max(levels), max(levels), max_tokens)
        await one_pass(engine, 2, 1, max_tokens)
        runs = []
        for c in levels:
            print(f"[{spec}] {n} requests at concurrency {c}", flush=True)
            runs.append(await one_pass(engine, n, c, max_tokens))
            r = runs[-1]
            print(f"[{spec}]   {r['wall_s']:.1f} s, {r['tokens_per_s']:.1f} tok/s", flush=True)
    finally:
        await engine.aclose()
    base = runs[0]
    for r in runs:
        r["tokens_per_s_ratio"] = round(r["tokens_per_s"] / base["tokens_per_s"], 2)
    top = runs[-1]
    differ = [i for i, (a, b) in enumerate(zip(base["_ids"], top["_ids"], strict=True)) if a != b]
    for r in runs:
        del r["_ids"]
    return {
        "model": spec,
        "max_tokens": max_tokens,
        "runs": runs,
        "greedy_check": {
            "concurrency": [base["concurrency"], top["concurrency"]],
            "compared": n,
            "differ": len(differ),
            "differing_prompts": sorted({i % len(PROMPTS) for i in differ}),
        },
    }


def report(result: dict[str, Any], out: Path) -> None:
    print()
    print(
        f"{'model':8} {'conc':>4} {'reqs':>4} {'tokens':>6} {'tok/s':>8} {'req/s':>7} "
        f"{'p50 ttft ms':>11} {'p50 total ms':>12} {'max batch':>9} {'x tok/s':>7} {'load':>5}"
    )
    for m in result["models"]:
        for r in m["runs"]:
            print(
                f"{m['model']:8} {r['concurrency']:>4} {r['requests']:>4} "
                f"{r['completion_tokens']:>6} {r['tokens_per_s']:>8.1f} {r['requests_per_s']:>7.2f} "
                f"{r['p50_ttft_ms']:>11.1f} {r['p50_total_ms']:>12.1f} {r['max_batch']:>9} "
                f"{r['tokens_per_s_ratio']:>7.2f} {r['loadavg_1m']:>5.1f}"
            )
    print()
    for m in result["models"]:
        g = m["greedy_check"]
        a, b = g["concurrency"]
        verdict = "identical" if g["differ"] == 0 else f"{g['differ']} of {g['compared']} DIFFER"
        extra = f" (prompts {g['differing_prompts']})" if g["differ"] else ""
        print(f"{m['model']}: greedy outputs at concurrency {b} vs {a}: {verdict}{extra}")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"embedded_batching-{result['at'].replace(':', '')}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {path}")


async def amain(args: argparse.Namespace) -> int:
    levels = sorted({1, *(int(c) for c in args.concurrency.split(","))})
    result: dict[str, Any] = {
        "bench": "embedded_batching",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
        },
        "models": [],
    }
    for spec in args.models.split(","):
        n = args.n_tiny if spec == "tiny" else args.n_smollm2
        result["models"].append(await bench_model(spec, n, levels, args.max_tokens))
    report(result, args.out)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny,smollm2", help="comma-separated model specs")
    p.add_argument("--n-tiny", type=int, default=64, help="requests per pass for tiny")
    p.add_argument("--n-smollm2", type=int, default=16, help="requests per pass for other models")
    p.add_argument("--concurrency", default="4,8", help="levels besides the baseline 1")
    p.add_argument("--max-tokens", type=int, default=32, help="max_tokens of every request")
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON result")
    return asyncio.run(amain(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
