"""Benchmark: recorded requests/s, one transaction per record vs. group commit.

Runs on SQLite (a temporary file) and on Postgres (a temporary database, dropped after).
Each record is the size of a small chat exchange with token ids and log-probs.

    .venv/bin/python bench/store_commit.py [-n 3000] [--writers 16] [--window-ms 0] [--repeat 3]
                                           [--postgres postgresql://root@127.0.0.1/postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
from sqlalchemy.engine import make_url

from reef.records import Record, new_id, utcnow
from reef.store.commits import GroupCommitter
from reef.store.sql import SQLStore, open_store


def make_records(n: int, release_id: str) -> list[Record]:
    request = {
        "model": "smollm2",
        "messages": [
            {"role": "system", "content": "You answer in at most five words. " * 4},
            {"role": "user", "content": "What is the capital of France, and why is it there?"},
        ],
        "max_tokens": 64,
        "temperature": 0.7,
    }
    response = {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Paris, by the Seine."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 120, "completion_tokens": 40, "total_tokens": 160},
    }
    return [
        Record(
            id=new_id("rec"),
            scenario="bench",
            created_at=utcnow(),
            route="chat.completions",
            model="smollm2",
            stream=False,
            request=request,
            response=response,
            release_id=release_id,
            prompt_token_ids=list(range(1000, 1120)),
            completion_token_ids=list(range(2000, 2040)),
            logprobs=[-0.123456789 * (i % 7) for i in range(40)],
            timings={"ttft_s": 0.012, "total_s": 0.4},
            tags={"bench": "store_commit"},
        )
        for _ in range(n)
    ]


def one_per_transaction(store: SQLStore, records: list[Record], writers: int) -> float:
    """`writers` threads, each committing its share one record per transaction."""
    shares = [records[i::writers] for i in range(writers)]
    start = time.perf_counter()

    def write(share: list[Record]) -> None:
        for r in share:
            store.add_records([r])

    threads = [threading.Thread(target=write, args=(s,)) for s in shares]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(records) / (time.perf_counter() - start)


def group_commit(
    store: SQLStore, records: list[Record], writers: int, window_ms: float
) -> tuple[float, GroupCommitter]:
    """`writers` asyncio tasks (concurrent requests), each awaiting `add` for its share."""

    async def main() -> tuple[float, GroupCommitter]:
        committer = GroupCommitter(store, window_ms=window_ms)
        await committer.start()

        async def write(share: list[Record]) -> None:
            for r in share:
                await committer.add(r)

        start = time.perf_counter()
        await asyncio.gather(*(write(records[i::writers]) for i in range(writers)))
        rate = len(records) / (time.perf_counter() - start)
        await committer.aclose()
        return rate, committer

    return asyncio.run(main())


def run(name: str, url: str, n: int, writers: int, window_ms: float, repeat: int) -> None:
    store = open_store(url, pool_size=writers)
    try:
        store.migrate()
        head = store.ensure_scenario("bench").head_release_id
        store.add_records(make_records(50, head))  # warm up pool and caches
        # Alternating runs, median of each: the machine is shared and its load drifts.
        baselines: list[float] = []
        grouped_runs: list[tuple[float, GroupCommitter]] = []
        for _ in range(repeat):
            baselines.append(one_per_transaction(store, make_records(n, head), writers))
            grouped_runs.append(group_commit(store, make_records(n, head), writers, window_ms))
    finally:
        store.close()
    baseline = statistics.median(baselines)
    grouped, committer = sorted(grouped_runs, key=lambda run: run[0])[len(grouped_runs) // 2]
    mean_batch = committer.records / max(committer.batches, 1)
    print(f"{name:8s} one per transaction, {writers} threads: {baseline:9.0f} records/s")
    print(
        f"{name:8s} group commit, {writers} writers:        {grouped:9.0f} records/s "
        f"({committer.batches} commits, mean batch {mean_batch:.1f}, "
        f"largest {committer.largest_batch})"
    )
    print(f"{name:8s} ratio: {grouped / baseline:.1f}x (medians of {len(baselines)} runs)")


def with_postgres(admin_url: str, body: Callable[[str], None]) -> None:
    name = f"reef_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            url = make_url(admin_url).set(drivername="postgresql+psycopg", database=name)
            body(url.render_as_string(hide_password=False))
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=3000, help="records per measurement")
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--window-ms", type=float, default=0.0)
    parser.add_argument("--postgres", default="postgresql://root@127.0.0.1:5432/postgres")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (median)")
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    knobs = (args.n, args.writers, args.window_ms, args.repeat)

    with tempfile.TemporaryDirectory() as tmp:
        run("sqlite", f"sqlite:///{Path(tmp) / 'reef.db'}", *knobs)
    if not args.no_postgres:
        with_postgres(args.postgres, lambda url: run("postgres", url, *knobs))


if __name__ == "__main__":
    main()
