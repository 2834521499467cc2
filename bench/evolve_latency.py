"""How long a batch of feedback takes to be served: seconds from the last report of a batch to
the first answer served by the release trained on it, through a real `reef serve` with its
automatic evolve worker (SFT, LoRA, the default gate: `improve` on 25 % of the batch held out;
`--gate always` trains on all of it and skips evaluation).

For each model one server runs; each run makes `--batch-size` (8) calls, reports each (a report
per receipt, with a correction: a new answer each run, so the candidate has something to beat
the head on), starts the clock when the last report's response arrives, then polls until an
answer's `x-reef-release-id` names a release other than the previous head:

- `--poll chat` (default): a chat call (max_tokens 1) every 0.2 s;
- `--poll head`: `GET /reef/scenarios/{s}/releases` every 0.2 s, then chat calls until one is
  served by the new head. Cheaper: on two cores a chat call every 0.2 s competes with training.

Where the time goes comes from the worker's own records: the task runs of the evolve flow in
its Prefect database (materialize, validate, train, evaluate, gate, register, deploy), TRL's
`train_runtime` in the release's metrics (the rest of the train task is loading the model and
building the trainer), and the deploy timings the worker logs ("release ... is the head ...").
The first run of a worker pays its imports (torch, TRL, Great Expectations, MLflow) and is
reported apart as the cold run. Writes JSON to bench/results/.

    .venv/bin/python bench/evolve_latency.py [--models tiny,smollm2] [--runs 5]
        [--baseline bench/results/evolve_latency-<earlier>.json]

`--baseline` prints each phase's p50 against an earlier run's (e.g. the code before a change).

The machine these numbers come from has two shared cores: the load average is printed with each
run, and the shares of the total (training, validation, ...) are steadier than the seconds.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import platform
import re
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import openai

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from demo.server import Server  # noqa: E402
from reef.testing.traffic import report_all, traffic  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
# From a batch's last report to its release serving, over every run the first included.
TARGET_P50_S = 10.0
TARGET_P95_S = 20.0
SCENARIO = "bench-evolve"
PHASES = [  # consecutive: they add up to the run's total
    "trigger",  # last report -> the flow run starts (worker wakes, checks readiness)
    "setup",  # flow start -> materialize (settings, recipe, head)
    "materialize",
    "validate",  # Great Expectations contract
    "prepare",  # dataset load, MLflow run and params
    "load",  # train task minus TRL's train_runtime: model load, PEFT, trainer init, save
    "train",  # TRL's train_runtime
    "evaluate",  # head and candidate scored on the held-out samples (none with `always`)
    "gate",  # the gate's paired test
    "register",  # MLflow metrics + artifact store + MLflow model version + candidate row
    "deploy",  # load adapter in the engine, verify, CAS the head, refresh, MLflow alias
    "serve",  # deploy done -> the first answer from the new release (includes poll interval)
]
REJECTED = 'evolve {"status": "rejected"'
COLOURS = ["Teal", "Crimson", "Amber", "Indigo", "Olive", "Coral", "Violet", "Ochre"]
# the log's context (" [scenario=...]") may follow the timings
HEAD_LINE = re.compile(r"release (\S+) \(seq \d+\) is the head of \S+: (\{.*\})(?: \[[^]]*\])?\s*$")


def _utc(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def flow_runs(db: Path) -> list[dict[str, Any]]:
    """The evolve flow runs in the worker's Prefect database, oldest first, with task times."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        runs = con.execute(
            "SELECT fr.id, fr.start_time, fr.end_time FROM flow_run fr JOIN flow f "
            "ON f.id = fr.flow_id WHERE f.name = 'evolve' ORDER BY fr.start_time"
        ).fetchall()
        out = []
        for run_id, start, end in runs:
            tasks = {}
            for name, t0, t1 in con.execute(
                "SELECT name, start_time, end_time FROM task_run WHERE flow_run_id = ?", (run_id,)
            ):
                tasks[name.rsplit("-", 1)[0]] = (_utc(t0), _utc(t1))
            out.append({"id": run_id, "start": _utc(start), "end": _utc(end), "tasks": tasks})
        return out
    finally:
        con.close()


def breakdown(
    flow: dict[str, Any], release: dict[str, Any], t_report: float, t_served: float
) -> dict[str, float]:
    t = flow["tasks"]
    train_runtime = float(release["metrics"].get("train_runtime", 0.0))
    train_task = t["train"][1] - t["train"][0]
    return {
        "trigger": flow["start"] - t_report,
        "setup": t["materialize_snapshot"][0] - flow["start"],
        "materialize": t["materialize_snapshot"][1] - t["materialize_snapshot"][0],
        "validate": t["validate_snapshot"][1] - t["validate_snapshot"][0],
        "prepare": t["train"][0] - t["validate_snapshot"][1],
        "load": train_task - train_runtime,
        "train": train_runtime,
        "evaluate": t["evaluate"][1] - t["train"][1],
        "gate": t["gate"][1] - t["evaluate"][1],
        "register": t["register_weights"][1] - t["gate"][1],
        "deploy": t["deploy"][1] - t["register_weights"][1],
        "serve": t_served - t["deploy"][1],
    }


def head_lines(log: str) -> dict[str, dict[str, Any]]:
    out = {}
    for line in log.splitlines():
        m = HEAD_LINE.search(line)
        if m:
            with contextlib.suppress(ValueError, SyntaxError):
                out[m.group(1)] = ast.literal_eval(m.group(2))
    return out


class Bench:
    def __init__(self, server: Server, model: str, args: argparse.Namespace):
        self.server, self.model = server, model
        self.batch_size, self.poll, self.corrections = args.batch_size, args.poll, args.corrections
        headers = {"x-reef-scenario": SCENARIO}
        self.client = openai.OpenAI(
            base_url=f"{server.url}/v1", api_key="unused", default_headers=headers, max_retries=0
        )
        self.http = httpx.Client(base_url=server.url, headers=headers, timeout=60)

    def close(self) -> None:
        self.client.close()
        self.http.close()

    def call(self, content: str, max_tokens: int) -> tuple[str, str]:
        raw = self.client.chat.completions.with_raw_response.create(
            model=self.model,
            messages=[{"role": "user", "content": content}],
            max_tokens=max_tokens,
            temperature=0,
        )
        return raw.headers["x-reef-agent-record-id"], raw.headers["x-reef-release-id"]

    def ready(self) -> bool:
        r = self.http.get(f"/reef/scenarios/{SCENARIO}/status")
        r.raise_for_status()
        return bool(r.json()["ready"])

    def head(self) -> dict[str, Any]:
        r = self.http.get(f"/reef/scenarios/{SCENARIO}/releases")
        r.raise_for_status()
        return next(x for x in r.json()["data"] if x["current"])

    def run(self, n: int, previous: str, timeout_s: float) -> dict[str, Any]:
        prompt = f"Bench run {n}, question {{i}}: name a colour."
        # `agree`: every run's feedback asks for the same answer to fresh questions, as users
        # who agree over time would; each candidate must still beat the head on the evaluation
        # pool (earlier rounds' held-out corrections too), by answering it more surely.
        # `vary`: a new colour each run, which contradicts the pool's earlier corrections: the
        # gate then refuses most candidates, as it should.
        colour = COLOURS[n % len(COLOURS)] if self.corrections == "vary" else COLOURS[0]
        correction = f"{colour}."
        rejected = self.server.log().count(REJECTED)

        def reported(calls: int, first: int) -> None:
            receipts = traffic(
                self.server,
                SCENARIO,
                calls,
                prompt=lambda i: prompt.format(i=first + i),
                model=self.model,
                max_tokens=8,
                temperature=0,
            )
            report_all(
                self.server,
                SCENARIO,
                receipts,
                lambda i, rid: {"score": 1.0, "feedback": {"correction": correction}},
            )

        reported(self.batch_size, 0)
        # The gate keeps a share of the samples for its evaluation pool (gate.holdout): they
        # never train, so a batch of batch_size may need a few more reported calls.
        extra = 0
        while not self.ready():
            reported(1, self.batch_size + extra)
            extra += 1
        t_report, m_report = time.time(), time.monotonic()
        polls = 0
        deadline, next_check = m_report + timeout_s, m_report + 2.0
        while True:
            if time.monotonic() > deadline:
                raise RuntimeError(f"run {n}: no new release in {timeout_s:.0f}s")
            if time.monotonic() > next_check:  # the log grows: read it every 2 s, not per poll
                next_check += 2.0
                if self.server.log().count(REJECTED) > rejected:
                    # the gate's job, not a failure of the loop: counted, then the next run
                    return {"n": n, "rejected": True, "seconds": time.monotonic() - m_report}
            if self.poll == "head" and self.head()["release_id"] == previous:
                time.sleep(0.2)
                continue
            polls += 1
            _, served = self.call("ping", 1)
            if served != previous:
                break
            time.sleep(0.2)
        seconds = time.monotonic() - m_report
        t_served = t_report + seconds
        return {"run": n, "seconds": seconds, "release_id": served, "polls": polls,
                "t_report": t_report, "t_served": t_served}  # fmt: skip


def bench_model(model: str, args: argparse.Namespace) -> dict[str, Any]:
    state = Path(tempfile.mkdtemp(prefix=f"reef-bench-evolve-{model}-"))
    params = {"epochs": args.epochs, "batch_size": 4, "max_length": 128}
    config = {
        # Serving keeps every core; the worker (training) gets --train-threads as
        # reef.train_threads (which the evolve flow sets) and OMP_NUM_THREADS (what its imports
        # see), which the engine's explicit `threads` overrides in the API process.
        "engine": {"embedded": {"threads": os.cpu_count() or 1}},
        "reef": {
            "recipe": "sft",
            "batch_size": args.batch_size,
            "params": params,
            "train_threads": _threads(args.train_threads),
        },
        # `default`: no gate configured, as a new user has it (policy improve, 25 % held out).
        **({} if args.gate == "default" else {"gate": {"policy": args.gate}}),
    }
    threads = _threads(args.train_threads)
    env = {"OMP_NUM_THREADS": str(threads)} if isinstance(threads, int) else {}
    server = Server(state, model, config, env=env)
    started = time.monotonic()
    server.start()
    ready_s = server.wait_for_log("evolve worker ready", timeout_s=600)
    print(f"{model}: serving after {time.monotonic() - started - ready_s:.1f}s, "
          f"worker ready {ready_s:.1f}s later", flush=True)  # fmt: skip
    bench = Bench(server, model, args)
    runs: list[dict[str, Any]] = []
    rejected: list[dict[str, Any]] = []
    try:
        bench.http.post("/reef/scenarios", json={"name": SCENARIO})
        previous = bench.head()["release_id"]
        for n in range(args.warmup + args.runs):
            load = os.getloadavg()[0]
            run = bench.run(n, previous, args.timeout)
            if run.get("rejected"):
                rejected.append(run)
                print(f"{model} run {n}: rejected by the gate after {run['seconds']:.1f}s "
                      f"(load {load:.1f})", flush=True)  # fmt: skip
                continue
            previous = run["release_id"]
            release = bench.head()
            assert release["release_id"] == previous, (release, previous)
            deadline = time.monotonic() + 30
            while True:  # the flow run's deploy task is written just after the head moved
                flows = flow_runs(state / "prefect" / "prefect.db")
                done = [f for f in flows if "deploy" in f["tasks"] and f["tasks"]["deploy"][1]]
                if len(done) > len(runs) or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            run["phases"] = breakdown(done[-1], release, run["t_report"], run["t_served"])
            run["deploy_timings"] = head_lines(server.log()).get(previous, {})
            run["train_metrics"] = {
                k: v for k, v in release["metrics"].items() if k.startswith("train_")
            }
            run["cold"] = n < args.warmup
            run["load_avg_1m"] = load
            runs.append(run)
            shown = " ".join(f"{k}={v:.1f}" for k, v in run["phases"].items())
            print(f"{model} run {n}{' (cold)' if run['cold'] else ''}: {run['seconds']:.1f}s "
                  f"(load {load:.1f}) {shown}", flush=True)  # fmt: skip
    finally:
        bench.close()
        server.stop()
        if not args.keep:
            shutil.rmtree(state, ignore_errors=True)
    return {**summarize(model, runs, params, args), "rejected": rejected}


def summarize(
    model: str, runs: list[dict[str, Any]], params: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    warm = [r for r in runs if not r["cold"]]
    totals = [r["seconds"] for r in warm]
    every = [r["seconds"] for r in runs]
    p50 = {k: statistics.median(r["phases"][k] for r in warm) for k in PHASES}
    share = {k: statistics.median(r["phases"][k] / r["seconds"] for r in warm) for k in PHASES}
    return {
        "model": model,
        "settings": {
            "batch_size": args.batch_size,
            "gate": args.gate,
            "poll": args.poll,
            "train_threads": args.train_threads,
            "corrections": args.corrections,
            **params,
        },
        "runs": runs,
        "p50_s": statistics.median(totals),
        "min_s": min(totals),
        "max_s": max(totals),
        "cold_s": [r["seconds"] for r in runs if r["cold"]],
        # every run, the worker's first included: what the targets are about
        "all_p50_s": statistics.median(every),
        "all_p95_s": _p95(every),
        "phase_p50_s": p50,
        "phase_share_p50": share,
    }


def _threads(value: str) -> int | str | None:
    """--train-threads as reef.train_threads: auto, a count, or None for 0."""
    return value if value == "auto" else (int(value) or None)


def _p95(values: list[float]) -> float:
    """The 95th percentile, linear between the two nearest runs (the largest for one run)."""
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=20, method="inclusive")[18]


def verdicts(results: list[dict[str, Any]]) -> str:
    """Each model's runs, the first included, against the targets: p50 <= 10 s, p95 <= 20 s."""
    lines = []
    for r in results:
        p50, p95, n = r["all_p50_s"], r["all_p95_s"], len(r["runs"])
        refused = len(r.get("rejected", ()))
        lines.append(
            f"{r['model']}: over all {n} released runs (the first included; {refused} more "
            f"rejected by the gate) p50 {p50:.1f} s "
            f"(target <= {TARGET_P50_S:g}) {'OK' if p50 <= TARGET_P50_S else 'MISSED'}, "
            f"p95 {p95:.1f} s (target <= {TARGET_P95_S:g}) "
            f"{'OK' if p95 <= TARGET_P95_S else 'MISSED'}"
        )
    return "\n".join(lines)


def table(results: list[dict[str, Any]]) -> str:
    head = "| model | runs | p50 s | min–max s | cold s | " + " | ".join(PHASES) + " |"
    lines = [head, "|" + "---|" * (5 + len(PHASES))]
    for r in results:
        n = len([x for x in r["runs"] if not x["cold"]])
        cold = ", ".join(f"{c:.1f}" for c in r["cold_s"]) or "–"
        cells = [
            f"{r['phase_p50_s'][k]:.1f} ({r['phase_share_p50'][k]:.0%})" for k in PHASES
        ]  # fmt: skip
        lines.append(
            f"| {r['model']} | {n} | {r['p50_s']:.1f} | {r['min_s']:.1f}–{r['max_s']:.1f} | "
            f"{cold} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def compare(results: list[dict[str, Any]], baseline: Path) -> str:
    """Per model and phase: the p50 of an earlier run (`--baseline`, e.g. before a change),
    this run's, and their ratio."""
    before = {r["model"]: r for r in json.loads(baseline.read_text())["results"]}
    lines = ["| model | phase | before s | after s | after ÷ before |", "|---|---|---:|---:|---:|"]
    for r in results:
        b = before.get(r["model"])
        if b is None:
            continue
        rows = [("total", b["p50_s"], r["p50_s"])]
        rows += [(k, b["phase_p50_s"].get(k, 0.0), r["phase_p50_s"][k]) for k in PHASES]
        for phase, old, new in rows:
            ratio = f"{new / old:.2f}" if old > 0.05 and new > 0 else "–"
            lines.append(f"| {r['model']} | {phase} | {old:.1f} | {new:.1f} | {ratio} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default="tiny,smollm2")
    p.add_argument("--runs", type=int, default=5, help="measured runs per model")
    p.add_argument("--warmup", type=int, default=1, help="cold runs first, reported apart")
    p.add_argument("--batch-size", type=int, default=8, help="reef.batch_size: reports per run")
    p.add_argument("--epochs", type=float, default=2.0, help="SFT epochs (batch 4: 1 step each)")
    p.add_argument(
        "--gate",
        choices=["default", "always"],
        default="default",
        help="gate.policy; default: none configured (improve, 25 %% of the batch held out)",
    )
    p.add_argument("--poll", choices=["chat", "head"], default="chat")
    p.add_argument(
        "--train-threads",
        default="auto",
        help="torch threads of the evolve worker (reef.train_threads; a count also sets "
        "OMP_NUM_THREADS): a count, auto (the default: the cores left idle, per step), or 0: "
        "torch's default",
    )
    p.add_argument(
        "--corrections",
        choices=["agree", "vary"],
        default="agree",
        help="agree: the same answer every run (fresh questions); vary: a new one each run, "
        "which contradicts the evaluation pool's earlier corrections",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    p.add_argument(
        "--baseline", type=Path, help="an earlier run's JSON (bench/results/): per-phase ratios"
    )
    p.add_argument("--keep", action="store_true", help="keep the servers' state directories")
    args = p.parse_args()
    results = [bench_model(m.strip(), args) for m in args.models.split(",") if m.strip()]
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = RESULTS / f"evolve_latency-{stamp}.json"
    meta = {
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "argv": sys.argv[1:],
        "load_avg": os.getloadavg(),
    }
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=2, default=str))
    print("\nseconds from the last report to the first answer of the new release (p50 of the warm "
          "runs; phases: p50 s (p50 share of the run))\n" + table(results))  # fmt: skip
    print("\n" + verdicts(results))
    if args.baseline:
        print(f"\nagainst {args.baseline}\n" + compare(results, args.baseline))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
