"""Retention: records and reports older than `store.retention_days`, moved to parquet in the
artifact store and then deleted from the database in short batches.

What stays in the database whatever its age:

- releases (the chain), candidates, jobs and consumption receipts: never touched;
- a record some report quotes that the loop's recipe (`reef.recipe`) has not consumed, unless
  its release is already too far behind the head for the loop to ever train on it
  (`reef.max_staleness`): a batch still waiting for its turn keeps its records until it is
  trained on. Records no report quotes are archived once old: feedback must arrive within the
  window;
- a report quoting any record still in the database.

How one scenario is archived: its records are walked oldest first (ids sort by creation time,
so the walk stops at the first id past the cutoff, on the (scenario, id) index) in batches of
`store.retention_batch`. Each batch is written as one parquet file under
`archive/<scenario>/records/<sha256 of the file>.parquet`, listed in this run's manifest
(`archive/<scenario>/manifests/<run id>/manifest.json`: key, sha256, row count, id and time
range), and only then deleted, in one transaction per batch: no lock is held for longer than
one batch's DELETE. The delete re-reads which reports quote the batch's records and keeps any record that
a report written since it was checked now quotes. Reports follow the same way once none of the
records they quote is left in the database.

Each run writes its own manifest, so archivers on several hosts never overwrite each other's
lists; at its end a run merges all manifests into one (`compact`). A crash between a file and its delete (or two archivers at once) can leave a row both in
the database and in a file, or in two files: readers take the database's copy first and each
id once (`archived_records`, `reef export --include-archive`, the dashboard's archive pages:
`archived_page`, `archived_record`).
"""

from __future__ import annotations

import hashlib
import io
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from reef.errors import NotFound, StoreError
from reef.records import Record, Report, new_id, utcnow
from reef.scenario_settings import learning_settings
from reef.store.base import Store
from reef.store.browse import id_at
from reef.store.records import RecordStore
from reef.store.rows import record_row

if TYPE_CHECKING:
    from reef.artifacts import ArtifactStore
    from reef.settings import Settings

log = logging.getLogger("reef.retention")

PREFIX = "archive"
MANIFEST = "manifest.json"

_TIME = pa.timestamp("us", tz="UTC")
# Every field of a record, losslessly: bodies and small JSON values as JSON text (key order
# kept, as the database keeps it), token data as lists.
RECORD_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("scenario", pa.string(), nullable=False),
        pa.field("created_at", _TIME, nullable=False),
        pa.field("route", pa.string(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("stream", pa.bool_(), nullable=False),
        pa.field("request", pa.string(), nullable=False),
        pa.field("response", pa.string(), nullable=False),
        pa.field("release_id", pa.string(), nullable=False),
        pa.field("prompt_token_ids", pa.list_(pa.int64())),
        pa.field("completion_token_ids", pa.list_(pa.int64())),
        pa.field("logprobs", pa.list_(pa.float64())),
        pa.field("timings", pa.string(), nullable=False),
        pa.field("tags", pa.string(), nullable=False),
        pa.field("session_id", pa.string()),
        pa.field("turn", pa.int64()),
        pa.field("parent_id", pa.string()),
        pa.field("state_hash", pa.string()),
        pa.field("idempotency_key", pa.string()),
        pa.field("topk", pa.string()),
    ]
)
_RECORD_JSON = ("request", "response", "timings", "tags", "topk")

REPORT_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("scenario", pa.string(), nullable=False),
        pa.field("created_at", _TIME, nullable=False),
        pa.field("references", pa.list_(pa.string()), nullable=False),
        pa.field("score", pa.float64()),
        pa.field("feedback", pa.string()),  # JSON text of a string or an object
        pa.field("metadata", pa.string(), nullable=False),
        pa.field("metrics", pa.string()),  # JSON text; absent from archives written before
    ]
)


@dataclass(frozen=True)
class ArchiveFile:
    """One parquet file of the archive, as a manifest lists it."""

    key: str
    kind: str  # "records" | "reports"
    sha256: str
    rows: int
    first_id: str
    last_id: str
    oldest: str  # ISO 8601 created_at of its oldest row
    newest: str


@dataclass
class Archived:
    """What one run did to one scenario."""

    scenario: str
    cutoff: datetime
    records: int = 0  # deleted from the database (and in the archive)
    reports: int = 0
    kept: int = 0  # old records kept because a batch still needs them
    files: list[ArchiveFile] = field(default_factory=list)


def cutoff(settings: Settings, now: datetime | None = None) -> datetime | None:
    """The creation time before which rows are archived; None when retention is off."""
    days = settings.store.retention_days
    if days is None:
        return None
    return (now or utcnow()) - timedelta(days=days)


def apply_retention(
    store: Store, settings: Settings, artifacts: ArtifactStore, now: datetime | None = None
) -> list[Archived]:
    """Archive every scenario by the settings' window (nothing when `store.retention_days` is
    unset). Called by `reef gc` and, every hour, by the evolve worker."""
    before = cutoff(settings, now)
    if before is None:
        return []
    out = []
    for scenario in store.list_scenarios():
        own = learning_settings(settings, store, scenario.name).reef
        try:
            out.append(
                archive_scenario(
                    store,
                    artifacts,
                    scenario.name,
                    before,
                    recipe=own.recipe,
                    max_staleness=own.max_staleness,
                    batch=settings.store.retention_batch,
                )
            )
        except NotFound:  # deleted while we were at it
            continue
    return out


def archive_scenario(
    store: Store,
    artifacts: ArtifactStore,
    scenario: str,
    before: datetime,
    *,
    recipe: str,
    max_staleness: int | None,
    batch: int = 5000,
) -> Archived:
    """Archive then delete the scenario's records and reports created before `before`, except
    what a pending batch of `recipe` still needs (module docstring)."""
    run = _Run(artifacts, scenario, before)
    done = Archived(scenario, before, files=run.files)
    chain = store.list_releases(scenario)
    seq_of = {r.id: r.seq for r in chain}
    head = store.head_release(scenario).seq
    consumed = store.consumed_record_ids(scenario, recipe)

    def needed(rec: Record, quoted: bool) -> bool:
        if not quoted or rec.id in consumed:
            return False
        seq = seq_of.get(rec.release_id)
        if seq is None:  # not on the chain: keep, the loop would say why
            return True
        return max_staleness is None or head - seq <= max_staleness

    stop = id_at("rec", before)
    after: str | None = None
    while True:
        page = store.list_records(scenario, after=after, limit=batch)
        old = [r for r in page if r.id < stop and r.created_at < before]
        if old:
            quoting = store.quoting_reports(scenario, [r.id for r in old])
            go = [r for r in old if not needed(r, r.id in quoting)]
            done.kept += len(old) - len(go)
            if go:
                run.write("records", _record_table(go), go[0].id, go[-1].id)
                deleted = store.delete_records(
                    scenario, [r.id for r in go], {r.id: quoting.get(r.id, ()) for r in go}
                )
                done.records += len(deleted)
                done.kept += len(go) - len(deleted)
        if len(page) < batch or page[-1].id >= stop:
            break
        after = page[-1].id

    after = None
    while True:  # reports: few next to records, so every one is looked at
        page_r = store.list_reports(scenario, after=after, limit=batch)
        old_r = [r for r in page_r if r.created_at < before]
        if old_r:
            alive = store.existing_record_ids(scenario, {x for r in old_r for x in r.references})
            go_r = [r for r in old_r if not alive.intersection(r.references)]
            if go_r:
                run.write("reports", _report_table(go_r), go_r[0].id, go_r[-1].id)
                done.reports += store.delete_reports(scenario, go_r)
        if len(page_r) < batch:
            break
        after = page_r[-1].id
    if run.files:
        compact(artifacts, scenario)
        log.info(
            "archived %d records and %d reports of '%s' older than %s (%d kept for a batch)",
            done.records,
            done.reports,
            scenario,
            before.isoformat(),
            done.kept,
        )
    return done


class _Run:
    """One archiving run of one scenario: its files and its manifest."""

    def __init__(self, artifacts: ArtifactStore, scenario: str, before: datetime):
        self.artifacts = artifacts
        self.scenario = scenario
        self.before = before
        self.id = new_id("arc")
        self.files: list[ArchiveFile] = []

    def write(self, kind: str, table: pa.Table, first_id: str, last_id: str) -> None:
        """The file, then the manifest that lists it: a file no manifest lists is never read,
        and the rows it holds are deleted only after both are written."""
        buf = io.BytesIO()
        pq.write_table(table, buf, compression="zstd")
        data = buf.getvalue()
        digest = hashlib.sha256(data).hexdigest()
        key = f"{PREFIX}/{self.scenario}/{kind}/{digest}.parquet"
        self.artifacts.put_bytes(key, data)
        times = table.column("created_at")
        self.files.append(
            ArchiveFile(
                key=key,
                kind=kind,
                sha256=digest,
                rows=table.num_rows,
                first_id=first_id,
                last_id=last_id,
                oldest=pc.min(times).as_py().isoformat(),
                newest=pc.max(times).as_py().isoformat(),
            )
        )
        _put_manifest(self.artifacts, self.scenario, self.id, self.files, self.before)


def _manifests(scenario: str) -> str:
    return f"{PREFIX}/{scenario}/manifests"


def _put_manifest(
    artifacts: ArtifactStore,
    scenario: str,
    run: str,
    files: Sequence[ArchiveFile],
    before: datetime | None,
) -> None:
    body = {
        "scenario": scenario,
        "run": run,
        "cutoff": before.isoformat() if before else None,
        "files": [asdict(f) for f in files],
    }
    artifacts.put_bytes(
        f"{_manifests(scenario)}/{run}/{MANIFEST}", orjson.dumps(body, option=orjson.OPT_INDENT_2)
    )


def compact(artifacts: ArtifactStore, scenario: str) -> None:
    """Merge the scenario's manifests into one, so readers (the dashboard, export) read one or
    two files however many runs there were. Safe beside other archivers without any lock: a
    manifest is removed only after a new one listing all its files is written, so a file stays
    listed whoever removes what."""
    runs = _manifest_runs(artifacts, scenario)
    if len(runs) < 2:
        return
    try:
        files = _read_manifests(artifacts, scenario, runs)
    except NotFound:  # another archiver is compacting: its merge lists these
        return
    _put_manifest(artifacts, scenario, new_id("arc"), files, None)
    for run in runs:
        artifacts.delete_prefix(f"{_manifests(scenario)}/{run}")


def _json(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


def _record_table(records: Sequence[Record]) -> pa.Table:
    rows = []
    for r in records:
        row = record_row(r)  # field by field: asdict would deep-copy every body
        for name in _RECORD_JSON:
            row[name] = _json(row[name])
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=RECORD_SCHEMA)


def _report_table(reports: Sequence[Report]) -> pa.Table:
    rows = [
        {
            "id": r.id,
            "scenario": r.scenario,
            "created_at": r.created_at,
            "references": list(r.references),
            "score": r.score,
            "feedback": _json(r.feedback),
            "metadata": _json(r.metadata),
            "metrics": _json(r.metrics) if r.metrics else None,
        }
        for r in reports
    ]
    return pa.Table.from_pylist(rows, schema=REPORT_SCHEMA)


# reading the archive ----------------------------------------------------------------------
def _manifest_runs(artifacts: ArtifactStore, scenario: str) -> list[str]:
    prefix = _manifests(scenario) + "/"
    return [
        k.removeprefix(prefix).removesuffix(f"/{MANIFEST}")
        for k in artifacts.list_keys(_manifests(scenario))
        if k.endswith(f"/{MANIFEST}")
    ]


def _read_manifests(
    artifacts: ArtifactStore, scenario: str, runs: Sequence[str]
) -> list[ArchiveFile]:
    seen: dict[str, ArchiveFile] = {}
    for run in runs:
        body = orjson.loads(artifacts.get_bytes(f"{_manifests(scenario)}/{run}/{MANIFEST}"))
        for f in body["files"]:
            seen.setdefault(f["key"], ArchiveFile(**f))
    return list(seen.values())


def manifest(artifacts: ArtifactStore, scenario: str) -> list[ArchiveFile]:
    """Every file the scenario's archive lists (all manifests), each once, oldest run first."""
    for _ in range(5):
        try:
            return _read_manifests(artifacts, scenario, _manifest_runs(artifacts, scenario))
        except NotFound:  # compacted between the listing and the read: list again
            continue
    raise StoreError(f"the archive manifests of '{scenario}' kept changing while read")


def archived_counts(artifacts: ArtifactStore, scenario: str) -> dict[str, int]:
    """Rows in the archive by kind ({"records": n, "reports": m}); a row written twice (see
    the module docstring) counts twice."""
    counts = {"records": 0, "reports": 0}
    for f in manifest(artifacts, scenario):
        counts[f.kind] = counts.get(f.kind, 0) + f.rows
    return counts


def read_file(artifacts: ArtifactStore, f: ArchiveFile) -> pa.Table:
    """One archive file, checked against the sha256 its manifest gives."""
    data = artifacts.get_bytes(f.key)
    if hashlib.sha256(data).hexdigest() != f.sha256:
        raise StoreError(f"archive file {artifacts.uri(f.key)} does not match its manifest")
    return pq.read_table(io.BytesIO(data))


class ArchiveFiles:
    """Archive files fetched and checked once, kept as tables (least recently used first out,
    at most `max_bytes` of them): a file is named by its content (its manifest gives its
    sha256), so one verified once is the same file at every later read. The dashboard's
    archive pages read through one; without it each view fetched and hashed whole files."""

    def __init__(self, artifacts: ArtifactStore, max_bytes: int = 256 * 1024 * 1024):
        self.artifacts = artifacts
        self.max_bytes = max_bytes
        self._tables: OrderedDict[tuple[str, str], pa.Table] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # pages read from worker threads

    def read(self, f: ArchiveFile) -> pa.Table:
        slot = (f.key, f.sha256)
        with self._lock:
            hit = self._tables.get(slot)
            if hit is not None:
                self._tables.move_to_end(slot)
                return hit
        table = read_file(self.artifacts, f)
        with self._lock:
            if slot not in self._tables and table.nbytes <= self.max_bytes:
                self._tables[slot] = table
                self._bytes += table.nbytes
                while self._bytes > self.max_bytes:
                    _, old = self._tables.popitem(last=False)
                    self._bytes -= old.nbytes
        return table


def _reader(artifacts: ArtifactStore, files: ArchiveFiles | None) -> Any:
    return files.read if files is not None else lambda f: read_file(artifacts, f)


def _loads(text: str | None) -> Any:
    return None if text is None else orjson.loads(text)


def _record_of(row: dict[str, Any]) -> Record:
    """A record back from its archive row (the inverse of `_record_table`)."""
    for name in _RECORD_JSON:
        row[name] = _loads(row[name])
    return Record(**row)


def archived_records(
    store: RecordStore, artifacts: ArtifactStore, scenario: str
) -> Iterator[list[Record]]:
    """The archived records of the scenario, a file at a time, each id once and none that is
    still in the database (which the database's pages give)."""
    seen: set[str] = set()
    for f in manifest(artifacts, scenario):
        if f.kind != "records":
            continue
        rows = read_file(artifacts, f).to_pylist()
        live = store.existing_record_ids(scenario, [row["id"] for row in rows])
        page = []
        for row in rows:
            if row["id"] in live or row["id"] in seen:
                continue
            seen.add(row["id"])
            page.append(_record_of(row))
        if page:
            yield page


@dataclass(frozen=True)
class ArchivePage:
    """One page of archived records, newest first (the dashboard's archive view)."""

    records: list[Record]
    next_before: str | None  # the cursor of the next (older) page; None at the end
    files_read: int  # archive files this page read (each checked against its sha256)


def archived_page(
    store: RecordStore,
    artifacts: ArtifactStore,
    scenario: str,
    before: str | None = None,
    limit: int = 50,
    files: ArchiveFiles | None = None,
) -> ArchivePage:
    """The `limit` newest archived records with ids below `before` (any when None), each id
    once and none still in the database, as `archived_records` reads them. Ids sort by
    creation time and each file's manifest entry gives its id range, so a page reads only the
    files that can hold its rows: newest range first, until no unread file can reach into the
    page. An id cursor, not an offset, so each record shows on exactly one page."""
    listed = sorted(
        (
            f
            for f in manifest(artifacts, scenario)
            if f.kind == "records" and (before is None or f.first_id < before)
        ),
        key=lambda f: f.last_id,
        reverse=True,
    )
    found: dict[str, dict[str, Any]] = {}
    read, table_of = 0, _reader(artifacts, files)
    for f in listed:
        if len(found) >= limit and f.last_id < sorted(found, reverse=True)[limit - 1]:
            break  # this file and every later one lie wholly below the page
        rows = [r for r in table_of(f).to_pylist() if before is None or r["id"] < before]
        read += 1
        live = store.existing_record_ids(scenario, [r["id"] for r in rows])
        for row in rows:
            if row["id"] not in live:
                found.setdefault(row["id"], row)
    ids = sorted(found, reverse=True)
    page = [_record_of(found[i]) for i in ids[:limit]]
    more = len(ids) > limit or read < len(listed)
    return ArchivePage(page, page[-1].id if page and more else None, read)


def archived_record(
    artifacts: ArtifactStore, scenario: str, record_id: str, files: ArchiveFiles | None = None
) -> Record:
    """One archived record by id, read from the files whose id range holds it; NotFound when
    no file does."""
    read = _reader(artifacts, files)
    for f in manifest(artifacts, scenario):
        if f.kind != "records" or not f.first_id <= record_id <= f.last_id:
            continue
        table = read(f)
        rows = table.filter(pc.equal(table.column("id"), record_id)).to_pylist()
        if rows:
            return _record_of(rows[0])
    raise NotFound(f"no archived record '{record_id}' in scenario '{scenario}'")


def archived_reports_for(
    artifacts: ArtifactStore,
    scenario: str,
    record_ids: Iterable[str],
    files: ArchiveFiles | None = None,
) -> dict[str, list[Report]]:
    """The archived reports quoting each of `record_ids`, oldest first (reports are few next
    to records: every report file is read)."""
    out: dict[str, list[Report]] = {i: [] for i in record_ids}
    for rep in archived_reports(artifacts, scenario, files):
        for rid in dict.fromkeys(rep.references):
            if rid in out:
                out[rid].append(rep)
    for reps in out.values():
        reps.sort(key=lambda r: (r.created_at, r.id))
    return out


def archived_reports(
    artifacts: ArtifactStore, scenario: str, files: ArchiveFiles | None = None
) -> Iterator[Report]:
    """The archived reports of the scenario, each id once."""
    seen: set[str] = set()
    read = _reader(artifacts, files)
    for f in manifest(artifacts, scenario):
        if f.kind != "reports":
            continue
        for row in read(f).to_pylist():
            if row["id"] in seen:
                continue
            seen.add(row["id"])
            yield Report(
                id=row["id"],
                scenario=row["scenario"],
                created_at=row["created_at"],
                references=tuple(row["references"]),
                score=row["score"],
                feedback=_loads(row["feedback"]),
                metadata=_loads(row["metadata"]),
                metrics=_loads(row.get("metrics")) or {},
            )
