"""A soak run: one `reef serve` (its evolve worker as a process) on a fresh PostgreSQL database,
under mixed traffic for `--minutes` (60 by default), with an evolve round every few minutes and
retention on; it records how each process, the database and the artifact store grow, and fails
when growth passes the bounds below (docs/reliability.md, "Soak").

Traffic (`--clients` threads, 2 by default, each sending a call, then waiting `--pause` s):

- chat completions through the official openai SDK, plain and streamed; half of them the next
  turn of an earlier conversation (its history sent again, as a chat client does: Reef stitches
  the session by itself);
- Responses (`client.responses.create`), half of them continuing one with
  `previous_response_id`;
- Anthropic messages through the official anthropic SDK (`/v1/messages`), with next turns too.

Every `--evolve-every` s (240) an evolve round: the newest 8 receipts are reported through
Reef's client (reef.client.Reef, each with a correction, a new one each round), topped up one
report at a time until `/reef/scenarios/soak/status` says ready (the gate holds back a share of
every batch for its evaluation pool, as bench/evolve_latency.py does), then the round waits
for the worker to decide the candidate (published or rejected). Retention is on
(`store.retention_days` = `--retention-minutes`, 10 min) and `reef gc` applies it every
`--gc-every` s (the worker applies it only hourly). Where the database server has autovacuum
off (the project machines' Postgres does), a VACUUM follows each `reef gc`, standing in for it.

Every `--sample-every` s (30): RSS (VmRSS) and open file descriptors of each process of the
server's session (`reef serve`, the evolve worker, what they start), read from /proc; the
database's size (pg_database_size) and its live rows per table; the state directory's sizes
(artifact store, MLflow's SQLite, the worker's Prefect database). Per `--window` (5 min, 1 min
for runs under 20 min): p50 / p99 latency per kind of call, calls and errors.

At the end every acknowledged receipt (a 200 carried it) and report (a 201) is looked up in
the database or, once archived, in the retention archive: none may be missing.

Bounds (checked at the end; exit 1 naming each one broken). The run is cut in sixths: the
first is warm-up (models loaded, first rounds), the second the reference, the last the end.

- RSS: each process's median RSS in the last sixth <= 1.25 x its median in the second sixth;
- open fds: each process's most in the last sixth <= its most in the second sixth + 20;
- database: its size at the end <= 1.5 x its size at the end of the second sixth (retention
  keeps it flat once the window has passed);
- artifact store (it keeps every candidate's weights and the archive: linear by design): the
  weights added per decided round in the second half <= 2 x in the first half, and the
  archive's bytes per minute likewise (from its first file on);
- latency: p50 of the last window <= 3 x p50 of the first window after warm-up (p99 reported);
- no acknowledged receipt or report missing; no call answered 5xx or failed to connect; no
  evolve worker restart; evolve rounds decided >= one per `2 x --evolve-every` after warm-up,
  at least one published.

    .venv/bin/python bench/soak.py                  # 60 min, SmolLM2; docs/soak.json, .png
    .venv/bin/python bench/soak.py --minutes 3 --model tiny --out /tmp/soak
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anthropic
import openai
import psycopg
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from demo.server import Server  # noqa: E402
from reef.client import Reef  # noqa: E402
from reef.testing.process import REEF, cpu_model  # noqa: E402

SCENARIO = "soak"
COLOURS = ["Teal", "Crimson", "Amber", "Indigo", "Olive", "Coral", "Violet", "Ochre"]
TOPICS = ["the sea", "a city", "bread", "rain", "a river", "music", "a garden", "the moon"]
KINDS = ["chat", "stream", "responses", "anthropic"]
MIB = 1024 * 1024
SFT = {"epochs": 2.0, "batch_size": 4, "max_length": 128}  # reef.params: 1 step per epoch

# The bounds (module docstring, docs/reliability.md)
RSS_GROWTH = 1.25
FD_SLACK = 20
DB_GROWTH = 1.5
ARTIFACT_RATE_GROWTH = 2.0
P50_GROWTH = 3.0


@dataclass
class Call:
    t: float  # seconds since the start, when the call ended
    kind: str
    seconds: float
    ok: bool
    error: str | None = None


@dataclass
class Shared:
    """What the threads share: the calls made, the receipts and reports acknowledged."""

    t0: float
    calls: list[Call] = field(default_factory=list)
    receipts: list[str] = field(default_factory=list)
    recent: deque[tuple[str, str]] = field(default_factory=lambda: deque(maxlen=64))
    reports: list[str] = field(default_factory=list)
    rounds: list[dict[str, Any]] = field(default_factory=list)
    gcs: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    def now(self) -> float:
        return time.monotonic() - self.t0


class Client(threading.Thread):
    """One application: a random mix of calls, each ended call timed, receipts kept."""

    def __init__(
        self, k: int, server: Server, model: str, shared: Shared, pause: float, keep_s: float
    ):
        super().__init__(name=f"client-{k}", daemon=True)
        # A Responses chain is continued only while its first response is younger than this
        # (half the retention window): see respond().
        self.keep_s = keep_s
        self.rng = random.Random(k)
        self.k, self.model, self.shared, self.pause = k, model, shared, pause
        headers = {"x-reef-scenario": SCENARIO}
        self.oai = openai.OpenAI(
            base_url=server.base_url, api_key="none", default_headers=headers, max_retries=2
        )
        self.ant = anthropic.Anthropic(
            base_url=server.url, api_key="none", default_headers=headers, max_retries=2
        )
        self.chats: list[list[dict[str, str]]] = []  # conversations to continue
        self.threads: list[list[dict[str, str]]] = []  # anthropic's
        self.responses: list[tuple[float, str]] = []  # (chain began, id) to continue
        self.n = 0

    def question(self) -> str:
        self.n += 1
        return f"Client {self.k}, turn {self.n}: say something about {self.rng.choice(TOPICS)}."

    def history(self, pool: list[list[dict[str, str]]]) -> list[dict[str, str]]:
        """A conversation's next turn half the time (at most 4 turns long), else a new one."""
        if pool and self.rng.random() < 0.5:
            convo = pool.pop(self.rng.randrange(len(pool)))
            if len(convo) < 8:
                return [*convo, {"role": "user", "content": self.question()}]
        return [{"role": "user", "content": self.question()}]

    def keep(self, pool: list[Any], item: Any) -> None:
        pool.append(item)
        del pool[:-8]

    def chat(self, stream: bool) -> str:
        messages = self.history(self.chats)
        raw = self.oai.chat.completions.with_raw_response.create(
            model=self.model,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=16,
            stream=stream,
        )
        parsed: Any = raw.parse()
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in parsed if c.choices)
        else:
            text = parsed.choices[0].message.content or ""
        self.keep(self.chats, [*messages, {"role": "assistant", "content": text}])
        return raw.headers["x-reef-agent-record-id"]

    def respond(self) -> str:
        # A response continues its chain while the chain's first response is younger than
        # keep_s: the server reads the whole chain back, and once retention has archived any
        # link of it, continuing answers 404 (naming that link), by design.
        previous, began = None, time.monotonic()
        self.responses = [r for r in self.responses if began - r[0] < self.keep_s]
        if self.responses and self.rng.random() < 0.5:
            began, previous = self.responses.pop(self.rng.randrange(len(self.responses)))
        raw = self.oai.responses.with_raw_response.create(
            model=self.model,
            input=self.question(),
            max_output_tokens=16,
            previous_response_id=previous or openai.omit,
        )
        self.keep(self.responses, (began, raw.parse().id))
        return raw.headers["x-reef-agent-record-id"]

    def message(self) -> str:
        messages = self.history(self.threads)
        raw = self.ant.messages.with_raw_response.create(
            model=self.model,
            max_tokens=16,
            messages=messages,  # type: ignore[arg-type]
        )
        msg = raw.parse()
        text = "".join(getattr(b, "text", "") for b in msg.content)
        self.keep(self.threads, [*messages, {"role": "assistant", "content": text or "..."}])
        return raw.headers["x-reef-agent-record-id"]

    def one(self, kind: str) -> str:
        if kind in ("chat", "stream"):
            return self.chat(kind == "stream")
        if kind == "responses":
            return self.respond()
        return self.message()

    def run(self) -> None:
        sh = self.shared
        while not sh.stop.is_set():
            kind = self.rng.choices(KINDS, weights=[4, 2, 2, 2])[0]
            started = time.monotonic()
            try:
                rid = self.one(kind)
            except Exception as e:  # every failure is counted and named
                with sh.lock:
                    sh.calls.append(
                        Call(sh.now(), kind, time.monotonic() - started, False, repr(e)[:300])
                    )
                time.sleep(1.0)
                continue
            with sh.lock:
                sh.calls.append(Call(sh.now(), kind, time.monotonic() - started, True))
                sh.receipts.append(rid)
                sh.recent.append((kind, rid))
            sh.stop.wait(self.pause)

    def close(self) -> None:
        self.oai.close()
        self.ant.close()


class Rounds(threading.Thread):
    """An evolve round every `every` s: reports on the newest receipts until the batch is
    ready, then waits for the worker to decide the candidate."""

    def __init__(self, server: Server, shared: Shared, every: float, batch: int):
        super().__init__(name="rounds", daemon=True)
        self.server, self.shared, self.every, self.batch = server, shared, every, batch
        self.reef = Reef(server.url, scenario=SCENARIO, timeout_s=60)
        self.reported: set[str] = set()

    def fresh(self, n: int, timeout_s: float = 120.0) -> list[str]:
        """`n` receipts not reported yet, newest first (waits for traffic to make them)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.shared.lock:
                got = [rid for _, rid in reversed(self.shared.recent) if rid not in self.reported]
            if len(got) >= n:
                return got[:n]
            time.sleep(0.5)
        raise RuntimeError(f"no {n} fresh receipts in {timeout_s:.0f}s: is traffic flowing?")

    def report(self, receipts: list[str], correction: str) -> None:
        for rid in receipts:
            out = self.reef.report(rid, score=1.0, feedback={"correction": correction})
            self.reported.add(rid)
            with self.shared.lock:
                self.shared.reports.append(out.id)

    def decided(self) -> dict[str, str]:
        r = self.reef._http.get(f"/reef/scenarios/{SCENARIO}/candidates")
        r.raise_for_status()
        return {c["release_id"]: c["status"] for c in r.json()["data"]}

    def ready(self) -> bool:
        r = self.reef._http.get(f"/reef/scenarios/{SCENARIO}/status")
        r.raise_for_status()
        return bool(r.json()["ready"])

    def one(self, n: int) -> dict[str, Any]:
        sh = self.shared
        before = self.decided()
        correction = f"{COLOURS[n % len(COLOURS)]}."
        started, t = time.monotonic(), sh.now()
        self.report(self.fresh(self.batch), correction)
        extra = 0
        while not self.ready():  # the evaluation pool keeps a share of the batch
            self.report(self.fresh(1), correction)
            extra += 1
        reported_s = time.monotonic() - started
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and not sh.stop.is_set():
            now = self.decided()
            new = {k: v for k, v in now.items() if k not in before or before[k] != v}
            done = {k: v for k, v in new.items() if v not in ("pending", "candidate")}
            if done:
                release, status = next(iter(done.items()))
                return {"round": n, "t": t, "reports": self.batch + extra, "status": status,
                        "release_id": release, "reported_s": round(reported_s, 1),
                        "decided_s": round(time.monotonic() - started, 1)}  # fmt: skip
            time.sleep(2.0)
        status = "cut" if sh.stop.is_set() else "undecided"  # cut: the run ended first
        return {"round": n, "t": t, "reports": self.batch + extra, "status": status,
                "reported_s": round(reported_s, 1)}  # fmt: skip

    def run(self) -> None:
        sh, n = self.shared, 0
        while not sh.stop.wait(self.every if n else min(self.every, 60.0)):
            try:
                result = self.one(n)
            except Exception as e:  # a failed round is recorded and fails the run
                result = {"round": n, "t": sh.now(), "status": "error", "error": repr(e)[:300]}
            with sh.lock:
                sh.rounds.append(result)
            print(f"[{sh.now() / 60:5.1f} min] evolve round {n}: {result}", flush=True)
            n += 1


def autovacuum(dsn: str) -> bool:
    with psycopg.connect(dsn, connect_timeout=5) as conn:
        row = conn.execute("SHOW autovacuum").fetchone()
    return bool(row and row[0] == "on")


def gc_loop(
    config: Path, state: Path, dsn: str, vacuum: bool, shared: Shared, every: float
) -> None:
    """`reef gc` (retention) every `every` s, as an operator's cron would; with `vacuum`, then
    a VACUUM of the database, standing in for autovacuum where the server has it off (the
    project machines' Postgres does): without either, the rows retention deletes stay dead in
    the table's pages and the database grows as if nothing were deleted."""
    while not shared.stop.wait(every):
        started = time.monotonic()
        p = subprocess.run(
            [REEF, "gc", "-c", str(config), "--state-dir", str(state)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        said = (p.stdout + p.stderr).strip()[-600:]
        out = {"t": shared.now(), "rc": p.returncode, "seconds": round(time.monotonic() - started, 1),
               "output": said}  # fmt: skip
        if vacuum:
            started = time.monotonic()
            with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
                conn.execute("VACUUM (ANALYZE)")
            out["vacuum_s"] = round(time.monotonic() - started, 1)
        with shared.lock:
            shared.gcs.append(out)
        print(f"[{shared.now() / 60:5.1f} min] reef gc: rc {p.returncode}, "
              f"{said.splitlines()[0] if said else ''}", flush=True)  # fmt: skip


# ------------------------------------------------------------------ sampling


def _session_pids(sid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError):
            fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid:  # state ppid pgrp session
                out.append(int(d))
    return sorted(out)


def _role(pid: int) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    text = " ".join(a.decode(errors="replace") for a in argv if a)
    if "reef.cli.worker" in text:
        return "worker"
    if "prefect" in text:
        return "prefect-server"
    if " serve " in f"{text} " and "reef" in text:
        return "serve"
    return Path(argv[0].decode(errors="replace")).name or f"pid-{pid}"


def process_sample(sid: int) -> dict[str, dict[str, Any]]:
    """Per role (several processes of one role: numbered): pid, RSS MiB, open fds, threads."""
    out: dict[str, dict[str, Any]] = {}
    for pid in _session_pids(sid):
        with contextlib.suppress(OSError):
            role = _role(pid)
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
            kv = {k: v.strip() for k, _, v in (line.partition(":") for line in status)}
            rss = int(kv.get("VmRSS", "0 kB").split()[0]) / 1024
            fds = len(os.listdir(f"/proc/{pid}/fd"))
            name, i = role, 2
            while name in out:
                name, i = f"{role}-{i}", i + 1
            out[name] = {"pid": pid, "rss_mib": round(rss, 1), "fds": fds,
                         "threads": int(kv.get("Threads", "0"))}  # fmt: skip
    return out


def dir_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_size
    return total


def db_sample(url: str) -> dict[str, Any]:
    with psycopg.connect(url, connect_timeout=5) as conn:
        size = conn.execute("SELECT pg_database_size(current_database())").fetchone()
        rows = conn.execute(
            "SELECT relname, n_live_tup FROM pg_stat_user_tables WHERE n_live_tup > 0"
        ).fetchall()
    return {"bytes": int(size[0]) if size else 0, "rows": {r[0]: int(r[1]) for r in rows}}


def sample(server: Server, dsn: str, shared: Shared) -> dict[str, Any]:
    assert server.proc is not None
    state = server.state_dir
    with shared.lock:
        errors = sum(1 for c in shared.calls if not c.ok)
        calls = len(shared.calls)
    return {
        "t": round(shared.now(), 1),
        "processes": process_sample(server.proc.pid),
        "db": db_sample(dsn),
        "artifacts_bytes": dir_bytes(state / "artifacts"),
        "archive_bytes": dir_bytes(state / "artifacts" / "archive"),
        "mlflow_db_bytes": sum(p.stat().st_size for p in state.glob("mlflow.db*") if p.is_file()),
        "prefect_bytes": dir_bytes(state / "prefect"),
        "state_bytes": dir_bytes(state),
        "calls": calls,
        "errors": errors,
        "load_avg_1m": os.getloadavg()[0],
    }


# ------------------------------------------------------------------ results


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def windows(calls: list[Call], window_s: float, total_s: float) -> list[dict[str, Any]]:
    out = []
    for i in range(int(total_s // window_s) + (total_s % window_s >= window_s / 2)):
        lo, hi = i * window_s, (i + 1) * window_s
        inside = [c for c in calls if lo <= c.t < hi]
        ok = [c.seconds for c in inside if c.ok]
        row: dict[str, Any] = {"from_min": lo / 60, "to_min": min(hi, total_s) / 60,
                               "calls": len(inside), "errors": len(inside) - len(ok),
                               "p50_s": _pct(ok, 0.5), "p99_s": _pct(ok, 0.99)}  # fmt: skip
        for kind in KINDS:
            k = [c.seconds for c in inside if c.ok and c.kind == kind]
            row[kind] = {"n": len(k), "p50_s": _pct(k, 0.5), "p99_s": _pct(k, 0.99)}
        out.append(row)
    return out


def lost(dsn: str, config: Path, state: Path, receipts: list[str], reports: list[str]) -> dict:
    """The acknowledged receipts and reports found neither in the database nor in the
    retention archive."""
    from reef.artifacts import artifacts_for
    from reef.retention import archived_records, archived_reports
    from reef.settings import load_settings
    from reef.store.sql import open_store

    settings = load_settings(config, server={"state_dir": state})
    store = open_store(dsn)
    artifacts = artifacts_for(settings)
    try:
        live = store.existing_record_ids(SCENARIO, receipts)
        archived = {r.id for page in archived_records(store, artifacts, SCENARIO) for r in page}
        live_reports = {r.id for r in store.list_reports(SCENARIO, limit=1_000_000)}
        archived_reps = {r.id for r in archived_reports(artifacts, SCENARIO)}
    finally:
        store.close()
    missing = [r for r in receipts if r not in live and r not in archived]
    missing_reports = [r for r in reports if r not in live_reports and r not in archived_reps]
    return {
        "receipts": len(receipts),
        "receipts_in_db": len(live),
        "receipts_archived": len(set(receipts) & archived),
        "reports": len(reports),
        "reports_in_db": len(set(reports) & live_reports),
        "reports_archived": len(set(reports) & archived_reps),
        "missing_receipts": missing[:20],
        "missing_reports": missing_reports[:20],
        "lost": len(missing) + len(missing_reports),
    }


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def check(result: dict[str, Any], every: float) -> list[str]:
    """The bounds the run broke, each said in a sentence (module docstring)."""
    samples, total = result["samples"], result["seconds"]
    sixth = total / 6
    ref = [s for s in samples if sixth <= s["t"] < 2 * sixth]
    end = [s for s in samples if s["t"] >= 5 * sixth]
    broken = []
    if not ref or not end:
        return ["too few samples to check the bounds (run longer)"]
    roles = {r for s in samples for r in s["processes"]}
    for role in sorted(roles):
        a = [s["processes"][role]["rss_mib"] for s in ref if role in s["processes"]]
        b = [s["processes"][role]["rss_mib"] for s in end if role in s["processes"]]
        if a and b and _median(b) > RSS_GROWTH * _median(a):
            broken.append(f"{role}: median RSS {_median(b):.0f} MiB at the end > "
                          f"{RSS_GROWTH} x {_median(a):.0f} MiB (second sixth)")  # fmt: skip
        fa = [s["processes"][role]["fds"] for s in ref if role in s["processes"]]
        fb = [s["processes"][role]["fds"] for s in end if role in s["processes"]]
        if fa and fb and max(fb) > max(fa) + FD_SLACK:
            broken.append(f"{role}: {max(fb)} open fds at the end > {max(fa)} + {FD_SLACK}")
    db_ref, db_end = ref[-1]["db"]["bytes"], samples[-1]["db"]["bytes"]
    if db_end > DB_GROWTH * db_ref:
        broken.append(f"database {db_end / MIB:.1f} MiB at the end > {DB_GROWTH} x "
                      f"{db_ref / MIB:.1f} MiB (end of the second sixth)")  # fmt: skip
    rounds = [r for r in result["rounds"] if r["status"] in ("published", "rejected")]
    broken += artifact_growth(samples, rounds, total / 2)
    win = [w for w in result["windows"] if w["from_min"] * 60 >= sixth and w["calls"]]
    if len(win) >= 2 and win[-1]["p50_s"] > P50_GROWTH * win[0]["p50_s"]:
        broken.append(f"p50 latency {win[-1]['p50_s']:.2f}s in the last window > {P50_GROWTH} x "
                      f"{win[0]['p50_s']:.2f}s (first window after warm-up)")  # fmt: skip
    loss = result["lost"]
    if loss["lost"]:
        broken.append(f"{loss['lost']} acknowledged receipts or reports missing: "
                      f"{loss['missing_receipts'][:5]} {loss['missing_reports'][:5]}")  # fmt: skip
    errors = [c for c in result["failed_calls"]]
    if errors:
        broken.append(f"{len(errors)} calls failed, first: {errors[0]}")
    if result["worker_restarts"]:
        broken.append(f"the evolve worker was started again {result['worker_restarts']} times")
    expected = max(1, int((total - sixth) / (2 * every)))
    if len(rounds) < expected:
        broken.append(f"{len(rounds)} evolve rounds decided < {expected} (one per "
                      f"{2 * every:.0f}s after warm-up)")  # fmt: skip
    if not any(r["status"] == "published" for r in rounds):
        broken.append("no evolve round published a release")
    bad_rounds = [r for r in result["rounds"] if r["status"] in ("error", "undecided")]
    if bad_rounds:
        broken.append(
            f"{len(bad_rounds)} evolve rounds failed or stayed undecided: {bad_rounds[0]}"
        )
    bad_gc = [g for g in result["gc"] if g["rc"] != 0]
    if bad_gc:
        broken.append(f"reef gc failed {len(bad_gc)} times: {bad_gc[0]['output'][-300:]}")
    return broken


def artifact_growth(
    samples: list[dict[str, Any]], rounds: list[dict[str, Any]], half: float
) -> list[str]:
    """The artifact store's two parts, each against its own first half: the weights (every
    candidate's, published or rejected) per decided round, the retention archive per minute."""
    mid = min(samples, key=lambda s: abs(s["t"] - half))
    first, last = samples[0], samples[-1]
    weights = lambda s: s["artifacts_bytes"] - s["archive_bytes"]  # noqa: E731
    broken = []
    n1 = sum(1 for r in rounds if r["t"] + r["decided_s"] < mid["t"])  # weights land then
    n2 = len(rounds) - n1
    if n1 and n2:
        rate1 = (weights(mid) - weights(first)) / n1
        rate2 = (weights(last) - weights(mid)) / n2
        if rate2 > ARTIFACT_RATE_GROWTH * max(rate1, 1.0):
            broken.append(f"the artifact store's weights grew {rate2 / MIB:.2f} MiB per round in "
                          f"the second half > {ARTIFACT_RATE_GROWTH} x {rate1 / MIB:.2f} (first)")  # fmt: skip
    # from the first archive on: nothing is archived before the retention window has passed
    start = next((s for s in samples if s["archive_bytes"] > 0), last)
    a1 = (mid["archive_bytes"] - start["archive_bytes"]) / max(mid["t"] - start["t"], 1.0)
    a2 = (last["archive_bytes"] - mid["archive_bytes"]) / max(last["t"] - mid["t"], 1.0)
    if start["t"] < mid["t"] and a1 > 0 and a2 > ARTIFACT_RATE_GROWTH * a1:
        broken.append(f"the retention archive grew {a2 * 60 / MIB:.2f} MiB/min in the second half "
                      f"> {ARTIFACT_RATE_GROWTH} x {a1 * 60 / MIB:.2f} (first)")  # fmt: skip
    return broken


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = result["samples"]
    t = [s["t"] / 60 for s in samples]
    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    roles = sorted({r for s in samples for r in s["processes"]})
    for role in roles:
        xs = [s["t"] / 60 for s in samples if role in s["processes"]]
        ax[0][0].plot(xs, [s["processes"][role]["rss_mib"] for s in samples
                           if role in s["processes"]], label=role)  # fmt: skip
        ax[0][1].plot(xs, [s["processes"][role]["fds"] for s in samples
                           if role in s["processes"]], label=role)  # fmt: skip
    ax[0][0].set(title="RSS per process", xlabel="minutes", ylabel="MiB")
    ax[0][1].set(title="open file descriptors per process", xlabel="minutes")
    ax[0][0].legend(fontsize=8)
    ax[0][1].legend(fontsize=8)
    a = ax[1][0]
    a.plot(t, [s["db"]["bytes"] / MIB for s in samples], label="Postgres database")
    a.plot(t, [s["archive_bytes"] / MIB for s in samples], label="retention archive (in the store)")
    a.plot(t, [s["mlflow_db_bytes"] / MIB for s in samples], label="MLflow SQLite")
    a.plot(t, [s["prefect_bytes"] / MIB for s in samples], label="worker's Prefect DB")
    for r in result["rounds"]:
        if r["status"] in ("published", "rejected"):
            a.axvline((r["t"] + r["decided_s"]) / 60, color="grey", alpha=0.2)
    a.set(title="storage (grey: evolve rounds decided)", xlabel="minutes", ylabel="MiB")
    a.legend(fontsize=8, loc="upper left")
    b = a.twinx()  # the artifact store is 10-100x the rest: its own axis
    b.plot(t, [s["artifacts_bytes"] / MIB for s in samples], "k--", label="artifact store")
    b.set(ylabel="artifact store, MiB (dashed)")
    b.legend(fontsize=8, loc="lower right")
    a = ax[1][1]
    w = result["windows"]
    mids = [(x["from_min"] + x["to_min"]) / 2 for x in w]
    a.plot(mids, [x["p50_s"] for x in w], "o-", label="p50, all calls")
    a.plot(mids, [x["p99_s"] for x in w], "o-", label="p99, all calls")
    a.set(title=f"latency per {result['window_s'] / 60:.0f}-min window (shared 2-core machine)",
          xlabel="minutes", ylabel="seconds")  # fmt: skip
    a.legend(fontsize=8)
    fig.suptitle(f"bench/soak.py: {result['minutes']:.0f} min, {result['model']}, Postgres, "
                 f"retention {result['settings']['retention_minutes']} min")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ------------------------------------------------------------------ main


def _database(admin_url: str) -> tuple[str, str]:
    name = f"reef_soak_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = make_url(admin_url).set(database=name)
    return url.set(drivername="postgresql+psycopg").render_as_string(hide_password=False), (
        url.render_as_string(hide_password=False)
    )


def _drop(admin_url: str, dsn: str) -> None:
    name = make_url(dsn).database
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run(args: argparse.Namespace) -> dict[str, Any]:
    """A fresh database and state directory, the server on them for the run; both go after
    it (unless `--keep`), however it ends."""
    db_url, dsn = _database(args.postgres_url)
    state = Path(tempfile.mkdtemp(prefix="reef-soak-"))
    config = {
        "engine": {"embedded": {"threads": os.cpu_count() or 1}},
        "store": {"database_url": db_url, "retention_days": args.retention_minutes / 1440},
        "reef": {"recipe": "sft", "batch_size": args.batch_size, "params": SFT},
    }
    # The worker at the server's priority: at `idle` (the default) the soak's own traffic and
    # the machine's other work could starve it of every round.
    env = {"OMP_NUM_THREADS": "1", "REEF_REEF__WORKER_PRIORITY": "normal"}
    server = Server(state, args.model, config, env=env)
    print(f"state {state}, database {make_url(dsn).database}", flush=True)
    try:
        server.start()
        ready = server.wait_for_log("evolve worker ready", 600)
        print(f"serving; worker ready after {ready:.0f}s", flush=True)
        return drive(args, server, dsn)
    finally:
        server.stop()
        if not args.keep:
            _drop(args.postgres_url, dsn)
            shutil.rmtree(state, ignore_errors=True)


def drive(args: argparse.Namespace, server: Server, dsn: str) -> dict[str, Any]:
    """The traffic, the rounds and `reef gc` in threads for `--minutes`, sampled meanwhile;
    then the lost-record check, while the server still runs."""
    total, state = args.minutes * 60, server.state_dir
    shared = Shared(t0=time.monotonic())
    keep_s = args.retention_minutes * 30
    clients = [
        Client(k, server, args.model, shared, args.pause, keep_s) for k in range(args.clients)
    ]
    rounds = Rounds(server, shared, args.evolve_every, args.batch_size)
    vacuum = not autovacuum(dsn)
    if vacuum:
        print("the database server has autovacuum off: a VACUUM follows each reef gc", flush=True)
    gc = threading.Thread(
        target=gc_loop,
        args=(server.config_path, state, dsn, vacuum, shared, args.gc_every),
        daemon=True,
    )
    samples: list[dict[str, Any]] = []
    try:
        for th in [*clients, rounds, gc]:
            th.start()
        next_at = 0.0
        while shared.now() < total:
            if shared.now() >= next_at:
                samples.append(sample(server, dsn, shared))
                show(samples[-1])
                next_at += args.sample_every
            time.sleep(min(1.0, max(0.0, total - shared.now())))
        shared.stop.set()
        for th in clients:
            th.join(120)
        samples.append(sample(server, dsn, shared))
        rounds.join(5)  # a round in progress is left: it is recorded as cut
        gc.join(600)
        loss = lost(dsn, server.config_path, state, list(shared.receipts), list(shared.reports))
    finally:
        shared.stop.set()
        for c in clients:
            c.close()
    result = result_of(args, shared, samples, loss, vacuum)
    result["worker_restarts"] = server.log().count("starting it again (restart")
    result["state_dir"] = str(state)
    return result


def show(s: dict[str, Any]) -> None:
    procs = " ".join(f"{k}={v['rss_mib']:.0f}MiB/{v['fds']}fd" for k, v in s["processes"].items())
    print(f"[{s['t'] / 60:5.1f} min] {procs} db={s['db']['bytes'] / MIB:.1f}MiB "
          f"artifacts={s['artifacts_bytes'] / MIB:.1f}MiB calls={s['calls']} "
          f"errors={s['errors']} load={s['load_avg_1m']:.1f}", flush=True)  # fmt: skip


def result_of(
    args: argparse.Namespace,
    shared: Shared,
    samples: list[dict[str, Any]],
    loss: dict[str, Any],
    vacuum: bool,
) -> dict[str, Any]:
    elapsed = shared.now()
    window = args.window or (300.0 if args.minutes >= 20 else 60.0)
    calls = list(shared.calls)
    return {
        "bench": "soak",
        "at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {
            "node": platform.node(),
            "cpus": os.cpu_count(),
            "cpu": cpu_model(),
            "python": platform.python_version(),
        },
        "minutes": elapsed / 60,
        "seconds": elapsed,
        "model": args.model,
        "settings": {
            "clients": args.clients,
            "pause_s": args.pause,
            "evolve_every_s": args.evolve_every,
            "batch_size": args.batch_size,
            "retention_minutes": args.retention_minutes,
            "gc_every_s": args.gc_every,
            "sample_every_s": args.sample_every,
            "sft": SFT,
            "vacuum_after_gc": vacuum,
        },
        "window_s": window,
        "windows": windows(calls, window, elapsed),
        "samples": samples,
        "rounds": list(shared.rounds),
        "gc": list(shared.gcs),
        "calls": len(calls),
        "calls_by_kind": {k: sum(1 for c in calls if c.kind == k) for k in KINDS},
        "failed_calls": [f"{c.kind} at {c.t:.0f}s: {c.error}" for c in calls if not c.ok],
        "lost": loss,
    }


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--model", choices=["tiny", "smollm2"], default="smollm2")
    p.add_argument("--out", type=Path, default=ROOT / "docs", help="soak.json and soak.png")
    p.add_argument("--clients", type=int, default=2, help="client threads")
    p.add_argument("--pause", type=float, default=0.5, help="seconds between a client's calls")
    p.add_argument("--evolve-every", type=float, default=240.0, help="seconds between rounds")
    p.add_argument("--batch-size", type=int, default=8, help="reef.batch_size")
    p.add_argument("--retention-minutes", type=float, default=10.0)
    p.add_argument("--gc-every", type=float, default=300.0, help="seconds between `reef gc`")
    p.add_argument("--sample-every", type=float, default=30.0)
    p.add_argument("--window", type=float, help="latency window, s (default 300; 60 under 20 min)")
    p.add_argument(
        "--postgres-url",
        default=os.environ.get(
            "REEF_TEST_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/postgres"
        ),
        help="admin URL: a database is created for the run and dropped after it",
    )
    p.add_argument("--keep", action="store_true", help="keep the database and state directory")
    p.add_argument(
        "--replot",
        type=Path,
        metavar="JSON",
        help="no run: check the bounds of an earlier run's soak.json again, redraw its PNG",
    )
    args = p.parse_args()
    # SIGTERM (kill, a CI timeout) unwinds as Ctrl-C does: the server stops, the database goes.
    signal.signal(signal.SIGTERM, _interrupt)
    if args.replot:
        result = json.loads(args.replot.read_text())
        args.out = args.replot.parent
    else:
        result = run(args)
    result["broken"] = broken = check(result, result["settings"]["evolve_every_s"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_text(json.dumps(result, indent=1, default=str))
    plot(result, args.out / "soak.png")
    print(summary(result))
    print(f"wrote {args.out / 'soak.json'} and {args.out / 'soak.png'}")
    if broken:
        print("SOAK FAILED, bounds broken:\n- " + "\n- ".join(broken), file=sys.stderr)
        return 1
    print("soak passed: every bound held")
    return 0


def summary(result: dict[str, Any]) -> str:
    s0, s1 = result["samples"][0], result["samples"][-1]
    lines = [f"{result['minutes']:.1f} min, {result['calls']} calls {result['calls_by_kind']}, "
             f"{len(result['failed_calls'])} failed"]  # fmt: skip
    for role in sorted(set(s0["processes"]) | set(s1["processes"])):
        a, b = s0["processes"].get(role), s1["processes"].get(role)
        show = lambda x: f"{x['rss_mib']:.0f} MiB / {x['fds']} fds" if x else "-"  # noqa: E731
        lines.append(f"  {role}: start {show(a)}, end {show(b)}")
    lines.append(f"  database {s0['db']['bytes'] / MIB:.1f} -> {s1['db']['bytes'] / MIB:.1f} MiB,"
                 f" artifact store {s0['artifacts_bytes'] / MIB:.1f} -> "
                 f"{s1['artifacts_bytes'] / MIB:.1f} MiB")  # fmt: skip
    statuses = [r["status"] for r in result["rounds"]]
    lines.append(f"  evolve rounds: {len(statuses)} ({', '.join(statuses)})")
    lines.append(f"  lost: {result['lost']['lost']} ({result['lost']})")
    lines.append("  window | calls | errors | p50 s | p99 s")
    for w in result["windows"]:
        lines.append(f"  {w['from_min']:4.0f}-{w['to_min']:4.0f} min | {w['calls']} | "
                     f"{w['errors']} | {w['p50_s']:.2f} | {w['p99_s']:.2f}")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
