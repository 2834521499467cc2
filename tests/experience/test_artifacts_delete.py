"""Deleting a key prefix (a deleted scenario's files) from a directory and from S3: everything
under `prefix/` goes, neighbours that merely share the prefix's text stay, a rerun is a no-op."""

from __future__ import annotations

from pathlib import Path

import pytest

from reef.artifacts import ArtifactStore, open_artifacts


@pytest.fixture(params=["local", "s3"])
def artifacts(request: pytest.FixtureRequest, tmp_path: Path) -> ArtifactStore:
    if request.param == "local":
        return open_artifacts(tmp_path / "artifacts")
    bucket: str = request.getfixturevalue("s3_bucket")
    endpoint: str = request.getfixturevalue("s3_endpoint")
    return open_artifacts(f"s3://{bucket}/reef", endpoint_url=endpoint, region="us-east-1")


def test_delete_prefix_removes_exactly_the_prefix(artifacts: ArtifactStore, tmp_path: Path) -> None:
    doomed = [f"datasets/a/scored/{i:04d}.parquet" for i in range(1001)]  # > one S3 page
    for key in doomed:
        artifacts.put_bytes(key, b"x")
    (tmp_path / "tree" / "sub").mkdir(parents=True)
    (tmp_path / "tree" / "sub" / "w.bin").write_bytes(b"w")
    artifacts.put_tree("releases/a/abc", tmp_path / "tree")
    kept = ["datasets/a2/latest.json", "datasets/ab/scored/x.parquet", "datasets/b/latest.json"]
    for key in kept:
        artifacts.put_bytes(key, b"k")

    assert artifacts.delete_prefix("datasets/a") == 1001
    assert artifacts.delete_prefix("releases/a") == 2  # the file and the tree's manifest
    assert artifacts.list_keys("datasets/a") == [] and artifacts.list_keys("releases/a") == []
    assert not artifacts.exists(doomed[0])
    assert all(artifacts.get_bytes(k) == b"k" for k in kept)
    assert artifacts.delete_prefix("datasets/a") == 0  # again: nothing there
    assert artifacts.delete_prefix("harness-eval/never") == 0
    with pytest.raises(ValueError):
        artifacts.delete_prefix("../a")
