"""What Reef adds in upstream mode: wrk against the echo upstream directly, then through Reef.

One run: starts bench/echo_upstream.py, measures it with wrk (bench/chat.lua: a small chat
completion POST) at 1 and 16 connections, starts `reef serve --engine upstream` in front of it,
measures the same through Reef, and checks that every 200 Reef answered carries a receipt
header and left a durable record (records in the database vs. 200s counted by wrk's Lua
`response` hook). Prints a table with the through-Reef / direct ratios and writes JSON to
bench/results/.

Targets: added at 1 connection p50 <= 0.7 ms and p99 <= 1.5 ms (Reef's p50 and p99 less the
upstream's own, measured alone in the same run); >= 2,000 recorded requests/s at 16 connections.

Quota arm (`--quotas`, on by default): two more `reef serve`, each with one auth token, one
without limits (off) and one with `quota` limits no call reaches (on: every call is counted in
the database, admitted, and its tokens added), measured at 1 connection in the order off, on,
on, off, ... (`--quota-rounds` of each). Target: the limiter adds <= 0.1 ms to the p50.

Shadow arm (`--shadow`, on by default): a second `reef serve` with `rollout.mode: shadow`
(`--shadow-sample`, default 0.1 as in the settings; 1.0 copies every call), measured at 1
connection with no shadow candidate live (off) and with one live (on), in the order off, on,
on, off, ... (`--shadow-rounds` of each), so a load drifting during the run weighs on both. The
candidate is a harness release (its rules injected), so each copy is a second upstream call
plus a verifier score, after the user's answer. Target: <= 0.2 ms added to the user's p50.

OTLP arm (`--otlp`, on by default): two more `reef serve`, one without telemetry (off) and one
exporting every call's span over OTLP/HTTP to a receiver in this process (on: it decodes each
request with the official protobuf classes and counts the spans), measured at 1 connection in
the order off, on, on, off, ... (`--otlp-rounds` of each). Target: export adds <= 0.1 ms to
the p50.

    .venv/bin/python bench/upstream_overhead.py                 # SQLite in a temp state dir
    .venv/bin/python bench/upstream_overhead.py --database-url postgresql+psycopg://root@127.0.0.1/reef_bench
    .venv/bin/python bench/upstream_overhead.py --py-spy /tmp/cb/bin/py-spy   # + a profile of Reef
    .venv/bin/python bench/upstream_overhead.py --env REEF_STORE__COMMIT_WINDOW_MS=0

The machine these numbers come from has two cores shared by wrk, the echo upstream and Reef,
so the absolute numbers are a floor; the ratio is what to watch.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import platform
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from echo_upstream import launch as launch_echo

from reef.testing.process import cpu_seconds

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LUA = HERE / "chat.lua"
RESULTS = HERE / "results"
REEF = Path(sys.executable).with_name("reef")
TARGET_ADDED_P50_MS = 0.7
TARGET_ADDED_P99_MS = 1.5
TARGET_RECORDED_RPS = 2000.0
TARGET_SHADOW_ADDED_P50_MS = 0.2
TARGET_QUOTA_ADDED_P50_MS = 0.1
TARGET_OTLP_ADDED_P50_MS = 0.1
QUOTA_TOKEN = "reef-bench-quota-token"
# What the shadow Reef runs with: every call copied, a verifier scoring both answers, and a
# test that cannot decide during the bench (the candidate stays live).
SHADOW_ENV = {
    "REEF_ROLLOUT__MODE": "shadow",
    "REEF_ROLLOUT__SHADOW__SCORER": "reef.recipes.scorers:at_most_five_words",
    "REEF_ROLLOUT__MIN_SAMPLES": "1000000000",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen[Any] | None = None) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def measured(
    url: str, connections: int, duration_s: float, pid: int, headers: tuple[str, ...] = ()
) -> dict[str, Any]:
    """A wrk run plus the server's CPU per request and the machine's load around it (the
    machine may be shared: a high load average makes the numbers a floor)."""
    before = cpu_seconds(pid)
    result = wrk(url, connections, duration_s, headers)
    used = cpu_seconds(pid) - before
    result["server_cpu_us_per_request"] = round(used / max(result["requests"], 1) * 1e6, 1)
    result["server_cpu_share"] = round(used / (result["duration_us"] / 1e6), 3)
    result["loadavg_1m"] = round(os.getloadavg()[0], 2)
    return result


def wrk(
    url: str, connections: int, duration_s: float, headers: tuple[str, ...] = ()
) -> dict[str, Any]:
    """One wrk run; the Lua script's totals plus wrk's own requests/s."""
    cmd = [
        "wrk",
        *(arg for h in headers for arg in ("-H", h)),
        "-t1",  # one thread: the machine has two cores and the servers need them more
        f"-c{connections}",
        f"-d{duration_s:g}s",
        "--timeout",
        "10s",
        "--latency",
        "-s",
        str(LUA),
        url,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s + 60)
    if out.returncode != 0:
        raise SystemExit(f"wrk failed ({out.returncode}): {out.stderr or out.stdout}")
    line = next((x for x in out.stdout.splitlines() if x.startswith("WRK_JSON ")), None)
    if line is None:
        raise SystemExit(f"wrk printed no WRK_JSON line:\n{out.stdout}\n{out.stderr}")
    result = json.loads(line.removeprefix("WRK_JSON "))
    result["rps"] = result["requests"] / (result["duration_us"] / 1e6)
    result["ok_rps"] = result["ok"] / (result["duration_us"] / 1e6)
    result["connections"] = connections
    return result


class RecordCounter:
    """Counts rows of Reef's `records` table (SQLite file or Postgres)."""

    def __init__(self, database_url: str | None, state_dir: Path):
        self.url = database_url
        self.path = state_dir / "reef.db"

    def count(self) -> int:
        if self.url and self.url.startswith("postgresql"):
            import psycopg

            with psycopg.connect(_libpq(self.url)) as conn:
                row = conn.execute("SELECT count(*) FROM records").fetchone()
                return int(row[0]) if row else 0
        path = Path(self.url.removeprefix("sqlite:///")) if self.url else self.path
        with sqlite3.connect(path) as conn:
            return int(conn.execute("SELECT count(*) FROM records").fetchone()[0])


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def ensure_postgres_database(url: str) -> None:
    """Create the bench database when it does not exist (records are counted as deltas, so an
    existing one is fine)."""
    import psycopg
    from sqlalchemy.engine import make_url

    try:
        psycopg.connect(_libpq(url), connect_timeout=5).close()
        return
    except psycopg.OperationalError as e:
        if "does not exist" not in str(e):
            raise SystemExit(f"cannot reach {url}: {e}") from None
    target = make_url(url)
    admin = target.set(drivername="postgresql", database="postgres")
    with psycopg.connect(admin.render_as_string(hide_password=False), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{target.database}"')
    print(f"created database {target.database}", flush=True)


def py_spy_summary(raw: Path, top: int = 25) -> dict[str, Any]:
    """Self and inclusive sample shares per function from `py-spy record -f raw` output."""
    self_counts: collections.Counter[str] = collections.Counter()
    incl_counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        total += count
        frames = [f for f in stack.split(";") if not f.startswith("process ") and f]
        if not frames:
            continue
        self_counts[_frame(frames[-1])] += count
        for name in {_frame(f) for f in frames}:
            incl_counts[name] += count

    def share(counts: collections.Counter[str]) -> list[dict[str, Any]]:
        return [
            {"function": name, "share": round(n / max(total, 1), 4)}
            for name, n in counts.most_common(top)
        ]

    return {"samples": total, "self": share(self_counts), "inclusive": share(incl_counts)}


def _frame(frame: str) -> str:
    # "func (path/to/module.py:123)" -> "func (module.py)"; line numbers would split one function
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    file = where.rsplit(":", 1)[0]
    parts = Path(file).parts
    if "site-packages" in parts:
        file = "/".join(parts[parts.index("site-packages") + 1 :])
    elif str(ROOT) in file:
        file = str(Path(file).relative_to(ROOT))
    return f"{name} ({file})"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=10.0, help="seconds per measured run")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up before each")
    p.add_argument("--low", type=int, default=1, help="connections for the latency run")
    p.add_argument("--high", type=int, default=16, help="connections for the throughput run")
    p.add_argument("--database-url", help="bench Reef on this database (default: SQLite)")
    p.add_argument("--reef", type=Path, default=REEF, help="the reef console script")
    p.add_argument("--wait-for-reef", type=float, default=0.0, help="seconds to wait for it")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment for reef serve, e.g. REEF_STORE__COMMIT_WINDOW_MS=0 (repeatable)",
    )
    p.add_argument("--py-spy", help="py-spy binary: profile Reef during one measured run")
    p.add_argument(
        "--py-spy-run",
        choices=["low", "high"],
        default="high",
        help="which run --py-spy profiles: the latency run (--low) or the throughput run",
    )
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON result")
    p.add_argument(
        "--shadow",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure a shadow rollout's cost to the user (off vs on, --low connections)",
    )
    p.add_argument("--shadow-rounds", type=int, default=2, help="off/on rounds, alternated")
    p.add_argument("--shadow-sample", type=float, default=0.1, help="share of calls copied")
    p.add_argument(
        "--quotas",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure what per-token quotas add (off vs on, --low connections)",
    )
    p.add_argument("--quota-rounds", type=int, default=2, help="off/on rounds, alternated")
    otlp_options(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (apt-get install -y wrk)")

    result: dict[str, Any] = {
        "bench": "upstream_overhead",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "duration_s": args.duration,
        "database": "postgres" if (args.database_url or "").startswith("postgresql") else "sqlite",
        "direct": {},
        "reef": {},
    }
    if args.database_url and args.database_url.startswith("postgresql"):
        ensure_postgres_database(args.database_url)
    echo, echo_port = launch_echo()
    procs: list[subprocess.Popen[Any]] = [echo]
    state_dir = Path(tempfile.mkdtemp(prefix="reef-bench-"))
    try:
        direct_url = f"http://127.0.0.1:{echo_port}"
        print(f"echo upstream on {direct_url}; measuring it directly", flush=True)
        wrk(direct_url, args.high, args.warmup)
        for conns in (args.low, args.high):
            result["direct"][str(conns)] = measured(direct_url, conns, args.duration, echo.pid)

        deadline = time.monotonic() + args.wait_for_reef
        while not args.reef.exists() and time.monotonic() < deadline:
            time.sleep(5)
        if not args.reef.exists():
            result["reef_error"] = f"{args.reef} does not exist (the API is not installed yet)"
            return finish(result, args.out)
        result["reef_env"] = args.env
        reef, reef_url, ready = start_reef(args, echo_port, state_dir, {})
        procs.append(reef)
        if not ready:
            tail = (state_dir / "reef.log").read_text()[-2000:]
            result["reef_error"] = f"`reef serve --engine upstream` did not become ready:\n{tail}"
            return finish(result, args.out)
        print(f"reef serve on {reef_url} (pid {reef.pid}); measuring through it", flush=True)
        measure_through_reef(args, reef, reef_url, state_dir, result)
        if args.quotas and args.quota_rounds > 0:
            result["quotas"] = quota_arms(args, echo_port, procs)
        if args.otlp and args.otlp_rounds > 0:
            result["otlp"] = otlp_arms(args, echo_port, procs)
        if args.shadow and args.shadow_rounds > 0:  # 0 rounds: the plain comparison only
            shadow_dir = Path(tempfile.mkdtemp(prefix="reef-bench-shadow-"))
            try:
                result["shadow"] = shadow_arms(args, echo_port, shadow_dir, procs)
            finally:
                shutil.rmtree(shadow_dir, ignore_errors=True)
        return finish(result, args.out)
    finally:
        stop_all(procs)
        shutil.rmtree(state_dir, ignore_errors=True)


def measure_through_reef(
    args: argparse.Namespace,
    reef: subprocess.Popen[Any],
    reef_url: str,
    state_dir: Path,
    result: dict[str, Any],
) -> None:
    """wrk through Reef at --low and --high connections, each run with the records it left
    (and, with --py-spy, a profile of Reef during the --py-spy-run run) in result["reef"]."""
    counter = RecordCounter(args.database_url, state_dir)
    wrk(reef_url, args.high, args.warmup)
    for conns in (args.low, args.high):
        before = counter.count()
        spy = None
        if args.py_spy and conns == (args.low if args.py_spy_run == "low" else args.high):
            spy = start_py_spy(args, reef.pid, state_dir / "py-spy.txt")
        run = measured(reef_url, conns, args.duration, reef.pid)
        run["records"] = counter.count() - before
        # wrk stops with requests in flight: Reef may have recorded answers wrk never read,
        # so records may exceed the 200s by up to the connection count, never fall short.
        run["records_missing"] = max(0, run["ok"] - run["records"])
        run["records_unread"] = max(0, run["records"] - run["ok"])
        run["receipts_missing"] = run["ok"] - run["receipts"]
        result["reef"][str(conns)] = run
        if spy is not None:
            _, err = spy.communicate(timeout=args.duration + 30)
            if spy.returncode == 0 and (state_dir / "py-spy.txt").exists():
                result["profile"] = py_spy_summary(state_dir / "py-spy.txt")
            else:
                result["profile_error"] = err.strip()[-500:]


def start_py_spy(args: argparse.Namespace, pid: int, raw: Path) -> subprocess.Popen[str]:
    """py-spy sampling process `pid` for one measured run, raw output to `raw`."""
    spy_cmd = [args.py_spy, "record", "-p", str(pid), "-r", "250", "--nonblocking"]
    spy_cmd += ["-d", f"{args.duration:g}", "-f", "raw", "-o", str(raw)]
    return subprocess.Popen(
        spy_cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop_all(procs: list[subprocess.Popen[Any]]) -> None:
    """SIGTERM each process still running, newest first; SIGKILL one that outlives 30 s."""
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def start_reef(
    args: argparse.Namespace, echo_port: int, state_dir: Path, extra_env: dict[str, str]
) -> tuple[subprocess.Popen[Any], str, bool]:
    """`reef serve --engine upstream` in front of the echo upstream: (process, url, ready)."""
    port = free_port()
    cmd = [
        str(args.reef),
        "serve",
        "--engine",
        "upstream",
        "--upstream-url",
        f"http://127.0.0.1:{echo_port}/v1",
        "--upstream-model",
        "echo",
        "--state-dir",
        str(state_dir),
        "--port",
        str(port),
    ]
    if args.database_url and not extra_env:
        cmd += ["--database-url", args.database_url]
    log = (state_dir / "reef.log").open("w")
    # no evolve worker: it would share the cores with what is being measured
    env = {
        **os.environ,
        "REEF_REEF__AUTO": "false",
        **dict(kv.split("=", 1) for kv in args.env),
        **extra_env,
    }
    reef = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    ready = wait_http(f"{url}/healthz", max(60.0, args.wait_for_reef), reef)
    log.flush()
    return reef, url, ready


def _chain(state_dir: Path, url: str) -> Any:
    sys.path.insert(0, str(ROOT))
    from reef.deploy.chain import ReleaseChain
    from reef.settings import load_settings

    port = int(url.rsplit(":", 1)[1])
    settings = load_settings(server={"state_dir": str(state_dir), "port": port})
    return ReleaseChain.for_settings(settings)


def start_shadow(state_dir: Path, url: str, rules: str) -> str:
    """Make a harness candidate (`rules` injected) the default scenario's live shadow, through
    the one release path the flows use; returns its id."""
    from reef.deploy import rollout
    from reef.gate import Decision
    from reef.harness import Harness
    from reef.provenance import Provenance

    accepted = Decision(status="accepted", policy="always", test="bench", reason="bench", n=0)
    harness = Harness({"AGENTS.md": rules, "harness.json": '{"inject": true}'})
    with _chain(state_dir, url) as chain:
        scenario = chain.settings.server.default_scenario
        chain.store.ensure_scenario(scenario)
        head = chain.store.head_release(scenario)
        cand = chain.add_harness_candidate(head, harness, accepted, Provenance(recipe="bench"))
        return str(rollout.start(chain, cand).id)


def end_shadow(state_dir: Path, url: str) -> None:
    from reef.deploy import rollout

    with _chain(state_dir, url) as chain:
        scenario = chain.settings.server.default_scenario
        rollout.abort(chain, scenario, by="bench", reason="bench round over")


def shadow_counts(state_dir: Path) -> int:
    with sqlite3.connect(state_dir / "reef.db") as conn:
        return int(conn.execute("SELECT count(*) FROM shadow_records").fetchone()[0])


def shadow_arms(
    args: argparse.Namespace, echo_port: int, state_dir: Path, procs: list[subprocess.Popen[Any]]
) -> dict[str, Any]:
    """The user's latency at `--low` connections on a shadow-mode Reef without a live shadow
    candidate (off) and with one (on), alternately, `--shadow-rounds` rounds; each round starts
    a new candidate and aborts it after. Counts the copies stored while on."""
    env = {**SHADOW_ENV, "REEF_ROLLOUT__SHADOW__SAMPLE": f"{args.shadow_sample:g}"}
    reef, url, ready = start_reef(args, echo_port, state_dir, env)
    procs.append(reef)
    if not ready:
        return {"error": (state_dir / "reef.log").read_text()[-2000:]}
    print(f"shadow-mode reef serve on {url}; off vs on at {args.low} connection", flush=True)
    wrk(url, args.low, args.warmup)
    out: dict[str, Any] = {"off": [], "on": [], "env": env, "sample": args.shadow_sample}
    # off, on, on, off, off, on, ...: a load that drifts during the run weighs on both alike
    for i in range(args.shadow_rounds):
        for state in ("off", "on") if i % 2 == 0 else ("on", "off"):
            if state == "off":
                out["off"].append(measured(url, args.low, args.duration, reef.pid))
                continue
            start_shadow(state_dir, url, f"Be brief (round {i}).\n")
            time.sleep(2.5)  # the serving process sees the candidate after its cache's TTL
            wrk(url, args.low, args.warmup)
            before = shadow_counts(state_dir)
            on = measured(url, args.low, args.duration, reef.pid)
            on["shadow_records"] = shadow_counts(state_dir) - before
            out["on"].append(on)
            end_shadow(state_dir, url)
            time.sleep(2.5)
    off_p50 = statistics.median(r["p50_us"] for r in out["off"]) / 1e3
    on_p50 = statistics.median(r["p50_us"] for r in out["on"]) / 1e3
    out["p50_ms"] = {"off": round(off_p50, 3), "on": round(on_p50, 3)}
    out["added_p50_ms"] = round(on_p50 - off_p50, 3)
    out["ratio_p50"] = round(on_p50 / off_p50, 3)
    out["copies_per_request"] = round(
        sum(r["shadow_records"] for r in out["on"]) / max(sum(r["ok"] for r in out["on"]), 1), 3
    )
    out["added_p50_ok"] = out["added_p50_ms"] <= TARGET_SHADOW_ADDED_P50_MS
    return out


def quota_arms(
    args: argparse.Namespace, echo_port: int, procs: list[subprocess.Popen[Any]]
) -> dict[str, Any]:
    """The p50 at `--low` connections through a Reef whose token has no quota (off) and one
    whose token has quotas no call reaches (on), alternately, `--quota-rounds` rounds. Both
    authenticate the same token, so the difference is the limiter alone."""
    digest = hashlib.sha256(QUOTA_TOKEN.encode()).hexdigest()
    limits = {"requests_per_minute": 10**9, "tokens_per_minute": 10**12, "tokens_per_day": 10**12}
    arms: dict[str, tuple[subprocess.Popen[Any], str, Path]] = {}
    for state, quota in (("off", {}), ("on", {"quota": limits})):
        token = {"name": "bench", "sha256": digest, "admin": True, **quota}
        state_dir = Path(tempfile.mkdtemp(prefix=f"reef-bench-quota-{state}-"))
        env = {"REEF_AUTH__TOKENS": json.dumps([token])}
        reef, url, ready = start_reef(args, echo_port, state_dir, env)
        procs.append(reef)
        if not ready:
            return {"error": (state_dir / "reef.log").read_text()[-2000:]}
        arms[state] = (reef, url, state_dir)
    headers = (f"Authorization: Bearer {QUOTA_TOKEN}",)
    print(f"quota arms: off vs on at {args.low} connection", flush=True)
    out: dict[str, Any] = {"off": [], "on": [], "limits": limits}
    for _, url, _ in arms.values():
        wrk(url, args.low, args.warmup, headers)
    for i in range(args.quota_rounds):
        for state in ("off", "on") if i % 2 == 0 else ("on", "off"):
            reef, url, _ = arms[state]
            out[state].append(measured(url, args.low, args.duration, reef.pid, headers))
    for _, _, state_dir in arms.values():
        shutil.rmtree(state_dir, ignore_errors=True)
    off_p50 = statistics.median(r["p50_us"] for r in out["off"]) / 1e3
    on_p50 = statistics.median(r["p50_us"] for r in out["on"]) / 1e3
    out["p50_ms"] = {"off": round(off_p50, 3), "on": round(on_p50, 3)}
    out["added_p50_ms"] = round(on_p50 - off_p50, 3)
    out["limiter_in_process"] = limiter_cost_us()
    out["non_2xx"] = sum(r["non_2xx"] for r in out["off"] + out["on"])
    out["added_p50_ok"] = out["added_p50_ms"] <= TARGET_QUOTA_ADDED_P50_MS
    return out


def otlp_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--otlp",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure what OTLP span export adds (off vs on, --low connections)",
    )
    p.add_argument("--otlp-rounds", type=int, default=2, help="off/on rounds, alternated")


def print_otlp(result: dict[str, Any]) -> None:
    otlp = result.get("otlp")
    if otlp and "error" in otlp:
        print(f"\notlp: not measured: {otlp['error']}")
    elif otlp:
        print(
            f"\notlp export at {len(otlp['on'])}x{result['duration_s']:g}s, 1 conn: p50 "
            f"{otlp['p50_ms']['off']:.3f} ms off, {otlp['p50_ms']['on']:.3f} ms on: added "
            f"{otlp['added_p50_ms']:.3f} ms (target <= {TARGET_OTLP_ADDED_P50_MS:g} ms) "
            f"{'OK' if otlp['added_p50_ok'] else 'MISSED'}; {otlp['spans_received']} spans in "
            f"{otlp['exports']} exports ({otlp['spans_per_answered_call']:.2f} per answered "
            f"measured call, warm-ups included); non-2xx {otlp['non_2xx']}"
        )


class OTLPSink:
    """An OTLP/HTTP traces receiver in this process: answers every export 200 and counts the
    spans, decoding each request with opentelemetry-proto's ExportTraceServiceRequest."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        self.spans = 0
        self.requests = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                request = ExportTraceServiceRequest.FromString(body)
                sink.requests += 1
                sink.spans += sum(
                    len(scope.spans) for rs in request.resource_spans for scope in rs.scope_spans
                )
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def otlp_arms(
    args: argparse.Namespace, echo_port: int, procs: list[subprocess.Popen[Any]]
) -> dict[str, Any]:
    """The p50 at `--low` connections through a Reef without telemetry (off) and one exporting
    a span per call to an OTLP receiver here (on), alternately, `--otlp-rounds` rounds."""
    sys.path.insert(0, str(ROOT))
    sink = OTLPSink()
    arms: dict[str, tuple[subprocess.Popen[Any], str, Path]] = {}
    try:
        for state in ("off", "on"):
            env = {"REEF_TELEMETRY__OTLP_ENDPOINT": sink.url} if state == "on" else {}
            state_dir = Path(tempfile.mkdtemp(prefix=f"reef-bench-otlp-{state}-"))
            reef, url, ready = start_reef(args, echo_port, state_dir, env)
            procs.append(reef)
            if not ready:
                return {"error": (state_dir / "reef.log").read_text()[-2000:]}
            arms[state] = (reef, url, state_dir)
        print(f"otlp arms: off vs on at {args.low} connection", flush=True)
        out: dict[str, Any] = {"off": [], "on": []}
        for _, url, _ in arms.values():
            wrk(url, args.low, args.warmup)
        for i in range(args.otlp_rounds):
            for state in ("off", "on") if i % 2 == 0 else ("on", "off"):
                reef, url, _ = arms[state]
                out[state].append(measured(url, args.low, args.duration, reef.pid))
        time.sleep(2.0)  # the last export interval
        answered = sum(r["ok"] for r in out["on"])
        out["spans_received"] = sink.spans
        out["exports"] = sink.requests
        # every answered call of the on arm (its warm-up included) should have become a span
        out["spans_per_answered_call"] = round(sink.spans / max(answered, 1), 3)
    finally:
        sink.close()
        for _, _, state_dir in arms.values():
            shutil.rmtree(state_dir, ignore_errors=True)
    off_p50 = statistics.median(r["p50_us"] for r in out["off"]) / 1e3
    on_p50 = statistics.median(r["p50_us"] for r in out["on"]) / 1e3
    out["p50_ms"] = {"off": round(off_p50, 3), "on": round(on_p50, 3)}
    out["added_p50_ms"] = round(on_p50 - off_p50, 3)
    out["non_2xx"] = sum(r["non_2xx"] for r in out["off"] + out["on"])
    out["added_p50_ok"] = out["added_p50_ms"] <= TARGET_OTLP_ADDED_P50_MS
    return out


def limiter_cost_us(calls: int = 3000) -> dict[str, float]:
    """What the limiter itself costs a call, in this process (no HTTP, no scheduler noise):
    admission and the token count of one call on a SQLite store, as the API runs them (the
    ledger syncing in the background: `p50_us`), and with every call counted in the database
    (`database_p50_us`: the ledger never synced, as before its first sync or near a limit)."""
    import asyncio

    sys.path.insert(0, str(ROOT))
    from prometheus_client import CollectorRegistry

    from reef.api.quotas import QuotaGate
    from reef.settings import QuotaSettings, TokenSettings
    from reef.store.sql import open_store

    state = Path(tempfile.mkdtemp(prefix="reef-bench-limiter-"))
    store = open_store(f"sqlite:///{state / 'reef.db'}")
    store.migrate()
    quota = QuotaSettings(
        requests_per_minute=10**9, tokens_per_minute=10**12, tokens_per_day=10**12
    )
    token = TokenSettings(name="bench", sha256="0" * 64, quota=quota)
    usage = {"prompt_tokens": 20, "completion_tokens": 10}

    async def run(gate: QuotaGate) -> list[float]:
        took = []
        for i in range(calls):
            started = time.perf_counter()
            gate.hold(str(i), await gate.admit("bench", "default"))
            gate.spend(str(i), usage)
            took.append(time.perf_counter() - started)
            if i % 50 == 0:
                await asyncio.sleep(0.005)  # calls arrive over time: syncs run between them
        return sorted(took[calls // 5 :])  # after the warm-up

    def pct(took: list[float], q: float) -> float:
        return round(took[int(len(took) * q)] * 1e6, 1)

    try:
        exact = asyncio.run(run(QuotaGate((token,), store.quotas, CollectorRegistry())))
        gate = QuotaGate((token,), store.quotas, CollectorRegistry())
        gate.start()
        try:
            took = asyncio.run(run(gate))
        finally:
            gate.stop()
    finally:
        store.close()
        shutil.rmtree(state, ignore_errors=True)
    return {
        "p50_us": pct(took, 0.5),
        "p90_us": pct(took, 0.9),
        "database_p50_us": pct(exact, 0.5),
        "database_p90_us": pct(exact, 0.9),
    }


def finish(result: dict[str, Any], out: Path) -> int:
    """Print the table and the verdicts, and write the result (with its verdict) as JSON."""
    direct, reef = result["direct"], result["reef"]
    print_table(direct, reef)
    verdict = reef_verdict(direct, reef) if reef else {}
    print_arms(result)
    if "reef_error" in result:
        print(f"\nthrough Reef: not measured: {result['reef_error']}")
    if "profile" in result:
        print("\nReef process, py-spy self time (top 15):")
        for row in result["profile"]["self"][:15]:
            print(f"  {row['share'] * 100:5.1f}%  {row['function']}")
    result["verdict"] = verdict
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"upstream_overhead-{result['at'].replace(':', '')}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {path}")
    return 0


def print_table(direct: dict[str, Any], reef: dict[str, Any]) -> None:
    """One row per measured run: direct, then through Reef, at each connection count."""
    rows = []
    for conns in direct:
        d = direct[conns]
        rows.append(("direct", conns, d))
        if conns in reef:
            rows.append(("reef", conns, reef[conns]))
    print()
    print(
        f"{'target':8} {'conns':>5} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'non-2xx':>8} "
        f"{'records':>8} {'missing':>8} {'cpu us/req':>10} {'load':>5}"
    )
    for name, conns, r in rows:
        records = str(r.get("records", "-"))
        missing = str(r.get("records_missing", "-") if name == "reef" else "-")
        print(
            f"{name:8} {conns:>5} {r['rps']:>9.0f} {r['p50_us'] / 1e3:>8.2f} "
            f"{r['p99_us'] / 1e3:>8.2f} {r['non_2xx']:>8} {records:>8} {missing:>8} "
            f"{r['server_cpu_us_per_request']:>10.0f} {r['loadavg_1m']:>5.1f}"
        )


def reef_verdict(direct: dict[str, Any], reef: dict[str, Any]) -> dict[str, Any]:
    """The targets checked (added p50 at the fewest connections, recorded req/s at the most,
    every 200 durable) and the through-Reef / direct ratios, printed and returned."""
    low, high = min(reef, key=int), max(reef, key=int)
    added = (reef[low]["p50_us"] - direct[low]["p50_us"]) / 1e3
    added_p99 = (reef[low]["p99_us"] - direct[low]["p99_us"]) / 1e3
    recorded_rps = min(reef[high]["ok"], reef[high]["records"]) / (reef[high]["duration_us"] / 1e6)
    durable = all(
        r["records_missing"] == 0 and r["receipts_missing"] == 0 and r["non_2xx"] == 0
        for r in reef.values()
    )
    verdict = {
        "added_p50_ms": round(added, 3),
        "added_p50_ok": added <= TARGET_ADDED_P50_MS,
        "added_p99_ms": round(added_p99, 3),
        "added_p99_ok": added_p99 <= TARGET_ADDED_P99_MS,
        "recorded_rps": round(recorded_rps, 1),
        "recorded_rps_ok": recorded_rps >= TARGET_RECORDED_RPS,
        "every_200_durable": durable,
        "ratio_rps": {c: round(reef[c]["rps"] / direct[c]["rps"], 4) for c in reef},
        "ratio_p50": {c: round(reef[c]["p50_us"] / direct[c]["p50_us"], 2) for c in reef},
    }
    print()
    print(
        f"added p50 at {low} conn: {added:.2f} ms (target <= {TARGET_ADDED_P50_MS:g}) "
        f"{'OK' if verdict['added_p50_ok'] else 'MISSED'}"
    )
    print(
        f"added p99 at {low} conn: {added_p99:.2f} ms (target <= {TARGET_ADDED_P99_MS:g}) "
        f"{'OK' if verdict['added_p99_ok'] else 'MISSED'}"
    )
    print(
        f"recorded req/s at {high} conns: {recorded_rps:.0f} (target >= "
        f"{TARGET_RECORDED_RPS:g}) {'OK' if verdict['recorded_rps_ok'] else 'MISSED'}"
    )
    print(f"every 200 had a receipt and a durable record: {durable}")
    print(f"through-Reef / direct: req/s {verdict['ratio_rps']}, p50 {verdict['ratio_p50']}")
    return verdict


def print_arms(result: dict[str, Any]) -> None:
    """The quota and shadow arms' lines (or why they were not measured), when they ran."""
    quotas = result.get("quotas")
    if quotas and "error" in quotas:
        print(f"\nquotas: not measured: {quotas['error']}")
    elif quotas:
        limiter = quotas["limiter_in_process"]
        print(
            f"\nquotas at {len(quotas['on'])}x{result['duration_s']:g}s, 1 conn: p50 "
            f"{quotas['p50_ms']['off']:.3f} ms without, {quotas['p50_ms']['on']:.3f} ms with: "
            f"added {quotas['added_p50_ms']:.3f} ms (target <= {TARGET_QUOTA_ADDED_P50_MS:g} ms) "
            f"{'OK' if quotas['added_p50_ok'] else 'MISSED'}; non-2xx {quotas['non_2xx']}; "
            f"the limiter in-process: p50 {limiter['p50_us']:.1f} us, "
            f"p90 {limiter['p90_us']:.1f} us a call (every call in the database: p50 "
            f"{limiter['database_p50_us']:.1f} us, p90 {limiter['database_p90_us']:.1f} us)"
        )
    print_otlp(result)
    shadow = result.get("shadow")
    if shadow and "error" in shadow:
        print(f"\nshadow: not measured: {shadow['error']}")
    elif shadow:
        print(
            f"\nshadow (sample {shadow['sample']:g}) at {len(shadow['on'])}x"
            f"{result['duration_s']:g}s, 1 conn: user p50 "
            f"{shadow['p50_ms']['off']:.3f} ms off, {shadow['p50_ms']['on']:.3f} ms on: added "
            f"{shadow['added_p50_ms']:.3f} ms, ratio {shadow['ratio_p50']:.3f} (target <= "
            f"{TARGET_SHADOW_ADDED_P50_MS:g} ms) {'OK' if shadow['added_p50_ok'] else 'MISSED'}; "
            f"{shadow['copies_per_request']:.2f} copies stored per answered request"
        )


if __name__ == "__main__":
    sys.exit(main())
