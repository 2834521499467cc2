"""Snapshots: one parquet per content hash, on a local directory and on S3 (moto_server)."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reef.artifacts import ArtifactStore, LocalArtifacts, S3Artifacts, open_artifacts
from reef.datasets import SCHEMAS, last_materialization, load, materialize, table_hash
from reef.errors import NotFound
from reef.experience import collect
from reef.store.sql import SQLStore
from tests.experience.conftest import record, report, session

S = "snap"


@pytest.fixture(params=["local", "s3"])
def artifacts(request: pytest.FixtureRequest, tmp_path: Path) -> ArtifactStore:
    if request.param == "local":
        return open_artifacts(tmp_path / "artifacts")
    bucket: str = request.getfixturevalue("s3_bucket")
    endpoint: str = request.getfixturevalue("s3_endpoint")
    return open_artifacts(f"s3://{bucket}/reef", endpoint_url=endpoint, region="us-east-1")


def _fill(store: SQLStore) -> None:
    base = store.ensure_scenario(S).head_release_id
    recs = [record(S, base, answer=f"answer {k}") for k in range(4)]
    turns = session(S, base, 2)
    store.add_records([*recs, *turns])
    for k, rec in enumerate(recs):
        store.add_report(report(S, rec.id, score=float(k)))
    store.add_report(report(S, *(r.id for r in turns), score=0.5))


@pytest.mark.parametrize("kind", ["scored", "rollout", "trajectory"])
def test_materialize_is_deterministic(store: SQLStore, artifacts: ArtifactStore, kind: str) -> None:
    _fill(store)
    recipe = {"scored": "sft", "rollout": "grpo", "trajectory": "harness"}[kind]
    first = materialize(collect(store, S, kind, recipe=recipe), kind, artifacts)
    second = materialize(collect(store, S, kind, recipe=recipe), kind, artifacts)
    assert first.written and not second.written
    assert first.content_hash == second.content_hash and first.uri == second.uri
    assert first.key == f"datasets/{S}/{kind}/{first.content_hash}.parquet"
    assert first.rows == 5 and first.schema == SCHEMAS[kind]
    assert first.uri.startswith("s3://" if isinstance(artifacts, S3Artifacts) else "file://")

    table = load(artifacts, first.key)
    assert table.schema == SCHEMAS[kind] and table.num_rows == 5
    # the id is the content's, not the bytes': another writer, another encoding, same hash
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="none", use_dictionary=False)
    assert table_hash(pq.read_table(io.BytesIO(sink.getvalue())), kind) == first.content_hash

    manifest = last_materialization(artifacts, S)
    assert manifest is not None and manifest["content_hash"] == first.content_hash


def test_new_content_is_a_new_snapshot(store: SQLStore, artifacts: ArtifactStore) -> None:
    _fill(store)
    first = materialize(collect(store, S, "scored", recipe="sft"), "scored", artifacts)
    rec = record(S, store.get_scenario(S).head_release_id)
    store.add_records([rec])
    store.add_report(report(S, rec.id, score=2.0))
    second = materialize(collect(store, S, "scored", recipe="sft"), "scored", artifacts)
    assert second.written and second.content_hash != first.content_hash
    assert second.rows == first.rows + 1
    assert artifacts.exists(first.key) and artifacts.exists(second.key)


def test_artifact_store_basics(artifacts: ArtifactStore) -> None:
    assert not artifacts.exists("a/b.bin")
    with pytest.raises(NotFound):
        artifacts.get_bytes("a/b.bin")
    uri = artifacts.put_bytes("a/b.bin", b"\x00reef")
    assert artifacts.exists("a/b.bin") and artifacts.get_bytes("a/b.bin") == b"\x00reef"
    assert uri == artifacts.uri("a/b.bin")
    with pytest.raises(ValueError):
        artifacts.put_bytes("../escape", b"")


def test_local_writes_leave_no_temporary_files(tmp_path: Path) -> None:
    store = LocalArtifacts(tmp_path)
    store.put_bytes("x/y.parquet", b"1")
    store.put_bytes("x/y.parquet", b"2")
    assert [p.name for p in (tmp_path / "x").iterdir()] == ["y.parquet"]
    assert pa.py_buffer(store.get_bytes("x/y.parquet")).to_pybytes() == b"2"
