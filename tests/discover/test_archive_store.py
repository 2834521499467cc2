"""The discovery's resume point in the artifact store (demo.discover.harness.ArchiveStore), in
a local artifact directory and on a real S3 protocol server (moto): each step's archive is
pushed, and a run started on another machine (an empty directory) resumes from it through
Reef's live inference, with the same run id for its report ids."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from demo.discover.archive import Archive
from demo.discover.harness import ArchiveStore, Config, Reef, discover, save
from demo.discover.sandbox import Limits
from reef.artifacts import ArtifactStore, LocalArtifacts, S3Artifacts
from reef.cli.testing import InProcessReef


@pytest.fixture(params=["local", "s3"])
def artifacts(request: pytest.FixtureRequest, tmp_path: Path) -> ArtifactStore:
    if request.param == "local":
        return LocalArtifacts(tmp_path / "artifacts")
    bucket = request.getfixturevalue("s3_bucket")
    return S3Artifacts(bucket, "reef", endpoint_url=request.getfixturevalue("s3_endpoint"))


def test_push_and_pull(artifacts: ArtifactStore, tmp_path: Path) -> None:
    store = ArchiveStore(artifacts, "discover-ttt")
    assert store.steps_done() is None
    here = tmp_path / "here"
    here.mkdir()
    archive = Archive()
    archive.seed("print(1)\n", 0.5)
    archive.steps_done = 3
    (here / "run_id").write_text("ab12cd34")
    save(archive, here, [], store)
    assert store.steps_done() == 3
    assert artifacts.list_keys("discover/discover-ttt") == [
        f"discover/discover-ttt/{name}" for name in sorted(ArchiveStore.FILES)
    ]
    there = tmp_path / "there"
    there.mkdir()
    store.pull(there)
    assert Archive.load(there / "archive.json").to_dict() == archive.to_dict()
    assert (there / "run_id").read_text() == "ab12cd34"
    assert (there / "best.py").read_text() == "print(1)\n"
    assert json.loads((there / "best.json").read_text())["reward"] == 0.5


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    with InProcessReef(tmp_path_factory.mktemp("reef-discover")) as srv:
        yield srv


def test_a_run_resumes_on_another_machine(
    server: InProcessReef, artifacts: ArtifactStore, tmp_path: Path
) -> None:
    """Search mode (the frozen tiny model: no training to wait for), one step on a machine,
    then a second step from an empty directory on 'another' one."""
    scenario = f"discover-resume-{tmp_path.name[-12:]}".lower().replace("_", "-")
    cfg = Config(
        n=4, groups=1, rollouts=3, steps=1, max_tokens=8, mode="search", limits=Limits(wall_s=10)
    )
    store = ArchiveStore(artifacts, scenario)
    said: list[str] = []
    reef = Reef(server.url, scenario, "tiny")
    try:
        first = discover(reef, cfg, tmp_path / "one", said.append, store=store)
        assert len(first) == 1 and store.steps_done() == 1
        run_id = (tmp_path / "one" / "run_id").read_text()
        second = discover(reef, replace(cfg, steps=2), tmp_path / "two", said.append, store=store)
    finally:
        reef.close()
    assert any("archive read from" in line and "(1 steps done)" in line for line in said)
    assert any(line.startswith("resuming search at step 1") for line in said)
    assert [r.step for r in second] == [0, 1] and second[0] == first[0]
    assert (tmp_path / "two" / "run_id").read_text() == run_id
    assert store.steps_done() == 2
    assert Archive.load(tmp_path / "two" / "archive.json").steps_done == 2
