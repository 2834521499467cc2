"""Status latency: how long readiness (GET /reef/scenarios/{s}/status, the /metrics gauges, the
evolve worker's check) takes for a scenario with many records and few reports.

Fills a store with N records (default 100,000) in batches of 1,000, R reports (default 300,
each quoting one record, every tenth quoting two of a session) and consumption receipts for a
tenth of the reported records (setup, not measured), then times in the same process:

- before: `collect` as it was at commit cce00f2 (copied below, verbatim): pages through every
          record of the scenario to keep the reported ones and count those awaiting feedback;
- after:  `reef.readiness.readiness` as the status route calls it: the quoted records read by
          id, awaiting feedback counted by one aggregate query.

Both must give the same numbers (checked). Prints median and best of `--repeat` runs per path.

    .venv/bin/python bench/status_latency.py                      # 100k records, SQLite
    .venv/bin/python bench/status_latency.py --backends sqlite,postgres --n 20000
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from sqlalchemy.engine import make_url  # noqa: E402

from reef.experience import (  # noqa: E402
    PAGE_SIZE,
    Experience,
    Rule,
    _build,
    _order,
    _pairs,
    pages_of_records,
    pick,
    reports_by_record,
    tokens_continue,
)
from reef.readiness import readiness  # noqa: E402
from reef.records import Consumption, Record, Report, new_id  # noqa: E402
from reef.samples import Sample, check_kind  # noqa: E402
from reef.settings import load_settings  # noqa: E402
from reef.store.base import Store  # noqa: E402
from reef.store.sql import SQLStore, open_store  # noqa: E402

SCENARIO = "bench"
BATCH = 1000


# the baseline: reef/experience.py `collect` at commit cce00f2, verbatim (its grouping and its
# walk over every record are functions here, their statements unchanged) --------------------
def collect_before(
    store: Store,
    scenario: str,
    kind: str,
    *,
    recipe: str,
    max_staleness: int | None = None,
    rule: Rule = "latest",
    page_size: int = PAGE_SIZE,
) -> Experience:
    kind = check_kind(kind)
    chain = store.list_releases(scenario)
    scenario_row = store.get_scenario(scenario)
    seq_of = {r.id: r.seq for r in chain}
    head_seq = seq_of.get(scenario_row.head_release_id, max(seq_of.values(), default=0))
    consumed = store.consumed_record_ids(scenario, recipe)

    by_record = reports_by_record(store, scenario, page_size)
    groups = _groups_before(by_record)

    wanted, awaiting = _every_record_before(store, scenario, page_size, by_record, consumed)
    del by_record

    dropped: Counter[str] = Counter()
    candidates: list[tuple[list[Record], Report, float, list[Report], int]] = []
    for key, reps in groups.items():
        records = [wanted[rid] for rid in key if rid in wanted]
        if len(records) != len(key):
            dropped["missing_record"] += 1
            continue
        records = _order(records)
        if any(r.id in consumed for r in records):
            dropped["consumed"] += 1
            continue
        report, score = pick(reps, rule)
        if score is None or (isinstance(score, float) and math.isnan(score)):
            dropped["no_score"] += 1
            continue
        if any(r.release_id not in seq_of for r in records):
            dropped["unknown_release"] += 1
            continue
        staleness = head_seq - min(seq_of[r.release_id] for r in records)
        if max_staleness is not None and staleness > max_staleness:
            dropped["stale"] += 1
            continue
        if kind == "rollout" and any(
            r.prompt_token_ids is None or r.completion_token_ids is None for r in records
        ):
            dropped["no_token_ids"] += 1
            continue
        has_ids = all(r.prompt_token_ids is not None for r in records)
        if len(records) > 1 and has_ids and not tokens_continue(records):
            dropped["token_mismatch"] += 1
            continue
        candidates.append((records, report, float(score), reps, staleness))

    samples: list[Sample]
    if kind == "preference":
        samples = _pairs(candidates, dropped)
    else:
        samples = [_build(kind, *c) for c in candidates]
    samples.sort(key=lambda s: s.sample_id)
    return Experience(
        scenario=scenario,
        kind=kind,
        recipe=recipe,
        samples=tuple(samples),
        dropped=dropped,
        awaiting_feedback=awaiting,
        head_seq=head_seq,
        max_staleness=max_staleness,
    )


def _groups_before(by_record: dict[str, list[Report]]) -> dict[tuple[str, ...], list[Report]]:
    groups: dict[tuple[str, ...], list[Report]] = {}
    for reps in by_record.values():
        for rep in reps:
            key = tuple(sorted(set(rep.references)))
            lst = groups.setdefault(key, [])
            if all(r.id != rep.id for r in lst):
                lst.append(rep)
    return groups


def _every_record_before(
    store: Store,
    scenario: str,
    page_size: int,
    by_record: dict[str, list[Report]],
    consumed: set[str],
) -> tuple[dict[str, Record], int]:
    """The cost this baseline measures: every record of the scenario read, page by page, to
    keep the reported ones and count those awaiting feedback."""
    wanted: dict[str, Record] = {}
    awaiting = 0
    for page in pages_of_records(store, scenario, page_size):
        for rec in page:
            if rec.id in by_record:
                wanted[rec.id] = rec
            elif rec.id not in consumed:
                awaiting += 1
    return wanted, awaiting


# the data -------------------------------------------------------------------------------
def _record(i: int, release_id: str, at: datetime, **fields: Any) -> Record:
    values: dict[str, Any] = {
        "id": new_id("rec"),
        "scenario": SCENARIO,
        "created_at": at,
        "route": "chat.completions",
        "model": "tiny",
        "stream": False,
        "request": {
            "model": "tiny",
            "messages": [
                {"role": "system", "content": "Answer in at most five words."},
                {"role": "user", "content": f"Question number {i}: what colour is the sky?"},
            ],
            "max_tokens": 16,
        },
        "response": {
            "id": f"chatcmpl-{i}",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Blue, mostly."}}],
            "usage": {"prompt_tokens": 24, "completion_tokens": 4},
        },
        "release_id": release_id,
        "prompt_token_ids": list(range(1, 25)),
        "completion_token_ids": [17, 18, 19, 2],
        "logprobs": [-0.25, -1.5, -0.1, -0.01],
        "timings": {"total_s": 0.1},
    }
    values.update(fields)
    return Record(**values)


def fill(store: SQLStore, n: int, n_reports: int) -> float:
    start = time.perf_counter()
    base = store.ensure_scenario(SCENARIO).head_release_id
    at = datetime.now(UTC)
    quoted: list[Record] = []
    stride = max(1, n // max(1, n_reports))
    for lo in range(0, n, BATCH):
        recs = [_record(i, base, at) for i in range(lo, min(n, lo + BATCH))]
        store.add_records(recs)
        quoted += [r for i, r in enumerate(recs, lo) if i % stride == 0]
        print(f"\r  wrote {min(n, lo + BATCH)}/{n} records", end="", flush=True)
    print()
    quoted = quoted[:n_reports]
    for k, rec in enumerate(quoted):
        refs = (rec.id,)
        if k % 10 == 5 and k + 1 < len(quoted):
            refs = (rec.id, quoted[k + 1].id)  # a trajectory report (dropped: no session turns)
        store.add_report(
            Report(
                id=new_id("rep"),
                scenario=SCENARIO,
                created_at=at + timedelta(milliseconds=k),
                references=refs,
                score=float(k % 3 - 1),
            )
        )
    store.add_consumptions(
        [Consumption(SCENARIO, "sft", r.id, "batch_0", at) for r in quoted[::10]]
    )
    return time.perf_counter() - start


def _time(fn: Any, repeat: int) -> tuple[list[float], Any]:
    times, out = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return times, out


def run_backend(name: str, url: str, n: int, n_reports: int, repeat: int) -> dict[str, Any]:
    print(f"{name}: {make_url(url).render_as_string(hide_password=True)}", flush=True)
    store = open_store(url)
    store.migrate()
    loop = load_settings(reef={"recipe": "sft", "batch_size": 32}).reef
    try:
        fill_s = fill(store, n, n_reports)
        before_t, before = _time(
            lambda: collect_before(store, SCENARIO, "scored", recipe="sft", max_staleness=0),
            repeat,
        )
        after_t, after = _time(lambda: readiness(store, SCENARIO, loop), repeat)
    finally:
        store.close()
    same = (len(before.samples), before.dropped, before.awaiting_feedback) == (
        after.eligible,
        after.dropped,
        after.awaiting_feedback,
    )
    assert same, f"the paths disagree: {before} vs {after}"
    out = {
        "records": n,
        "reports": n_reports,
        "eligible": after.eligible,
        "awaiting_feedback": after.awaiting_feedback,
        "dropped": dict(after.dropped),
        "fill_s": round(fill_s, 1),
        "before_median_ms": round(statistics.median(before_t) * 1000, 1),
        "before_best_ms": round(min(before_t) * 1000, 1),
        "after_median_ms": round(statistics.median(after_t) * 1000, 1),
        "after_best_ms": round(min(after_t) * 1000, 1),
    }
    out["speedup"] = round(out["before_median_ms"] / max(out["after_median_ms"], 1e-3), 1)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=100_000, help="records (default 100000)")
    p.add_argument("--reports", type=int, default=300, help="reports (default 300)")
    p.add_argument("--repeat", type=int, default=5, help="timed runs per path (default 5)")
    p.add_argument("--backends", default="sqlite", help="sqlite, postgres, or both")
    p.add_argument(
        "--postgres-url",
        default=os.environ.get(
            "REEF_TEST_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/postgres"
        ),
        help="admin URL; a throwaway database is created and dropped",
    )
    args = p.parse_args(argv)
    rows = []
    for name in args.backends.split(","):
        if name == "sqlite":
            with tempfile.TemporaryDirectory() as tmp:
                url = f"sqlite:///{tmp}/reef.db"
                rows.append((name, run_backend(name, url, args.n, args.reports, args.repeat)))
        elif name == "postgres":
            import psycopg

            db = f"reef_bench_status_{uuid.uuid4().hex[:8]}"
            admin = psycopg.connect(args.postgres_url, autocommit=True)
            admin.execute(f'CREATE DATABASE "{db}"')
            try:
                url = make_url(args.postgres_url).set(drivername="postgresql+psycopg", database=db)
                rows.append(
                    (
                        name,
                        run_backend(
                            name,
                            url.render_as_string(hide_password=False),
                            args.n,
                            args.reports,
                            args.repeat,
                        ),
                    )
                )
            finally:
                admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
                admin.close()
        else:
            p.error(f"unknown backend {name!r}")
    print()
    print("| backend | records | reports | before ms (median / best) | after ms (median / best) |")
    print("|---|---|---|---|---|")
    for name, r in rows:
        print(
            f"| {name} | {r['records']:,} | {r['reports']} | "
            f"{r['before_median_ms']:,} / {r['before_best_ms']:,} | "
            f"{r['after_median_ms']:,} / {r['after_best_ms']:,} |"
        )
    for name, r in rows:
        print(name, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
