"""Materialize throughput: experience → parquet snapshot vs a plain SELECT of the same rows.

One run per backend (SQLite in a temp dir, Postgres in a fresh database): writes N records
with `store.add_records` in batches of 1,000 and a scored report on 90 % of them (bulk-inserted
with the receipt rows the store writes beside each report: setup, not measured), then in the
same process measures

- select:      SELECT every record and report row of the scenario (rows fetched, not decoded
               into Records): the floor any reader pays;
- collect:     reef.experience.collect (paged reads, joins, checks) for kind "scored";
- materialize: collect + reef.datasets.materialize (table, content hash, parquet, write).

and reports records/s and materialize/select as a ratio. Prints a table, writes JSON to
bench/results/.

    .venv/bin/python bench/materialize.py                       # 100k, SQLite and Postgres
    .venv/bin/python bench/materialize.py --n 20000 --backends sqlite
    .venv/bin/python bench/materialize.py --postgres-url postgresql://root@127.0.0.1:5432/postgres

The numbers come from a two-core machine; the ratio is what to watch.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

# pyarrow imports pandas at its first table (0.2-0.6 s here). The evolve worker has it loaded
# before any run (its preload imports Great Expectations, which imports pandas); so does this.
import pandas  # noqa: E402, F401
from sqlalchemy import insert, select  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from reef.artifacts import LocalArtifacts  # noqa: E402
from reef.datasets import materialize  # noqa: E402
from reef.experience import collect  # noqa: E402
from reef.records import Record, Report, new_id  # noqa: E402
from reef.store import tables  # noqa: E402
from reef.store.sql import SQLStore, open_store  # noqa: E402

RESULTS = HERE / "results"
SCENARIO = "bench"
BATCH = 1000


def _record(i: int, release_id: str, at: datetime) -> Record:
    return Record(
        id=new_id("rec"),
        scenario=SCENARIO,
        created_at=at,
        route="chat.completions",
        model="tiny",
        stream=False,
        request={
            "model": "tiny",
            "messages": [
                {"role": "system", "content": "Answer in at most five words."},
                {"role": "user", "content": f"Question number {i}: what colour is the sky?"},
            ],
            "max_tokens": 16,
        },
        response={
            "id": f"chatcmpl-{i}",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Blue, mostly."}}],
            "usage": {"prompt_tokens": 24, "completion_tokens": 4},
        },
        release_id=release_id,
        prompt_token_ids=list(range(1, 25)),
        completion_token_ids=[17, 18, 19, 2],
        logprobs=[-0.25, -1.5, -0.1, -0.01],
        timings={"total_s": 0.1},
    )


def fill(store: SQLStore, n: int) -> float:
    base = store.ensure_scenario(SCENARIO).head_release_id
    start = time.perf_counter()
    at = datetime.now(UTC)
    for lo in range(0, n, BATCH):
        recs = [_record(i, base, at) for i in range(lo, min(n, lo + BATCH))]
        store.add_records(recs)
        rows, refs = [], []
        for k, rec in enumerate(recs):
            if (lo + k) % 10 == 9:
                continue  # awaiting feedback
            rep = Report(
                id=new_id("rep"),
                scenario=SCENARIO,
                created_at=at + timedelta(seconds=1),
                references=(rec.id,),
                score=float((lo + k) % 3 - 1),
            )
            rows.append(
                {
                    "id": rep.id,
                    "scenario": SCENARIO,
                    "created_at": rep.created_at,
                    "references": list(rep.references),
                    "score": rep.score,
                    "feedback": None,
                    "metadata": {},
                    "content_hash": rep.content_hash,
                }
            )
            # what the store's add_report writes beside each report: the receipt it quotes
            refs.append(
                {
                    "scenario": SCENARIO,
                    "record_id": rec.id,
                    "report_id": rep.id,
                    "release_id": rec.release_id,
                    "score": rep.score,
                }
            )
        with store.engine.begin() as conn:
            conn.execute(insert(tables.reports), rows)
            conn.execute(insert(tables.report_references), refs)
        print(f"\r  wrote {min(n, lo + BATCH)}/{n} records", end="", flush=True)
    print()
    return time.perf_counter() - start


def plain_select(store: SQLStore) -> tuple[float, int]:
    start = time.perf_counter()
    n = 0
    with store.engine.connect() as conn:
        for t in (tables.records, tables.reports):
            q = select(t).where(t.c.scenario == SCENARIO).order_by(t.c.id)
            result = conn.execution_options(stream_results=True, yield_per=BATCH).execute(q)
            for part in result.partitions():
                n += len(part)
    return time.perf_counter() - start, n


def run_backend(name: str, url: str, n: int) -> dict[str, Any]:
    print(f"{name}: {make_url(url).render_as_string(hide_password=True)}", flush=True)
    store = open_store(url)
    store.migrate()
    try:
        fill_s = fill(store, n)
        select_s, rows = plain_select(store)
        start = time.perf_counter()
        exp = collect(store, SCENARIO, "scored", recipe="sft")
        collect_s = time.perf_counter() - start
        with tempfile.TemporaryDirectory() as tmp:
            artifacts = LocalArtifacts(tmp)
            start = time.perf_counter()
            exp2 = collect(store, SCENARIO, "scored", recipe="sft")
            snap = materialize(exp2, "scored", artifacts)
            materialize_s = time.perf_counter() - start
            size = len(artifacts.get_bytes(snap.key))
    finally:
        store.close()
    return {
        "records": n,
        "samples": len(exp.samples),
        "awaiting_feedback": exp.awaiting_feedback,
        "select_rows": rows,
        "fill_s": round(fill_s, 2),
        "select_s": round(select_s, 3),
        "collect_s": round(collect_s, 3),
        "materialize_s": round(materialize_s, 3),
        "select_records_per_s": round(n / select_s),
        "collect_records_per_s": round(n / collect_s),
        "materialize_records_per_s": round(n / materialize_s),
        "ratio_materialize_vs_select": round(select_s / materialize_s, 4),
        "parquet_bytes": size,
        "content_hash": snap.content_hash,
    }


def _postgres_db(admin_url: str) -> tuple[str, Any]:
    import psycopg

    name = f"reef_bench_mat_{uuid.uuid4().hex[:8]}"
    admin = psycopg.connect(admin_url, autocommit=True)
    admin.execute(f'CREATE DATABASE "{name}"')
    url = make_url(admin_url).set(drivername="postgresql+psycopg", database=name)
    return url.render_as_string(hide_password=False), (admin, name)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=100_000, help="records (default 100000)")
    p.add_argument("--backends", default="sqlite,postgres")
    p.add_argument(
        "--postgres-url",
        default=os.environ.get(
            "REEF_TEST_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/postgres"
        ),
        help="admin URL; a throwaway database is created and dropped",
    )
    args = p.parse_args(argv)
    result: dict[str, Any] = {
        "bench": "materialize",
        "at": datetime.now(UTC).strftime("%Y-%m-%dT%H%M%S%z"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "backends": {},
    }
    for name in args.backends.split(","):
        if name == "sqlite":
            with tempfile.TemporaryDirectory() as tmp:
                result["backends"][name] = run_backend(name, f"sqlite:///{tmp}/reef.db", args.n)
        elif name == "postgres":
            url, (admin, db) = _postgres_db(args.postgres_url)
            try:
                result["backends"][name] = run_backend(name, url, args.n)
            finally:
                admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
                admin.close()
        else:
            raise SystemExit(f"unknown backend {name}")
    return finish(result)


def finish(result: dict[str, Any]) -> int:
    print()
    print(
        f"{'backend':9} {'records':>8} {'samples':>8} {'select rec/s':>13} {'collect rec/s':>14} "
        f"{'materialize rec/s':>18} {'mat/select':>10} {'parquet MB':>10}"
    )
    for name, r in result["backends"].items():
        print(
            f"{name:9} {r['records']:>8} {r['samples']:>8} {r['select_records_per_s']:>13} "
            f"{r['collect_records_per_s']:>14} {r['materialize_records_per_s']:>18} "
            f"{r['ratio_materialize_vs_select']:>10.3f} {r['parquet_bytes'] / 1e6:>10.2f}"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"materialize-{result['at']}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
