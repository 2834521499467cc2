"""Benchmark: recorded requests/s of `reef serve` replicas sharing one Postgres, and what that
load costs Postgres (commits/s, rows per group commit).

Baseline: one replica; then N replicas on a fresh database, the same load generator (the
tiny model, max_tokens 2, each call reported through the next replica with a score and a
correction), a fixed duration after a warm-up. Each replica is a real `reef serve` process with
its embedded engine, registered in the engine registry, behind one admin token: the shape of
tests/scale/test_replicas.py without the training side.

Measured on the database: `pg_stat_database.xact_commit` delta over the window (every
transaction: the group commits, the reports, the reads), the records inserted, and the group
commits themselves: each record row's `xmin` is the transaction that inserted it, so rows per
group commit = records / distinct xmin.

    .venv/bin/python bench/replicas.py [--replicas 3] [--duration 20] [--threads 12] [--no-reports]
                                      [--postgres postgresql://root@127.0.0.1:5432/postgres]

Writes JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.store_commit import with_postgres
from reef.testing.fleet import Fleet, LoadGenerator, fleet_config

RESULTS = Path(__file__).resolve().parent / "results"
S = "bench"
# An idle backend sends its pending statistics within 10 s at the latest (Postgres 15's
# PGSTAT_IDLE_INTERVAL): read the counters only once the replicas' pooled connections have.
STATS_FLUSH_S = 11.0


def _counters(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """This database's commits so far (every transaction, the connection pools' pre-ping `;`
    included: one implicit transaction per checkout, no WAL), its records and reports, and the
    transactions that inserted them (one per group commit; one per report)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),"
        " (SELECT count(*) FROM records), (SELECT count(DISTINCT xmin::text) FROM records),"
        " (SELECT count(*) FROM reports), (SELECT count(DISTINCT xmin::text) FROM reports)"
    ).fetchone()
    assert row is not None
    keys = ("commits", "records", "record_txs", "reports", "report_txs")
    return dict(zip(keys, row, strict=True))


def run(n: int, url: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        config = fleet_config({"artifacts": {"url": str(Path(tmp) / "artifacts")}})
        fleet = Fleet(Path(tmp) / "fleet", n, config, {"REEF_STORE__DATABASE_URL": url})
        try:
            fleet.start()
            LoadGenerator(
                fleet.urls, S, threads=args.threads, requests=4 * args.threads
            ).start().join()
            plain = url.replace("postgresql+psycopg://", "postgresql://")
            with psycopg.connect(plain, autocommit=True) as conn:
                time.sleep(STATS_FLUSH_S)
                before = _counters(conn)
                generator = LoadGenerator(
                    fleet.urls,
                    S,
                    threads=args.threads,
                    duration_s=args.duration,
                    report=not args.no_reports,
                ).start()
                load = generator.join()
                time.sleep(STATS_FLUSH_S)
                after = _counters(conn)
                [row_bytes] = conn.execute(
                    "SELECT avg(pg_column_size(r.*))::int FROM records r"
                ).fetchone() or (0,)
        finally:
            fleet.stop()
    seconds = load.seconds
    acknowledged = len(load.all_receipts)
    delta = {k: after[k] - before[k] for k in after}
    commits = delta["commits"]
    return {
        "replicas": n,
        "threads": args.threads,
        "seconds": round(seconds, 1),
        "req_per_s": round(acknowledged / seconds, 1),
        "req_per_s_per_replica": [round(len(r) / seconds, 1) for r in load.receipts.values()],
        "reports_per_s": round(len(load.reported) / seconds, 1),
        "refused": len(load.refused),
        "pg_commits_per_s": round(commits / seconds, 1),
        "records": delta["records"],
        "group_commits": delta["record_txs"],
        "rows_per_group_commit": round(delta["records"] / max(1, delta["record_txs"]), 2),
        "commits_per_request": round(commits / max(1, acknowledged), 2),
        # the transactions that wrote: group commits of records, and each report's own
        "write_commits_per_s": round((delta["record_txs"] + delta["report_txs"]) / seconds, 1),
        "record_row_bytes": row_bytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load measured")
    parser.add_argument("--threads", type=int, default=12, help="concurrent clients in all")
    parser.add_argument(
        "--no-reports", action="store_true", help="chat calls only (no POST /reef/report)"
    )
    parser.add_argument("--postgres", default="postgresql://root@127.0.0.1:5432/postgres")
    args = parser.parse_args()

    results: list[dict[str, Any]] = []
    for n in sorted({1, args.replicas}):

        def measure(url: str, n: int = n) -> None:
            results.append(run(n, url, args))

        with_postgres(args.postgres, measure)
        print(json.dumps(results[-1]))
    base, top = results[0], results[-1]
    print(
        f"{top['replicas']} replicas vs 1: {top['req_per_s'] / base['req_per_s']:.2f}x req/s, "
        f"{top['pg_commits_per_s'] / max(1.0, base['pg_commits_per_s']):.2f}x Postgres commits/s"
    )
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = RESULTS / f"replicas-{stamp}.json"
    out.write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
