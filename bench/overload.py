"""Overload degrades, never collapses: goodput past capacity with the engine's line bounded or not.

One run starts bench/echo_upstream.py as a server of fixed capacity (`--capacity` completions
at once, `--service-s` each: a saturated GPU server's behaviour, its own line unbounded), and
two `reef serve --engine upstream` in front of it:

- bound on: engine.max_running = the upstream's capacity, engine.max_queue (`--max-queue`),
  engine.max_queue_wait_s (`--max-wait-s`): calls beyond are answered 429 at once;
- bound off: engine.max_queue null and the default max_running (512): every call goes to the
  upstream and waits in its line, as before Reef bounded it.

Then, for each concurrency level (`--levels`), each arm in turn (on, off) for `--seconds`:
that many client connections, each sending a small chat completion, waiting for its answer at
most `--timeout-s` (a client's patience: a later answer is lost to it, the connection is
dropped and the next call sent), and after a 429 pausing for its Retry-After (as the OpenAI
SDK does; `--backoff-s` instead) before the next. Between
two measurements the upstream's line drains (Reef's /metrics: nothing running). Reported per
level and arm: offered load (calls sent/s), goodput (200s within the timeout/s), refused/s
(429), timed out/s, p50/p99 latency of the 200s, p50 latency of the 429s (as the client saw
it, and Reef's own mean time on one, from its /metrics). At the end, every 200 must have its record
(records in each arm's database >= its 200s).

    .venv/bin/python bench/overload.py                  # ~3-4 min on 2 cores
    .venv/bin/python bench/overload.py --levels 1,8,64 --seconds 4

Writes docs/overload.json and docs/overload.png (goodput and refused/s, p99 latency, by
connections, both arms). The machine shares its cores between the clients, Reef and the
upstream: absolute numbers are a floor, the on/off ratios are what to read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from echo_upstream import launch as launch_echo

from reef.testing.process import cpu_model, free_port, wait_ready

ROOT = Path(__file__).resolve().parents[1]
BODY = {
    "model": "echo",
    "messages": [{"role": "user", "content": "a short question for a busy server"}],
    "max_tokens": 8,
}


@dataclass
class Level:
    """One arm at one concurrency: what the clients saw."""

    arm: str
    connections: int
    seconds: float
    sent: int = 0
    ok: int = 0
    refused: int = 0
    timed_out: int = 0
    failed: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    refused_ms: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies_ms)
        refused = sorted(self.refused_ms)
        return {
            "arm": self.arm,
            "connections": self.connections,
            "offered_per_s": round(self.sent / self.seconds, 1),
            "goodput_per_s": round(self.ok / self.seconds, 1),
            "refused_per_s": round(self.refused / self.seconds, 1),
            "timed_out_per_s": round(self.timed_out / self.seconds, 1),
            "failed": self.failed,
            "p50_ms": round(_pct(lat, 0.50), 1) if lat else None,
            "p99_ms": round(_pct(lat, 0.99), 1) if lat else None,
            "refused_p50_ms": round(_pct(refused, 0.50), 1) if refused else None,
            "ok": self.ok,
        }


def _pct(sorted_values: list[float], q: float) -> float:
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


def start_reef(
    reef: Path, echo_port: int, state_dir: Path, engine: dict[str, Any]
) -> tuple[subprocess.Popen[Any], str]:
    port = free_port()
    config = state_dir / "serve.yaml"  # JSON is YAML; null says "no bound"
    config.write_text(json.dumps({"engine": engine}))
    cmd = [str(reef), "serve", "-c", str(config), "--engine", "upstream"]
    cmd += ["--upstream-url", f"http://127.0.0.1:{echo_port}/v1", "--upstream-model", "echo"]
    cmd += ["--state-dir", str(state_dir), "--port", str(port)]
    env = {**os.environ, "REEF_REEF__AUTO": "false", "REEF_SERVER__LOG_LEVEL": "warning"}
    log = (state_dir / "reef.log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(f"{url}/readyz", 120.0, lambda: None if proc.poll() is None else "exited")
    except (RuntimeError, TimeoutError) as e:
        proc.kill()
        raise SystemExit(f"reef serve did not start ({e}); see {state_dir / 'reef.log'}") from e
    return proc, url


async def _client(
    client: httpx.AsyncClient, url: str, level: Level, stop_at: float, args: argparse.Namespace
) -> None:
    while time.monotonic() < stop_at:
        level.sent += 1
        t0 = time.perf_counter()
        try:
            # the client's patience is for the whole call (httpx's timeouts are per step)
            async with asyncio.timeout(args.timeout_s):
                r = await client.post(f"{url}/v1/chat/completions", json=BODY)
        except (TimeoutError, httpx.TimeoutException):
            level.timed_out += 1
            continue
        except httpx.HTTPError:
            level.failed += 1
            await asyncio.sleep(args.backoff_s or 0.1)
            continue
        ms = (time.perf_counter() - t0) * 1000.0
        if r.status_code == 200:
            level.ok += 1
            level.latencies_ms.append(ms)
        elif r.status_code == 429:
            level.refused += 1
            level.refused_ms.append(ms)
            retry_after = float(r.headers.get("retry-after") or 1)
            await asyncio.sleep(args.backoff_s if args.backoff_s is not None else retry_after)
        else:
            level.failed += 1
            await asyncio.sleep(args.backoff_s or 0.1)


async def measure(url: str, arm: str, connections: int, args: argparse.Namespace) -> Level:
    level = Level(arm, connections, args.seconds)
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    timeout = httpx.Timeout(args.timeout_s, connect=args.timeout_s)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        t0 = time.monotonic()
        stop_at = t0 + args.seconds
        await asyncio.gather(
            *(_client(client, url, level, stop_at, args) for _ in range(connections))
        )
        # the calls sent last end after stop_at: rates are over the whole time
        level.seconds = time.monotonic() - t0
    return level


def _run(coro: Any) -> Any:
    """uvloop where installed (it ships with uvicorn[standard]): the clients share the cores
    with what they measure, and plain asyncio spends more of them."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def in_engine(url: str) -> float:
    """Calls in the engine or waiting for it, from Reef's /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    total = 0.0
    for name in ("reef_engine_running", "reef_engine_queue_depth"):
        found = re.search(rf"^{name} (\S+)$", text, re.M)
        total += float(found.group(1)) if found else 0.0
    return total


def refusals_served(url: str) -> tuple[float, float, float, float]:
    """(seconds, count) Reef spent on the 429s of the chat route so far (its own histogram),
    and its refusals for a full line and for a wait too long."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    series = [
        'reef_http_request_seconds_sum{method="POST",route="/v1/chat/completions",status="429"}',
        'reef_http_request_seconds_count{method="POST",route="/v1/chat/completions",status="429"}',
        'reef_engine_refused_total{reason="queue_full"}',
        'reef_engine_refused_total{reason="queue_wait"}',
    ]
    out = []
    for name in series:
        found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        out.append(float(found.group(1)) if found else 0.0)
    return out[0], out[1], out[2], out[3]


def drain(url: str, timeout_s: float = 120.0) -> float:
    """Wait until the calls left behind by the last measurement are done; seconds waited."""
    t0 = time.monotonic()
    while in_engine(url) > 0 and time.monotonic() - t0 < timeout_s:
        time.sleep(0.25)
    return time.monotonic() - t0


def records(state_dir: Path) -> int:
    with sqlite3.connect(state_dir / "reef.db") as db:
        return int(db.execute("select count(*) from records").fetchone()[0])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--levels", default="1,2,4,8,16,32,64", help="client connections, in order")
    p.add_argument("--seconds", type=float, default=6.0, help="measured per level and arm")
    p.add_argument("--capacity", type=int, default=2, help="upstream: completions at once")
    p.add_argument("--service-s", type=float, default=0.1, help="upstream: each completion")
    p.add_argument("--max-queue", type=int, default=8, help="bound on: engine.max_queue")
    p.add_argument("--max-wait-s", type=float, default=0.5, help="bound on: max_queue_wait_s")
    p.add_argument("--timeout-s", type=float, default=1.0, help="a client's patience")
    p.add_argument(
        "--backoff-s",
        type=float,
        default=None,
        help="a client's pause after a 429 (default: its Retry-After, as the OpenAI SDK does)",
    )
    p.add_argument("--reef", type=Path, default=Path(sys.executable).parent / "reef")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "overload.json")
    p.add_argument("--png", type=Path, default=ROOT / "docs" / "overload.png")
    return p.parse_args(argv)


def arms(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Each arm's engine settings."""
    return {
        "on": {
            "max_running": args.capacity,
            "max_queue": args.max_queue,
            "max_queue_wait_s": args.max_wait_s,
        },
        "off": {"max_queue": None},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    levels = [int(n) for n in args.levels.split(",")]
    started = time.monotonic()
    echo, echo_port = launch_echo(
        "--capacity", str(args.capacity), "--service-s", str(args.service_s)
    )
    procs: list[subprocess.Popen[Any]] = [echo]
    tmp = Path(tempfile.mkdtemp(prefix="reef-overload-"))
    results: list[dict[str, Any]] = []
    okays: dict[str, int] = {}
    try:
        urls: dict[str, str] = {}
        for arm, env in arms(args).items():
            (tmp / arm).mkdir()
            proc, urls[arm] = start_reef(args.reef, echo_port, tmp / arm, env)
            procs.append(proc)
        for n in levels:
            for arm, url in urls.items():
                before = refusals_served(url)
                level = _run(measure(url, arm, n, args))
                waited = drain(url)
                after = refusals_served(url)
                row = level.summary()
                count = after[1] - before[1]
                row["refused_server_ms"] = (
                    round((after[0] - before[0]) / count * 1000, 2) if count else None
                )
                row["queue_full"] = int(after[2] - before[2])
                row["queue_wait"] = int(after[3] - before[3])
                row["drain_s"] = round(waited, 1)
                results.append(row)
                okays[arm] = okays.get(arm, 0) + level.ok
                print(_line(row), flush=True)
        recorded = {arm: records(tmp / arm) for arm in urls}
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
    lost = {arm: max(0, okays.get(arm, 0) - recorded[arm]) for arm in recorded}
    report = _report(args, results, okays, recorded, lost, time.monotonic() - started)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    plot(results, levels, args)
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"records: {recorded} for 200s {okays}; lost: {lost}")
    print(f"wrote {args.out} and {args.png} in {report['wall_s']:.0f}s")
    return 1 if any(lost.values()) else 0


def _line(row: dict[str, Any]) -> str:
    return (
        f"{row['connections']:>3} conns  {row['arm']:<3}  offered {row['offered_per_s']:>6}/s  "
        f"goodput {row['goodput_per_s']:>5}/s  refused {row['refused_per_s']:>6}/s  "
        f"timed out {row['timed_out_per_s']:>5}/s  p50 {row['p50_ms']} ms  p99 {row['p99_ms']} ms"
        f"  429 p50 {row['refused_p50_ms']} ms (in Reef {row['refused_server_ms']} ms; "
        f"{row['queue_full']} full, {row['queue_wait']} waited)"
        f"  (drained in {row['drain_s']} s)"
    )


def _report(
    args: argparse.Namespace,
    results: list[dict[str, Any]],
    okays: dict[str, int],
    recorded: dict[str, int],
    lost: dict[str, int],
    wall_s: float,
) -> dict[str, Any]:
    settings = {k: v for k, v in vars(args).items() if k not in ("reef", "out", "png")}
    return {
        "bench": "overload",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "processor": cpu_model(),
            "python": platform.python_version(),
        },
        "settings": settings,
        "capacity_per_s": round(args.capacity / args.service_s, 1),
        "arms": arms(args),
        "levels": results,
        "ok": okays,
        "records": recorded,
        "lost": lost,
        "wall_s": round(wall_s, 1),
    }


def plot(results: list[dict[str, Any]], levels: list[int], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (good, bad, lat) = plt.subplots(1, 3, figsize=(14.0, 4.2), sharex=True)
    styles = {"on": ("tab:blue", "bound on"), "off": ("tab:red", "bound off")}
    for arm, (color, label) in styles.items():
        rows = sorted((r for r in results if r["arm"] == arm), key=lambda r: r["connections"])
        x = [r["connections"] for r in rows]
        good.plot(x, [r["goodput_per_s"] for r in rows], "o-", color=color, label=label)
        bad.plot(x, [r["refused_per_s"] for r in rows], "x--", color=color, label=f"{label}: 429")
        timed_out = [r["timed_out_per_s"] for r in rows]
        bad.plot(x, timed_out, "s:", color=color, label=f"{label}: timed out")
        p99 = [r["p99_ms"] if r["p99_ms"] is not None else float("nan") for r in rows]
        lat.plot(x, p99, "o-", color=color, label=label)
    capacity = args.capacity / args.service_s
    good.axhline(capacity, color="grey", lw=0.8, ls=":", label=f"capacity {capacity:g}/s")
    lat.axhline(args.timeout_s * 1000, color="grey", lw=0.8, ls=":", label="client timeout")
    for ax in (good, bad, lat):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(n) for n in levels])
        ax.set_xlabel("client connections")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    good.set_ylabel("calls/s")
    good.set_ylim(bottom=0)
    good.set_title("goodput: 200s within the client's timeout")
    bad.set_ylabel("calls/s")
    bad.set_yscale("symlog", linthresh=1)
    bad.set_ylim(bottom=0)
    bad.set_title("refused (429) and timed out")
    lat.set_ylabel("ms")
    lat.set_yscale("log")
    lat.set_title("p99 latency of the 200s")
    fig.suptitle(
        f"reef serve (upstream) over a server of {capacity:g} calls/s: engine.max_queue bounded vs not",
        fontsize=10,
    )
    fig.tight_layout()
    args.png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.png, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
