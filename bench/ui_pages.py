"""Dashboard page times at scale: every /ui page of a scenario with N records (default 100,000,
spread over the last 3 days, with sessions of 4 turns, tags, and R reports), served by the app
`reef serve` builds (tiny model, in this process) over loopback HTTP.

The store is filled directly (setup, not measured): records in batches of 1,000, reports through
`Store.add_report` (which writes their report_references rows). Each page is then fetched
`--repeat` times; the median and the worst are printed. The budget is 300 ms server time per
page; the times here include the loopback HTTP round trip, so they are an upper bound.

    .venv/bin/python bench/ui_pages.py                   # 100k records, SQLite
    .venv/bin/python bench/ui_pages.py --n 20000 --repeat 3
    .venv/bin/python bench/ui_pages.py --db /tmp/ui-100k.db   # fill once, time again later
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import httpx  # noqa: E402

from reef.cli.testing import InProcessReef  # noqa: E402
from reef.records import Record, Report, new_id  # noqa: E402
from reef.store.browse import id_at  # noqa: E402
from reef.store.sql import SQLStore, open_store  # noqa: E402

SCENARIO = "bench"
BATCH = 1000
WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
]


def _id(prefix: str, at: datetime) -> str:
    """A record id of time `at` (what new_id would have given then), unique by its random tail."""
    base = id_at(prefix, at)
    return base[: len(prefix) + 11] + new_id(prefix)[len(prefix) + 11 :]


def fill(store: SQLStore, n: int, n_reports: int) -> float:
    start = time.perf_counter()
    base = store.ensure_scenario(SCENARIO).head_release_id
    now = datetime.now(UTC)
    span = timedelta(days=3).total_seconds()
    stride = max(1, n // max(1, n_reports))
    quoted: list[str] = []
    for lo in range(0, n, BATCH):
        recs = []
        for i in range(lo, min(n, lo + BATCH)):
            at = now - timedelta(seconds=span * (1 - i / n))
            turn = i % 4
            words = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(12))
            recs.append(
                Record(
                    id=_id("rec", at),
                    scenario=SCENARIO,
                    created_at=at,
                    route="chat.completions",
                    model="tiny",
                    stream=False,
                    request={"messages": [{"role": "user", "content": f"question {i}: {words}"}]},
                    response={
                        "choices": [{"message": {"role": "assistant", "content": f"answer {i}"}}]
                    },
                    release_id=base,
                    completion_token_ids=list(range(16)),
                    logprobs=[-0.1 * k for k in range(16)],
                    timings={"server_ms": 20.0 + i % 7},
                    tags={"user": f"u{i % 50}"},
                    session_id=f"ses_{i // 4:08d}",
                    turn=turn,
                )
            )
        store.add_records(recs)
        quoted += [r.id for k, r in enumerate(recs, lo) if k % stride == 0]
        print(f"\r  wrote {min(n, lo + BATCH)}/{n} records", end="", flush=True)
    print()
    for k, rid in enumerate(quoted[:n_reports]):
        store.add_report(
            Report(
                id=new_id("rpt"),
                scenario=SCENARIO,
                created_at=now,
                references=(rid,),
                score=float(k % 3) / 2,
                feedback="fine" if k % 2 else None,
            )
        )
        if k % 1000 == 0:
            print(f"\r  wrote {k}/{n_reports} reports", end="", flush=True)
    print()
    return time.perf_counter() - start


def pages(n: int) -> dict[str, str]:
    s = f"/ui/s/{SCENARIO}"
    middle = id_at("rec", datetime.now(UTC) - timedelta(days=1, hours=12))
    return {
        "overview": "/ui",
        "records (newest)": f"{s}/records",
        "records (page in the middle)": f"{s}/records?before={middle}",
        "records: text search, rare": f"{s}/records?q=question+{n - 17}%3A",
        "records: text search, none": f"{s}/records?q=zzzz-not-there",
        "records: has feedback": f"{s}/records?feedback=yes",
        "records: no feedback": f"{s}/records?feedback=no",
        "records: score >= 1": f"{s}/records?min_score=1",
        "records: tag": f"{s}/records?tag=user%3Du7",
        "records: release": f"{s}/records?release=__BASE__",
        "records: time range": f"{s}/records?since=2000-01-01T00:00&until=2100-01-01T00:00",
        "session": f"{s}/sessions/ses_{(n // 4) // 2:08d}",
        "releases": f"{s}/releases",
        "candidates": f"{s}/candidates",
        "learning curve": f"{s}/curves",
        "jobs": f"{s}/jobs",
        "readiness fragment": f"{s}/readiness",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--reports", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--db", type=Path, help="keep the filled SQLite file here (reused when it exists)"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="reef-ui-bench-") as tmp:
        db = args.db or Path(tmp) / "reef.db"
        url = f"sqlite:///{db.resolve()}"
        fresh = not db.exists()
        store = open_store(url)
        store.migrate()
        if fresh:
            took = fill(store, args.n, args.reports)
            print(f"filled {args.n} records, {args.reports} reports in {took:.1f} s")
        base = store.head_release(SCENARIO).id
        store.close()
        os.environ.setdefault("REEF_LOG_LEVEL", "WARNING")
        with InProcessReef(Path(tmp) / "state", store={"database_url": url}) as srv:
            print(f"{'page':32} {'median ms':>10} {'worst ms':>10}  bytes")
            with httpx.Client(base_url=srv.url, timeout=60) as http:
                for name, path in pages(args.n).items():
                    path = path.replace("__BASE__", base)
                    times = []
                    size = 0
                    for _ in range(args.repeat):
                        t0 = time.perf_counter()
                        r = http.get(path)
                        times.append((time.perf_counter() - t0) * 1000)
                        r.raise_for_status()
                        size = len(r.content)
                    print(f"{name:32} {statistics.median(times):10.1f} {max(times):10.1f}  {size}")


if __name__ == "__main__":
    main()
