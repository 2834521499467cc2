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


@pytest.mark.parametrize("kind", ["scored", "rollout", "trajectory"])
def test_the_hash_spells_nan_and_inf_apart_from_null(kind: str) -> None:
    """A table with no NaN/inf hashes its rows as they are (checked in Arrow, no Python walk);
    one with them spells each apart, so NaN, inf and null give three different ids, and the
    all-finite table's id is the one the value-by-value spelling gives."""
    schema = SCHEMAS[kind]
    floats = [f.name for f in schema if pa.types.is_floating(f.type)]
    assert floats, kind

    def table(value: float | None) -> pa.Table:
        row = {f.name: _filler(f.type) for f in schema}
        row[floats[0]] = value
        return pa.Table.from_pylist(
            [row],
            schema=schema.set(
                schema.get_field_index(floats[0]), pa.field(floats[0], pa.float64(), nullable=True)
            ),
        )

    digests = {v: table_hash(table(v), kind) for v in (1.5, float("nan"), float("inf"), None)}
    assert len(set(digests.values())) == 4

    import reef.datasets as ds

    finite = table(1.5)
    slow = ds.hashlib.sha256()
    slow.update(ds.orjson.dumps({"kind": kind, "columns": finite.schema.names}))
    for r in finite.to_pylist():
        slow.update(b"\n")
        slow.update(ds.orjson.dumps(ds._canonical(r), option=ds.orjson.OPT_SORT_KEYS))
    assert digests[1.5] == slow.hexdigest()


def _filler(t: pa.DataType) -> object:
    if pa.types.is_string(t):
        return "x"
    if pa.types.is_integer(t):
        return 1
    if pa.types.is_floating(t):
        return 0.25
    if pa.types.is_list(t):
        return [_filler(t.value_type)]
    if pa.types.is_struct(t):
        return {t.field(i).name: _filler(t.field(i).type) for i in range(t.num_fields)}
    raise AssertionError(t)


def test_nested_nan_is_found() -> None:
    """NaN inside a list (log-probs) or a struct in a list (a trajectory's turns) is not
    hashed as null either."""
    for kind, set_nan in (
        ("rollout", lambda r: r.update(logprobs=[0.0, float("nan")])),
        ("trajectory", lambda r: r["turns"][0].update(logprobs=[float("nan")])),
    ):
        schema = SCHEMAS[kind]
        base = {f.name: _filler(f.type) for f in schema}
        nan = {**base, "turns": [dict(t) for t in base.get("turns", [])]}
        set_nan(nan)
        null = {**base, "turns": [dict(t) for t in base.get("turns", [])]}
        set_nan(null)
        if kind == "rollout":
            null["logprobs"] = [0.0, None]
        else:
            null["turns"][0]["logprobs"] = [None]
        hashes = {table_hash(pa.Table.from_pylist([r], schema=schema), kind) for r in (nan, null)}
        assert len(hashes) == 2, kind
