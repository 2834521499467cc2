"""Retention (reef.retention) on SQLite and Postgres: old records and reports go to parquet in
the artifact store and out of the database; what a pending batch needs stays; releases stay;
the manifest's hashes hold; `reef export` reads the same rows back."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from reef.artifacts import ArtifactStore, LocalArtifacts
from reef.cli.main import main as reef_cli
from reef.export import pages
from reef.records import Consumption, Record, Release, Report, new_id
from reef.retention import (
    archive_scenario,
    archived_counts,
    archived_records,
    manifest,
    read_file,
)
from reef.store.sql import SQLStore, open_store

S = "support"
NOW = datetime(2026, 12, 1, tzinfo=UTC)
CUTOFF = NOW - timedelta(days=30)
_CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"


def _id_at(prefix: str, at: datetime) -> str:
    """An id as reef.records.new_id would have made it at `at` (ids sort by creation time)."""
    n = int(at.timestamp() * 1000) << 80 | int.from_bytes(os.urandom(10), "big")
    chars = []
    for _ in range(26):
        n, r = divmod(n, 32)
        chars.append(_CROCKFORD[r])
    return f"{prefix}_{''.join(reversed(chars))}"


def _record(i: int, at: datetime, release_id: str) -> Record:
    return Record(
        id=_id_at("rec", at),
        scenario=S,
        created_at=at,
        route="chat.completions",
        model="tiny",
        stream=i % 7 == 0,
        request={"model": "tiny", "messages": [{"role": "user", "content": f"question {i}"}]},
        response={"choices": [{"index": 0, "message": {"role": "assistant", "content": f"a{i}"}}]},
        release_id=release_id,
        prompt_token_ids=[1, 2, i % 1000],
        completion_token_ids=[5, 6],
        logprobs=[-0.5, -0.25],
        timings={"total_s": 0.01},
        tags={"n": str(i % 3)},
        session_id=None if i % 2 else f"ses_{i}",
        turn=None if i % 2 else 0,
        topk={"k": 1, "ids": [[5], [6]], "logprobs": [[-0.5], [-0.25]]} if i % 5 == 0 else None,
    )


@dataclass
class Filled:
    cutoff: datetime
    records: list[Record]
    consumed: list[str]  # old, reported, trained on: archived
    pending: list[str]  # old, reported on the head, not trained on: kept
    stale: list[str]  # old, reported, too far behind the head: archived
    recent: list[str]  # inside the window: kept


def fill(store: SQLStore, n: int, now: datetime = NOW) -> Filled:
    """`n` records of scenario S, nine in ten more than 30 days older than `now`, a few of them
    reported (and some of those consumed), the rest never reported; bulk-inserted in large
    batches."""
    cutoff = now - timedelta(days=30)
    base = store.ensure_scenario(S).head_release_id
    head = store.publish_release(
        Release(
            id=new_id("rel"),
            scenario=S,
            seq=0,
            parent_id=base,
            kind="adapter",
            created_at=now,
            operation="training",
        )
    )
    old_span = timedelta(days=60).total_seconds()
    records = []
    for i in range(n):
        if i % 10 == 9:
            at = now - timedelta(seconds=i % 86_400)  # recent: inside the window
        else:
            at = cutoff - timedelta(seconds=1 + old_span * i / n)
        # a tenth of the old records were served by the head, the rest by the base release
        records.append(_record(i, at, head.id if i % 10 == 3 else base))
    for i in range(0, n, 20_000):
        store.add_records(records[i : i + 20_000])
    old = [r for r in records if r.created_at < cutoff]
    on_head = [r for r in old if r.release_id == head.id]
    on_base = [r for r in old if r.release_id == base]
    k = max(2, n // 500)
    consumed, pending, stale = on_head[:k], on_head[k : 2 * k], on_base[:k]
    reported = consumed + pending + stale
    for j, rec in enumerate(reported):
        at = rec.created_at + timedelta(milliseconds=1)
        feedback: Any = {"correction": f"fix {j}"} if j % 2 else "too long"
        store.add_report(
            Report(
                id=f"rep-{j}",
                scenario=S,
                created_at=at,
                references=(rec.id,),
                score=float(j % 2),
                feedback=feedback,
                metadata={"j": j},
            )
        )
    # one report on two records (a trajectory): both consumed, so both archived with it
    pair = consumed[:2]
    store.add_report(
        Report(
            id="rep-pair",
            scenario=S,
            created_at=cutoff - timedelta(days=1),
            references=tuple(r.id for r in pair),
            score=1.0,
        )
    )
    store.add_consumptions(
        [Consumption(S, "sft", r.id, "batch-1", now - timedelta(days=40)) for r in consumed]
    )
    return Filled(
        cutoff=cutoff,
        records=records,
        consumed=[r.id for r in consumed],
        pending=[r.id for r in pending],
        stale=[r.id for r in stale],
        recent=[r.id for r in records if r.created_at >= cutoff],
    )


def _export_rows(store: SQLStore, archive: ArtifactStore | None) -> dict[str, dict[str, Any]]:
    return {row["record_id"]: row for page in pages(store, S, archive=archive) for row in page}


def _check(store: SQLStore, artifacts: LocalArtifacts, filled: Filled, batch: int) -> None:
    releases = store.list_releases(S)
    before = _export_rows(store, None)
    assert len(before) == len(filled.records)

    t0 = time.perf_counter()
    done = archive_scenario(store, artifacts, S, CUTOFF, recipe="sft", max_staleness=0, batch=batch)
    took = time.perf_counter() - t0
    n_old = len(filled.records) - len(filled.recent)
    print(f"archived {done.records} of {n_old} old records in {took:.1f} s ({batch} per batch)")

    # everything old went but the pending batch; the window and the chain are untouched
    assert done.records == n_old - len(filled.pending)
    assert done.kept == len(filled.pending)
    left = {r.id for page in _all(store) for r in page}
    assert left == set(filled.pending) | set(filled.recent)
    assert store.list_releases(S) == releases
    # reports: those on archived records went, those on the pending batch stayed
    reports = {r.id for r in store.list_reports(S, limit=10**6)}
    assert reports == {f"rep-{j}" for j in range(len(filled.consumed), 2 * len(filled.consumed))}
    assert done.reports == len(filled.consumed) + len(filled.stale) + 1

    # the manifest lists every file with the sha256 of its bytes
    files = manifest(artifacts, S)
    assert sum(f.rows for f in files if f.kind == "records") == done.records
    assert sum(f.rows for f in files if f.kind == "reports") == done.reports
    for f in files:
        data = artifacts.get_bytes(f.key)
        assert hashlib.sha256(data).hexdigest() == f.sha256
        assert f.key.endswith(f"/{f.sha256}.parquet")
        assert read_file(artifacts, f).num_rows == f.rows
    assert archived_counts(artifacts, S) == {"records": done.records, "reports": done.reports}

    # export reads back exactly the rows it wrote before, feedback included
    after = _export_rows(store, artifacts)
    assert after == before
    assert len(_export_rows(store, None)) == len(left)

    # a second run finds nothing more to do
    again = archive_scenario(
        store, artifacts, S, CUTOFF, recipe="sft", max_staleness=0, batch=batch
    )
    assert (again.records, again.reports, again.files) == (0, 0, [])

    # once the pending batch is trained on, its records and reports follow
    store.add_consumptions([Consumption(S, "sft", rid, "batch-2", NOW) for rid in filled.pending])
    last = archive_scenario(store, artifacts, S, CUTOFF, recipe="sft", max_staleness=0, batch=batch)
    assert last.records == len(filled.pending) and last.kept == 0
    assert store.list_reports(S) == []
    assert _export_rows(store, artifacts) == before


def _all(store: SQLStore) -> Iterator[list[Record]]:
    from reef.experience import pages_of_records

    return pages_of_records(store, S, 5000)


def test_retention_archives_old_rows_and_keeps_what_a_batch_needs(
    store: SQLStore, tmp_path: Path
) -> None:
    filled = fill(store, 3000)
    _check(store, LocalArtifacts(tmp_path / "artifacts"), filled, batch=400)


@pytest.mark.slow
def test_retention_at_100k_records(store: SQLStore, tmp_path: Path) -> None:
    t0 = time.perf_counter()
    filled = fill(store, 100_000)
    print(f"filled 100k records in {time.perf_counter() - t0:.1f} s")
    _check(store, LocalArtifacts(tmp_path / "artifacts"), filled, batch=5000)


def test_a_report_written_after_the_check_keeps_its_record(store: SQLStore) -> None:
    """The delete re-reads who quotes each record: feedback that arrived since retention
    decided a record was not needed keeps it."""
    fill(store, 20)
    old = [r for r in next(iter(_all(store))) if r.created_at < CUTOFF]
    quoted, unquoted = old[0], old[1]
    store.add_report(Report(id="late", scenario=S, created_at=NOW, references=(quoted.id,)))
    deleted = store.delete_records(S, [quoted.id, unquoted.id], {})
    assert deleted == {unquoted.id}
    assert store.existing_record_ids(S, [quoted.id, unquoted.id]) == {quoted.id}


def test_a_tampered_archive_file_is_refused(store: SQLStore, tmp_path: Path) -> None:
    fill(store, 50)
    artifacts = LocalArtifacts(tmp_path / "artifacts")
    archive_scenario(store, artifacts, S, CUTOFF, recipe="sft", max_staleness=0, batch=10)
    f = manifest(artifacts, S)[0]
    data = bytearray(artifacts.get_bytes(f.key))
    artifacts.put_bytes(f.key, bytes(data[:-1]) + bytes([data[-1] ^ 1]))
    with pytest.raises(Exception, match="does not match its manifest"):
        list(archived_records(store, artifacts, S))


def test_rows_left_in_the_database_by_a_crash_are_read_once(
    store: SQLStore, tmp_path: Path
) -> None:
    """A file written but its delete never done (a crash between them): readers take the
    database's copy and do not repeat it."""
    filled = fill(store, 100)
    artifacts = LocalArtifacts(tmp_path / "artifacts")
    before = _export_rows(store, None)

    class Crashing(SQLStore):
        def delete_records(self, *args: Any, **kwargs: Any) -> set[str]:
            return set()  # the process died before the delete

    crashed = Crashing(store.engine)
    archive_scenario(crashed, artifacts, S, CUTOFF, recipe="sft", max_staleness=0, batch=30)
    assert _export_rows(store, artifacts) == before
    archive_scenario(store, artifacts, S, CUTOFF, recipe="sft", max_staleness=0, batch=30)
    assert _export_rows(store, artifacts) == before
    assert len(filled.records) == len(before)


def test_reef_gc_archives_and_reef_export_reads_it_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    store = open_store(f"sqlite:///{state / 'reef.db'}")
    store.migrate()
    filled = fill(store, 200, now=datetime.now(UTC))
    store.close()
    monkeypatch.setenv("REEF_STORE__RETENTION_DAYS", "30")
    assert reef_cli(["gc", "--state-dir", str(state)]) == 0
    out = capsys.readouterr().out
    assert f"reef gc: {S}: archived" in out

    plain, full = tmp_path / "live.jsonl", tmp_path / "all.jsonl"
    assert (
        reef_cli(
            ["export", "--scenario", S, "--output", str(plain), "--state-dir", str(state), "-q"]
        )
        == 0
    )
    assert (
        reef_cli(
            [
                "export",
                "--scenario",
                S,
                "--output",
                str(full),
                "--state-dir",
                str(state),
                "-q",
                "--include-archive",
            ]
        )
        == 0
    )
    live = [orjson.loads(line) for line in plain.read_text().splitlines()]
    everything = [orjson.loads(line) for line in full.read_text().splitlines()]
    assert len(everything) == len(filled.records)
    assert len(live) < len(everything)
    assert {r["record_id"] for r in everything} == {r.id for r in filled.records}


def test_the_records_page_counts_what_retention_archived(tmp_path: Path) -> None:
    import httpx

    from reef.artifacts import open_artifacts
    from reef.cli.testing import InProcessReef
    from reef.testing.traffic import traffic

    with InProcessReef(tmp_path / "state", store={"retention_days": 30}) as srv:
        traffic(srv, "kept", 3, max_tokens=2)
        page = httpx.get(f"{srv.url}/ui/s/kept/records").text
        assert "archived by retention" not in page
        store = open_store(srv.settings.database_url)
        try:
            soon = datetime.now(UTC) + timedelta(seconds=1)  # everything so far is "old"
            archive_scenario(
                store,
                open_artifacts(srv.settings.artifacts_url),
                "kept",
                soon,
                recipe="sft",
                max_staleness=0,
            )
        finally:
            store.close()
        page = httpx.get(f"{srv.url}/ui/s/kept/records").text
        assert "3 records and 0 reports archived by retention" in page
        assert "reef export --include-archive" in page
