"""`reef backup` and `reef restore`: a deployment (its database, its artifact store) copied out
while it is in use and put into an empty one elsewhere keeps every row of every table, its
release files where the rows say, and refuses to overwrite a deployment. The whole loop
(a served release, backed up and restored, serving the same answers and learning on) is
tests/flows/test_backup_loop.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from reef.artifacts import open_artifacts
from reef.cli.main import main
from reef.records import Record
from reef.store.sql import open_store
from tests.store.builders import Snapshot, new_release, new_report, snapshot, write_rows
from tests.store.conftest import make_record

__all__ = ["make_record"]  # the store tests' record builder, a fixture here too


def _deployment(state: Path, url: str, make_record: Callable[..., Record]) -> str:
    """A scenario with a trained release (its files in the artifact store), a record and a
    report; and a row in every table. Returns the new head's id."""
    files = state / "trained"
    files.mkdir(parents=True)
    (files / "adapter_model.safetensors").write_bytes(b"\x00weights")
    uri = open_artifacts(str(state / "artifacts")).put_tree("releases/kept/abc", files)
    store = open_store(url)
    try:
        store.migrate()
        base = store.create_scenario("kept").head_release_id
        head = store.publish_release(new_release("kept", base, uri=uri)).id
        record = make_record("kept", head)
        store.add_records([record])
        store.add_report(new_report("kept", (record.id,)))
        write_rows(store.engine, 1)
    finally:
        store.close()
    return head


def _snapshot(url: str) -> Snapshot:
    store = open_store(url)
    try:
        return snapshot(store.engine)
    finally:
        store.close()


def test_backup_restores_every_row_and_the_release_files_elsewhere(
    database_url: str,
    twin_database_url: str,
    tmp_path: Path,
    make_record: Callable[..., Record],
    capsys: pytest.CaptureFixture[str],
) -> None:
    old_state, new_state, saved = tmp_path / "old", tmp_path / "new", tmp_path / "backup"
    head = _deployment(old_state, database_url, make_record)
    old = ["--state-dir", str(old_state), "--database-url", database_url]
    assert main(["backup", *old, "--output", str(saved)]) == 0
    manifest = json.loads((saved / "reef-backup.json").read_text())
    assert manifest["heads"]["kept"] == head and manifest["schema_revision"]

    new = ["--state-dir", str(new_state), "--database-url", twin_database_url]
    assert main(["restore", *new, "--input", str(saved)]) == 0
    assert "moved 1 release files" in capsys.readouterr().out
    before, after = (_snapshot(u) for u in (database_url, twin_database_url))
    old_root, new_root = ((s / "artifacts").resolve().as_uri() for s in (old_state, new_state))
    for row in before["releases"][1]:
        if row["uri"] and row["uri"].startswith(old_root):
            row["uri"] = new_root + row["uri"][len(old_root) :]
    assert before == after
    restored = open_store(twin_database_url)
    try:
        release = restored.get_release("kept", head)
        assert release.uri == f"{new_root}/releases/kept/abc"
        files = open_artifacts(str(new_state / "artifacts")).fetch_tree(
            "releases/kept/abc", tmp_path / "fetched"
        )
        assert (files / "adapter_model.safetensors").read_bytes() == b"\x00weights"
        assert len(restored.list_reports("kept")) == 1
    finally:
        restored.close()

    # A deployment is never overwritten: restoring again into it is refused, and so is a
    # backup into a directory that holds something.
    assert main(["restore", *new, "--input", str(saved)]) == 2
    assert "a restore goes into an empty deployment" in capsys.readouterr().err
    assert main(["backup", *old, "--output", str(saved)]) == 2
    assert "is not empty" in capsys.readouterr().err


def test_a_backup_restores_only_into_its_own_kind_of_database(
    tmp_path: Path, make_record: Callable[..., Record], capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'old' / 'reef.db'}"
    _deployment(tmp_path / "old", url, make_record)
    assert (
        main(["backup", "--state-dir", str(tmp_path / "old"), "--output", str(tmp_path / "b")]) == 0
    )
    target = [
        "--state-dir",
        str(tmp_path / "new"),
        "--database-url",
        "postgresql+psycopg://x@127.0.0.1:1/x",
    ]
    assert main(["restore", *target, "--input", str(tmp_path / "b")]) == 2
    assert "restore it into SQLite" in capsys.readouterr().err
    assert main(["restore", "--state-dir", str(tmp_path), "--input", str(tmp_path / "new")]) == 2
    assert "not a reef backup" in capsys.readouterr().err
