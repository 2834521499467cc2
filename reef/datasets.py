"""Dataset snapshots: experience as a parquet table per kind, named by the hash of its content.

Every kind's table has an explicit Arrow schema (below, column by column). Messages are kept
as canonical JSON text (sorted keys) because their content is heterogeneous (a string, or a
list of text/image parts, tool calls): a recipe parses them with `json.loads`.

A snapshot is identified by sha256 over its canonical row content (each row as sorted-key
JSON, in sample-id order), not over the parquet bytes, so the same experience gets the same
id whichever pyarrow version or compression wrote it. It lives at
`datasets/<scenario>/<kind>/<hash>.parquet` in the artifact store and is written once: a
snapshot whose hash is already there is not written again. `datasets/<scenario>/latest.json`
names the scenario's most recent materialization (readiness reports it).
"""

from __future__ import annotations

import hashlib
import io
import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from reef import gcpause
from reef.artifacts import ArtifactStore
from reef.errors import BadRequest, NotFound
from reef.experience import Experience, dumps
from reef.records import utcnow
from reef.samples import (
    Kind,
    PreferenceSample,
    RolloutSample,
    Sample,
    ScoredSample,
    TrajectorySample,
    check_kind,
)

_COMMON = [
    # sample_id: the record id for a one-receipt sample; "traj_…"/"pair_…" (a hash of the
    # record ids) for a trajectory or a preference pair. Unique within a snapshot.
    pa.field("sample_id", pa.string(), nullable=False),
    # scenario: the one scenario every row comes from.
    pa.field("scenario", pa.string(), nullable=False),
    # record_ids: the records in the sample, in turn order (preference: chosen, rejected).
    pa.field("record_ids", pa.list_(pa.string()), nullable=False),
    # release_id: the release that produced the (last / chosen) answer.
    pa.field("release_id", pa.string(), nullable=False),
    # staleness: head seq − seq of the oldest release in the sample, when collected.
    pa.field("staleness", pa.int32(), nullable=False),
    # report_ids: every report on these receipts, oldest first (the rule picked among them).
    pa.field("report_ids", pa.list_(pa.string()), nullable=False),
    # n_tokens: prompt + completion tokens (of the longest sequence in the sample); null when
    # the engine recorded neither token ids nor usage.
    pa.field("n_tokens", pa.int32(), nullable=True),
]

SCHEMAS: dict[str, pa.Schema] = {
    "scored": pa.schema(
        [
            *_COMMON,
            # messages: the request's messages, OpenAI chat form, JSON text.
            pa.field("messages", pa.string(), nullable=False),
            # completion: the answer's text.
            pa.field("completion", pa.string(), nullable=False),
            # score: the counting report's score (or the mean, with rule "mean").
            pa.field("score", pa.float64(), nullable=False),
            # report_id: the report that counted.
            pa.field("report_id", pa.string(), nullable=False),
            # feedback: that report's feedback as JSON text (a string or an object); null if none.
            pa.field("feedback", pa.string(), nullable=True),
        ]
    ),
    "preference": pa.schema(
        [
            *_COMMON,
            pa.field("messages", pa.string(), nullable=False),
            # chosen / rejected: the higher- and the lower-scored answer to the same messages.
            pa.field("chosen", pa.string(), nullable=False),
            pa.field("rejected", pa.string(), nullable=False),
            pa.field("chosen_score", pa.float64(), nullable=False),
            pa.field("rejected_score", pa.float64(), nullable=False),
        ]
    ),
    "rollout": pa.schema(
        [
            *_COMMON,
            # messages: the first turn's request messages; completion: the last answer's text.
            pa.field("messages", pa.string(), nullable=False),
            pa.field("completion", pa.string(), nullable=False),
            pa.field("score", pa.float64(), nullable=False),
            pa.field("report_id", pa.string(), nullable=False),
            # prompt_token_ids: exactly what the engine was fed for the first turn.
            pa.field("prompt_token_ids", pa.list_(pa.int32()), nullable=False),
            # completion_token_ids: everything after the prompt (all turns, flattened).
            pa.field("completion_token_ids", pa.list_(pa.int32()), nullable=False),
            # completion_mask: 1 on generated tokens, 0 on inserted (user/tool) tokens.
            pa.field("completion_mask", pa.list_(pa.int8()), nullable=False),
            # logprobs: the sampler's log-prob per completion token (0.0 where mask is 0);
            # null when the engine did not record them.
            pa.field("logprobs", pa.list_(pa.float64()), nullable=True),
            # report_metadata: the counting report's metadata, JSON text (null when empty);
            # reported_at: when that report was stored (ISO 8601, UTC).
            pa.field("report_metadata", pa.string(), nullable=True),
            pa.field("reported_at", pa.string(), nullable=True),
            # topk_ids: the engine's generation-time top-K ids per completion token (empty on
            # inserted tokens); null when a turn was served without the capture.
            pa.field("topk_ids", pa.list_(pa.list_(pa.int32())), nullable=True),
        ]
    ),
    "trajectory": pa.schema(
        [
            *_COMMON,
            # session_id: the session the turns belong to (null for unstitched records).
            pa.field("session_id", pa.string(), nullable=True),
            # turns: one struct per exchange, in turn order.
            pa.field(
                "turns",
                pa.list_(
                    pa.struct(
                        [
                            pa.field("record_id", pa.string(), nullable=False),
                            pa.field("turn", pa.int32()),
                            pa.field("release_id", pa.string(), nullable=False),
                            pa.field("messages", pa.string(), nullable=False),
                            pa.field("completion", pa.string(), nullable=False),
                            pa.field("prompt_token_ids", pa.list_(pa.int32())),
                            pa.field("completion_token_ids", pa.list_(pa.int32())),
                            pa.field("logprobs", pa.list_(pa.float64())),
                        ]
                    )
                ),
                nullable=False,
            ),
            pa.field("score", pa.float64(), nullable=False),
            pa.field("report_id", pa.string(), nullable=False),
        ]
    ),
}


@dataclass(frozen=True)
class Snapshot:
    """One materialized dataset: where it is and what identifies it."""

    uri: str
    key: str
    content_hash: str
    kind: str
    scenario: str
    rows: int
    schema: pa.Schema
    created_at: datetime
    written: bool  # False when a snapshot with this hash was already there

    def manifest(self) -> dict[str, Any]:
        return {
            "uri": self.uri,
            "key": self.key,
            "content_hash": self.content_hash,
            "kind": self.kind,
            "scenario": self.scenario,
            "rows": self.rows,
            "created_at": self.created_at.isoformat(),
        }


def _ints(xs: Any) -> list[int] | None:
    return list(xs) if xs is not None else None


def row(sample: Sample, scenario: str) -> dict[str, Any]:
    """A sample as one row of its kind's table (plain Python values)."""
    out: dict[str, Any] = {
        "sample_id": sample.sample_id,
        "scenario": scenario,
        "record_ids": list(sample.record_ids),
        "release_id": sample.release_id,
        "staleness": sample.staleness,
        "report_ids": list(sample.report_ids),
        "n_tokens": sample.n_tokens,
    }
    if isinstance(sample, ScoredSample):
        out |= {
            "messages": dumps(list(sample.messages)),
            "completion": sample.completion,
            "score": sample.score,
            "report_id": sample.report_id,
            "feedback": sample.feedback,
        }
    elif isinstance(sample, PreferenceSample):
        out |= {
            "messages": dumps(list(sample.messages)),
            "chosen": sample.chosen,
            "rejected": sample.rejected,
            "chosen_score": sample.chosen_score,
            "rejected_score": sample.rejected_score,
        }
    elif isinstance(sample, RolloutSample):
        out |= {
            "messages": dumps(list(sample.messages)),
            "completion": sample.completion,
            "score": sample.score,
            "report_id": sample.report_id,
            "prompt_token_ids": list(sample.prompt_token_ids),
            "completion_token_ids": list(sample.completion_token_ids),
            "completion_mask": list(sample.completion_mask),
            "logprobs": _ints(sample.logprobs),
            "report_metadata": sample.report_metadata,
            "reported_at": sample.reported_at,
            "topk_ids": None if sample.topk_ids is None else [list(r) for r in sample.topk_ids],
        }
    elif isinstance(sample, TrajectorySample):
        out |= {
            "session_id": sample.session_id,
            "turns": [
                {
                    "record_id": t.record_id,
                    "turn": t.turn,
                    "release_id": t.release_id,
                    "messages": dumps(list(t.messages)),
                    "completion": t.completion,
                    "prompt_token_ids": _ints(t.prompt_token_ids),
                    "completion_token_ids": _ints(t.completion_token_ids),
                    "logprobs": _ints(t.logprobs),
                }
                for t in sample.turns
            ],
            "score": sample.score,
            "report_id": sample.report_id,
        }
    return out


def _canonical(value: Any) -> Any:
    # NaN/inf are not JSON: spell them so they hash differently from null.
    if isinstance(value, float) and not math.isfinite(value):
        return f"float:{value!r}"
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def _floats(array: pa.Array) -> list[pa.Array]:
    """Every float array inside `array` (through lists and structs), flattened."""
    t = array.type
    if pa.types.is_floating(t):
        return [array]
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _floats(array.flatten())
    if pa.types.is_struct(t):
        return [f for i in range(t.num_fields) for f in _floats(array.field(i))]
    return []


def _all_finite(batch: pa.RecordBatch) -> bool:
    """Whether no float anywhere in the batch is NaN or infinite (nulls are fine)."""
    for column in batch.columns:
        for floats in _floats(column):
            if pc.all(pc.is_finite(floats), skip_nulls=True).as_py() is False:  # None: no values
                return False
    return True


def table_hash(table: pa.Table, kind: str) -> str:
    """sha256 over the canonical content: kind, column names, then each row as sorted-key
    JSON in table order. Independent of parquet encoding, compression or writer version."""
    h = hashlib.sha256()
    h.update(orjson.dumps({"kind": kind, "columns": table.schema.names}))
    for batch in table.to_batches(max_chunksize=4096):
        # Spelling NaN/inf apart walks every value in Python; a batch with none (checked in
        # Arrow) hashes its rows as they are, to the same digest.
        canonical = (lambda r: r) if _all_finite(batch) else _canonical
        for r in batch.to_pylist():
            h.update(b"\n")
            h.update(orjson.dumps(canonical(r), option=orjson.OPT_SORT_KEYS))
    return h.hexdigest()


def to_table(experience: Experience) -> pa.Table:
    """The experience's samples as its kind's table, in sample-id order."""
    schema = SCHEMAS[experience.kind]
    rows = [
        row(s, experience.scenario) for s in sorted(experience.samples, key=lambda s: s.sample_id)
    ]
    return pa.Table.from_pylist(rows, schema=schema)


def dataset_key(scenario: str, kind: str, digest: str) -> str:
    return f"datasets/{scenario}/{kind}/{digest}.parquet"


def _latest_key(scenario: str) -> str:
    return f"datasets/{scenario}/latest.json"


def materialize(experience: Experience, kind: str, artifacts: ArtifactStore) -> Snapshot:
    """Write the experience as a parquet snapshot (once per content hash) and note it as the
    scenario's latest materialization. Does not validate: `reef.contracts.validate` does,
    before anything trains on it."""
    kind = check_kind(kind)
    if kind != experience.kind:
        raise BadRequest(f"experience is of kind '{experience.kind}', not '{kind}'")
    with gcpause.paused():
        table = to_table(experience)
        digest = table_hash(table, kind)
    key = dataset_key(experience.scenario, kind, digest)
    written = False
    if not artifacts.exists(key):
        sink = io.BytesIO()
        pq.write_table(table, sink, compression="zstd")
        artifacts.put_bytes(key, sink.getvalue())
        written = True
    snap = Snapshot(
        uri=artifacts.uri(key),
        key=key,
        content_hash=digest,
        kind=kind,
        scenario=experience.scenario,
        rows=table.num_rows,
        schema=table.schema,
        created_at=utcnow(),
        written=written,
    )
    artifacts.put_bytes(_latest_key(experience.scenario), orjson.dumps(snap.manifest()))
    return snap


def load(artifacts: ArtifactStore, key: str) -> pa.Table:
    """A snapshot's table, read back from the artifact store."""
    return pq.read_table(io.BytesIO(artifacts.get_bytes(key)))


def last_materialization(artifacts: ArtifactStore, scenario: str) -> dict[str, Any] | None:
    """The manifest of the scenario's most recent snapshot, or None if it has none."""
    try:
        data: dict[str, Any] = orjson.loads(artifacts.get_bytes(_latest_key(scenario)))
    except NotFound:
        return None
    return data


__all__ = [
    "SCHEMAS",
    "Kind",
    "Snapshot",
    "load",
    "materialize",
    "table_hash",
    "to_table",
]
