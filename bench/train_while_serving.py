"""What a second training thread costs the answers served meanwhile, and what it buys the round.

`reef.train_threads` sets the torch threads of the evolve worker's training and evaluation (1
by default, leaving the other cores to the serving engine); the worker runs at
`reef.worker_priority` (SCHED_IDLE by default: it runs only on cycles nothing else wants). This
script measures, in one run, both sides of choosing 2 threads on a 2-core machine:

- the engine's speed: `reef serve --model smollm2` (no worker: `reef.auto: false`), greedy
  streamed answers of `--max-tokens` tokens, `--concurrency` in flight, each client pausing
  `--gap` seconds between its answers, for `--window` seconds, completion tokens/s;
- the training's speed: a separate process at the worker's priority takes LoRA steps of the
  sft recipe's shape (r 16 on every linear layer, AdamW, a batch of 4 x `--tokens` tokens of
  SmolLM2) for the same window, seconds a step.

Arms, alternated over `--repeat` rounds: `serve` (no training), `serve+train1`,
`serve+train2`, `serve+trainauto` (training beside the stream on 1 or 2 threads, or
`auto`: the cores the rest of the machine left idle during the last step, reef.cores),
`train1`, `train2`, `trainauto` (training alone). The verdict compares each serving arm's tokens/s with `serve`'s of the same round and
each training arm's seconds a step with `train1`'s.

    .venv/bin/python bench/train_while_serving.py --repeat 2 --window 40 [--gap 0]

The machine these numbers come from has two cores: run it with nothing else running.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
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
RESULTS = Path(__file__).resolve().parent / "results"
from after_start import PROMPTS  # noqa: E402  (bench/ is the script's folder)

ARMS = (
    "serve",
    "serve+train1",
    "serve+train2",
    "serve+trainauto",
    "train1",
    "train2",
    "trainauto",
)


def trainer(priority: str, tokens: int) -> int:
    """The training side, as a child process: lower its priority as the evolve worker does,
    load SmolLM2 with LoRA, then for each line `THREADS SECONDS` on stdin take steps on that
    many threads for that long and answer a JSON line."""
    from reef.cli.worker import yield_cores

    yield_cores(priority)
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from reef.models import resolve_model
    from reef.settings import EngineSettings

    path = resolve_model("smollm2", EngineSettings().model_cache)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    model = get_peft_model(base, lora)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(
        0, model.config.vocab_size, (4, tokens), generator=torch.Generator().manual_seed(0)
    )

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()

    from reef import cores

    torch.set_num_threads(1)
    step()  # warm-up: allocations, kernels
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        setting, seconds = line.split()
        cores.use(setting)  # as the evolve flow does with reef.train_threads
        times: list[float] = []
        threads: list[int] = []
        started = time.monotonic()
        while time.monotonic() - started < float(seconds):
            threads.append(cores.adapt())  # as each training step does
            t = time.perf_counter()
            step()
            times.append(time.perf_counter() - t)
        print(json.dumps({"setting": setting, "steps": times, "threads": threads}), flush=True)
    return 0


class Trainer:
    def __init__(self, priority: str, tokens: int) -> None:
        cmd = [sys.executable, __file__, "--trainer", priority, "--tokens", str(tokens)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert json.loads(self._line()).get("ready")

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit("the trainer process ended")
        return line

    def start(self, threads: str, seconds: float) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{threads} {seconds}\n")
        self.proc.stdin.flush()

    def result(self) -> dict[str, list]:
        return json.loads(self._line())

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


async def stream(url: str, model: str, args: argparse.Namespace) -> dict[str, Any]:
    """Streamed greedy answers, `concurrency` clients each pausing `gap` s between answers."""
    started = time.monotonic()
    tokens: list[int] = []
    latencies: list[float] = []

    async def client(k: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=300) as http:
            i = k
            while time.monotonic() - started < args.window:
                body = {
                    "model": model,
                    "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                    "temperature": 0,
                    "max_tokens": args.max_tokens,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                t = time.monotonic()
                async with http.stream("POST", "/v1/chat/completions", json=body) as r:
                    r.raise_for_status()
                    async for line in r.aiter_lines():
                        if line.startswith("data: {") and '"usage"' in line:
                            usage = json.loads(line[6:]).get("usage")
                            if usage:  # the last chunk's; the others carry null
                                tokens.append(usage["completion_tokens"])
                latencies.append(time.monotonic() - t)
                i += args.concurrency
                await asyncio.sleep(args.gap)

    await asyncio.gather(*(client(k) for k in range(args.concurrency)))
    busy = sum(latencies)
    return {
        "answers": len(tokens),
        "tokens": sum(tokens),
        # tokens over the time answers were in flight: the clients' pauses are not the engine's
        "tok_s": round(sum(tokens) / busy * args.concurrency, 2) if busy else 0.0,
        "answer_s_p50": round(statistics.median(latencies), 3) if latencies else None,
    }


def run_arm(arm: str, url: str, model: str, train: Trainer, args: argparse.Namespace) -> dict:
    setting = arm.partition("train")[2]  # 1, 2, auto: reef.train_threads
    if setting:
        train.start(setting, args.window)
    served = asyncio.run(stream(url, model, args)) if arm.startswith("serve") else None
    if not served and setting:
        time.sleep(args.window)
    trained = train.result() if setting else {"steps": [], "threads": []}
    steps = trained["steps"]
    return {
        "arm": arm,
        "served": served,
        "steps": len(steps),
        "s_per_step": round(statistics.median(steps), 3) if steps else None,
        "threads": trained["threads"],
    }


def measure(arms: list[str], args: argparse.Namespace) -> list[dict]:
    """One `reef serve` and one trainer process; each arm per round, alternated."""
    from reef.testing.process import ReefProcess

    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="reef-train-serve-") as tmp:
        server = ReefProcess(Path(tmp), "--model", "smollm2", env={"REEF_REEF__AUTO": "false"})
        server.start(timeout_s=300)
        train = Trainer(args.priority, args.tokens)
        try:
            model = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"][0]["id"]
            asyncio.run(
                stream(server.url, model, argparse.Namespace(**{**vars(args), "window": 5}))
            )
            for round_ in range(args.repeat):
                for arm in arms if round_ % 2 == 0 else arms[::-1]:
                    run = {"round": round_, **run_arm(arm, server.url, model, train, args)}
                    run["load"] = round(os.getloadavg()[0], 2)
                    runs.append(run)
                    print(json.dumps(run), flush=True)
        finally:
            train.close()
            server.stop(timeout_s=60)
    return runs


def table(arms: list[str], runs: list[dict], args: argparse.Namespace) -> dict[str, dict]:
    """Print each arm's rounds and its ratios to the same round's baseline; the ratios."""

    def ratio(arm: str, base: str, value) -> list[float]:
        out = []
        for r in range(args.repeat):
            a = next((x for x in runs if x["round"] == r and x["arm"] == arm), None)
            b = next((x for x in runs if x["round"] == r and x["arm"] == base), None)
            if a and b and value(a) and value(b):
                out.append(round(value(a) / value(b), 3))
        return out

    def tok_s(x: dict) -> float:
        return x["served"]["tok_s"] if x["served"] else 0.0

    from reef.testing.process import cpu_model

    print()
    print(f"gap {args.gap:g} s, {args.concurrency} stream(s), priority {args.priority}, "
          f"{os.cpu_count()} cores, {cpu_model()}")  # fmt: skip
    print("| arm | serving tok/s (rounds) | ÷ serve alone | s a train step (rounds) | ÷ train1 |")
    print("|---|---|---|---|---|")
    summary = {}
    for arm in arms:
        mine = [x for x in runs if x["arm"] == arm]
        served = " / ".join(f"{tok_s(x):g}" for x in mine) if arm.startswith("serve") else "–"
        steps = " / ".join(f"{x['s_per_step']}" for x in mine) if "train" in arm else "–"
        vs_serve = ratio(arm, "serve", tok_s) if arm.startswith("serve+") else []
        vs_train = ratio(arm, "train1", lambda x: x["s_per_step"]) if "train" in arm else []
        summary[arm] = {"vs_serve": vs_serve, "vs_train1": vs_train}
        print(f"| {arm} | {served} | {' / '.join(f'{v:.2f}x' for v in vs_serve) or '–'} | "
              f"{steps} | {' / '.join(f'{v:.2f}x' for v in vs_train) or '–'} |")  # fmt: skip
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=2, help="rounds of the arms, alternated")
    p.add_argument("--window", type=float, default=40.0, help="seconds of each arm")
    p.add_argument("--concurrency", type=int, default=1, help="streams in flight")
    p.add_argument("--gap", type=float, default=0.0, help="seconds each client waits between")
    p.add_argument("--max-tokens", type=int, default=64, help="max_tokens of every request")
    p.add_argument("--tokens", type=int, default=128, help="sequence length of a train batch")
    p.add_argument("--priority", default="idle", help="reef.worker_priority of the trainer")
    p.add_argument("--arms", default=",".join(ARMS), help=f"a subset of {','.join(ARMS)}")
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON result")
    p.add_argument("--trainer", help=argparse.SUPPRESS)  # the child process's entry
    args = p.parse_args(argv)
    if args.trainer:
        return trainer(args.trainer, args.tokens)

    from reef.testing.process import cpu_model

    arms = args.arms.split(",")
    runs = measure(arms, args)
    summary = table(arms, runs, args)
    result = {
        "bench": "train_while_serving",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "cpu": cpu_model(),
        "args": {k: str(v) for k, v in vars(args).items()},
        "runs": runs,
        "summary": summary,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"train_while_serving_{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
