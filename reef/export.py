"""Export: a scenario's records as session turns with their feedback and release ids, to
.jsonl, .parquet or a Hugging Face `datasets` directory (read page by page)."""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from reef.errors import ConfigError
from reef.experience import (
    PAGE_SIZE,
    completion_text,
    completion_tool_calls,
    dumps,
    pages_of_records,
    prompt_messages,
    reports_by_record,
)
from reef.records import Record, Report
from reef.store.base import Store

if TYPE_CHECKING:
    from reef.artifacts import ArtifactStore

Format = Literal["jsonl", "parquet", "hf"]

# One row per record (a session turn); group by session_id and sort by turn for sessions.
SCHEMA = pa.schema(
    [
        pa.field("record_id", pa.string(), nullable=False),
        pa.field("scenario", pa.string(), nullable=False),
        # session_id: the stitched session, or the record's own id when it was not stitched.
        pa.field("session_id", pa.string(), nullable=False),
        pa.field("turn", pa.int32()),
        pa.field("parent_id", pa.string()),
        pa.field("created_at", pa.string(), nullable=False),  # ISO 8601, UTC
        pa.field("route", pa.string(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("release_id", pa.string(), nullable=False),
        pa.field("messages", pa.string(), nullable=False),  # OpenAI chat form, JSON text
        pa.field("completion", pa.string(), nullable=False),
        # JSON text: the answer's tool calls in OpenAI chat form ([] when it called none); the
        # tool results an agent sent back are `tool` messages of the next turn's `messages`
        pa.field("tool_calls", pa.string(), nullable=False),
        pa.field("prompt_token_ids", pa.list_(pa.int32())),
        pa.field("completion_token_ids", pa.list_(pa.int32())),
        pa.field("logprobs", pa.list_(pa.float64())),
        pa.field(
            "feedback",
            pa.list_(
                pa.struct(
                    [
                        pa.field("report_id", pa.string()),
                        pa.field("score", pa.float64()),
                        pa.field("feedback", pa.string()),  # JSON text (a string or an object)
                        pa.field("references", pa.list_(pa.string())),
                        pa.field("created_at", pa.string()),
                        # JSON text: a judgment's source, votes, raw answers and judge
                        pa.field("metadata", pa.string()),
                        pa.field("metrics", pa.string()),  # JSON text of the named metrics
                    ]
                )
            ),
            nullable=False,
        ),
    ]
)


SUFFIXES: dict[str, Format] = {".jsonl": "jsonl", ".parquet": "parquet"}


def format_for(path: Path, fmt: str | None = None) -> Format:
    """`fmt` when given, else by `path`'s extension: .jsonl, .parquet, or none (or an existing
    directory) for a Hugging Face dataset directory. Any other extension is a ConfigError: a
    file named `x.csv` must not silently become a directory of Arrow files."""
    if fmt in ("jsonl", "parquet", "hf"):
        return fmt  # type: ignore[return-value]
    if path.suffix in SUFFIXES:
        return SUFFIXES[path.suffix]
    if not path.suffix or path.is_dir():
        return "hf"
    raise ConfigError(
        f"cannot export to {path}: '{path.suffix}' is not a format reef export writes; it takes "
        ".jsonl, .parquet, or a path without an extension (a Hugging Face datasets directory); "
        "or name the format with --format jsonl|parquet|hf"
    )


def _row(rec: Record, reports: list[Report]) -> dict[str, Any]:
    return {
        "record_id": rec.id,
        "scenario": rec.scenario,
        "session_id": rec.session_id or rec.id,
        "turn": rec.turn,
        "parent_id": rec.parent_id,
        "created_at": rec.created_at.isoformat(),
        "route": rec.route,
        "model": rec.model,
        "release_id": rec.release_id,
        "messages": dumps(prompt_messages(rec)),
        "completion": completion_text(rec),
        "tool_calls": dumps(completion_tool_calls(rec)),
        "prompt_token_ids": rec.prompt_token_ids,
        "completion_token_ids": rec.completion_token_ids,
        "logprobs": rec.logprobs,
        "feedback": [
            {
                "report_id": r.id,
                "score": r.score,
                "feedback": dumps(r.feedback) if r.feedback is not None else None,
                "references": list(r.references),
                "created_at": r.created_at.isoformat(),
                "metadata": dumps(r.metadata),
                "metrics": dumps(r.metrics) if r.metrics else None,
            }
            for r in sorted(reports, key=lambda r: (r.created_at, r.id))
        ],
    }


def pages(
    store: Store,
    scenario: str,
    page_size: int = PAGE_SIZE,
    *,
    archive: ArtifactStore | None = None,
) -> Iterator[list[dict[str, Any]]]:
    """The export's rows, a page of records at a time. With `archive` (the artifact store),
    the records and reports retention moved there come first (reef.retention), then the
    database's."""
    store.get_scenario(scenario)  # NotFound before anything is written
    feedback = reports_by_record(store, scenario, page_size)
    if archive is not None:
        from reef.retention import archived_records, archived_reports

        live = {rep.id for reps in feedback.values() for rep in reps}
        for rep in archived_reports(archive, scenario):
            if rep.id not in live:
                for rid in dict.fromkeys(rep.references):
                    feedback.setdefault(rid, []).append(rep)
        for page in archived_records(store, archive, scenario):
            yield [_row(rec, feedback.get(rec.id, [])) for rec in page]
    for page in pages_of_records(store, scenario, page_size):
        yield [_row(rec, feedback.get(rec.id, [])) for rec in page]


def export(
    store: Store,
    scenario: str,
    path: Path,
    fmt: Format,
    *,
    page_size: int = PAGE_SIZE,
    progress: bool = True,
    archive: ArtifactStore | None = None,
) -> int:
    """Write the scenario to `path`; returns the number of rows (records) written. With
    `archive`, archived records too (see `pages`)."""
    from tqdm import tqdm

    bar = tqdm(unit=" records", desc=f"exporting {scenario}", disable=not progress or None)
    n = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        # Written aside and moved into place: a failed export leaves no half file behind.
        target = Path(tmp) / ("rows.jsonl" if fmt == "jsonl" else "rows.parquet")
        writer: pq.ParquetWriter | None = None
        jsonl: io.BufferedWriter | None = None
        try:
            if fmt == "jsonl":
                jsonl = open(target, "wb")  # noqa: SIM115 - closed below
            else:
                writer = pq.ParquetWriter(target, SCHEMA, compression="zstd")
            for rows in pages(store, scenario, page_size, archive=archive):
                if jsonl is not None:
                    jsonl.write(b"".join(orjson.dumps(r) + b"\n" for r in rows))
                elif writer is not None:
                    writer.write_table(pa.Table.from_pylist(rows, schema=SCHEMA))
                n += len(rows)
                bar.update(len(rows))
        finally:
            bar.close()
            if jsonl is not None:
                jsonl.close()
            if writer is not None:
                writer.close()
        if fmt == "hf":
            import datasets

            ds = datasets.Dataset.from_parquet(str(target), cache_dir=str(Path(tmp) / "cache"))
            assert isinstance(ds, datasets.Dataset)
            ds.save_to_disk(str(path))
        else:
            os.replace(target, path)
    return n
