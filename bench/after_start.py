"""The embedded engine's speed in the first minute after `reef serve` is ready, against its
settled speed, with the evolve worker at each CPU priority (`reef.worker_priority`) and
without it.

`reef serve` starts its evolve worker beside the API when it is ready; the worker's start-up
(~30 s of torch, TRL, MLflow and GX imports, then Prefect's temporary server) runs on the same
cores as the engine. For each arm (`--arms`: values of `reef.worker_priority`, or `none` for
no worker (`reef.auto: false`), alternated over `--repeat` rounds), this script starts `reef serve` on SmolLM2 in a fresh state directory and,
the moment /readyz answers, streams greedy requests (`--concurrency` in flight, `--max-tokens`
each) for `--window` seconds: the first window. Then it waits until the worker has finished
starting (its "evolve worker ready" line, and its CPU use under 5 % of a core for 5 s) and
streams for another window: the settled one. Reports completion tokens/s of both windows, per
10 s of the first, and their ratio: 1.0 means a fresh start serves its first users at full
speed. Tokens are the `usage` of each answer, counted when the answer ends.

    .venv/bin/python bench/after_start.py --arms none,normal,low,idle --repeat 2 --window 60

(`bench/embedded_batching.py --after-start` runs this.) The machine these numbers come from
has two cores: run it with nothing else running; compare ratios within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from reef.testing.process import ReefProcess, cpu_model, cpu_seconds

RESULTS = Path(__file__).resolve().parent / "results"
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "List three prime numbers greater than ten.",
    "Give three tips for learning a new language.",
    "What does a compiler do?",
]
BUCKET_S = 10.0


def worker_pid(server: int) -> int | None:
    """The evolve worker among the server's children (`python -m reef.cli.worker`)."""
    for child in Path(f"/proc/{server}/task/{server}/children").read_text().split():
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"reef.cli.worker" in cmdline:
            return int(child)
    return None


def serve(arm: str, workdir: Path) -> ReefProcess:
    """`reef serve --model smollm2` in a fresh state directory, with the arm's worker."""
    env: dict[str, str | None] = (
        {"REEF_REEF__AUTO": "false"} if arm == "none" else {"REEF_REEF__WORKER_PRIORITY": arm}
    )
    state = Path(tempfile.mkdtemp(prefix=f"{arm}-", dir=workdir))
    return ReefProcess(state, "--model", "smollm2", env=env)


def wait_worker_settled(server: ReefProcess, timeout_s: float = 300.0) -> float:
    """Seconds until the worker said it is ready and then used < 5 % of a core for 5 s."""
    started = time.monotonic()
    server.wait_for_log("evolve worker ready", timeout_s)
    assert server.proc is not None
    while time.monotonic() - started < timeout_s:
        pid = worker_pid(server.proc.pid)
        if pid is None:
            raise SystemExit(f"the worker is gone; see {server.log_path}")
        before = cpu_seconds(pid)
        time.sleep(5)
        if cpu_seconds(pid) - before < 0.25:
            return time.monotonic() - started
    raise SystemExit(f"the worker did not settle in {timeout_s:.0f} s; see {server.log_path}")


async def window(url: str, seconds: float, concurrency: int, max_tokens: int) -> dict[str, Any]:
    """Stream greedy requests, `concurrency` in flight, for `seconds`; tokens per 10 s."""
    model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    started = time.monotonic()
    ended: list[tuple[float, int]] = []

    async def client(k: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=300) as http:
            i = k
            while time.monotonic() - started < seconds:
                body = {
                    "model": model,
                    "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                    "temperature": 0,
                    "max_tokens": max_tokens,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                tokens = 0
                async with http.stream("POST", "/v1/chat/completions", json=body) as r:
                    r.raise_for_status()
                    async for line in r.aiter_lines():
                        if line.startswith("data: {") and '"usage"' in line:
                            usage = json.loads(line[6:]).get("usage") or {}
                            tokens = usage.get("completion_tokens", tokens)
                ended.append((time.monotonic() - started, tokens))
                i += concurrency

    await asyncio.gather(*(client(k) for k in range(concurrency)))
    wall = time.monotonic() - started
    buckets = [0] * int(seconds // BUCKET_S)  # whole buckets of the window; answers that end
    for at, tokens in ended:  # after it (begun inside it) count in tok_s only
        if int(at // BUCKET_S) < len(buckets):
            buckets[int(at // BUCKET_S)] += tokens
    return {
        "seconds": round(wall, 1),
        "answers": len(ended),
        "tokens": sum(t for _, t in ended),
        "tok_s": round(sum(t for _, t in ended) / wall, 2),
        "tok_s_per_10s": [round(b / BUCKET_S, 1) for b in buckets],
    }


def run_arm(arm: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    server = serve(arm, workdir)
    started = time.monotonic()
    server.start(timeout_s=300)
    ready_s = time.monotonic() - started
    try:
        print(f"  {arm}: ready in {ready_s:.1f} s; first window", flush=True)
        first = asyncio.run(window(server.url, args.window, args.concurrency, args.max_tokens))
        settle_s = wait_worker_settled(server) if arm != "none" else 0.0
        print(f"  {arm}: worker settled {settle_s:.0f} s later; settled window", flush=True)
        settled = asyncio.run(window(server.url, args.window, args.concurrency, args.max_tokens))
    finally:
        server.stop(timeout_s=60)
    ratio = first["tok_s"] / settled["tok_s"] if settled["tok_s"] else float("nan")
    return {
        "arm": arm,
        "ready_s": round(ready_s, 1),
        "first": first,
        "settled": settled,
        "first_over_settled": round(ratio, 3),
    }


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--arms",
        default="none,normal,low,idle",
        help="reef.worker_priority values, one arm each; none: no worker (reef.auto off)",
    )
    p.add_argument("--repeat", type=int, default=1, help="rounds of the arms, alternated")
    p.add_argument("--window", type=float, default=60.0, help="seconds of each window")
    p.add_argument("--concurrency", type=int, default=1, help="streams in flight")
    p.add_argument("--max-tokens", type=int, default=64, help="max_tokens of every request")
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON result")
    args = p.parse_args(argv)
    arms = args.arms.split(",")
    runs = []
    with tempfile.TemporaryDirectory(prefix="reef-after-start-") as tmp:
        for round_ in range(args.repeat):
            for arm in arms if round_ % 2 == 0 else arms[::-1]:
                print(f"round {round_ + 1}, {arm} (load {load_average()})", flush=True)
                runs.append({**run_arm(arm, args, Path(tmp)), "load_before": load_average()})
    result = {
        "bench": "after_start",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "cpu": cpu_model(),
        "args": {k: str(v) for k, v in vars(args).items()},
        "runs": runs,
    }
    print()
    print(
        f"| worker | ready s | first {args.window:g} s tok/s | per 10 s | settled tok/s "
        "| first / settled |"
    )
    print("|---|---|---|---|---|---|")
    for run in runs:
        per = " ".join(f"{v:g}" for v in run["first"]["tok_s_per_10s"])
        print(
            f"| {run['arm']} | {run['ready_s']} | {run['first']['tok_s']} | {per} | "
            f"{run['settled']['tok_s']} | {run['first_over_settled']:.2f}x |"
        )
    for arm in arms:
        ratios = [r["first_over_settled"] for r in runs if r["arm"] == arm]
        print(f"{arm}: median first/settled {statistics.median(ratios):.2f}x over {ratios}")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"after_start_{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
