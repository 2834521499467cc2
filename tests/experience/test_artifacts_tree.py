"""Artifact trees (a release's files): put, list, fetch, on a directory and on S3."""

from __future__ import annotations

from pathlib import Path

import pytest

from reef.artifacts import ArtifactStore, LocalArtifacts, open_artifacts, tree_hash
from reef.errors import NotFound


def _tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "a.json").write_text('{"x": 1}')
    (root / "sub" / "b.bin").write_bytes(b"\x00\x01" * 100)
    return root


def _roundtrip(store: ArtifactStore, tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    uri = store.put_tree("releases/s/abc", src)
    assert uri.endswith("releases/s/abc")
    assert store.list_keys("releases/s/abc") == [
        "releases/s/abc/.manifest.json",
        "releases/s/abc/a.json",
        "releases/s/abc/sub/b.bin",
    ]
    got = store.fetch_tree("releases/s/abc", tmp_path / "cache" / "abc")
    assert (got / "sub" / "b.bin").read_bytes() == b"\x00\x01" * 100
    assert tree_hash(got) == tree_hash(src)
    # a second fetch reuses what is there
    assert store.fetch_tree("releases/s/abc", tmp_path / "cache" / "abc") == got
    with pytest.raises(NotFound):
        store.fetch_tree("releases/s/missing", tmp_path / "cache" / "missing")


def test_local_tree(tmp_path: Path) -> None:
    _roundtrip(LocalArtifacts(tmp_path / "artifacts"), tmp_path)


def test_s3_tree(tmp_path: Path, s3_endpoint: str, s3_bucket: str) -> None:
    _roundtrip(open_artifacts(f"s3://{s3_bucket}/pre", endpoint_url=s3_endpoint), tmp_path)


def test_tree_hash_depends_on_names_and_content(tmp_path: Path) -> None:
    a = _tree(tmp_path / "a")
    b = _tree(tmp_path / "b")
    assert tree_hash(a) == tree_hash(b)
    (b / "a.json").write_text('{"x": 2}')
    assert tree_hash(a) != tree_hash(b)
