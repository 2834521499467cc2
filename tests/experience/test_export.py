"""`reef export`: sessions with turns, feedback and release ids as .jsonl, .parquet, HF dir."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pyarrow.parquet as pq
import pytest

from reef.cli.main import main
from reef.store.sql import SQLStore
from tests.experience.conftest import append_release, record, report, session

S = "export"


def _fill(store: SQLStore) -> tuple[list[str], str, str]:
    base = store.ensure_scenario(S).head_release_id
    turns = session(S, base, 3)
    rel = append_release(store, S)
    single = record(S, rel.id)
    store.add_records([*turns, single])
    store.add_report(report(S, *(r.id for r in turns), score=0.5, feedback={"note": "ok"}))
    store.add_report(report(S, single.id, score=-1.0, feedback="wrong"))
    return [r.id for r in turns], single.id, rel.id


def _check(rows: list[dict], turn_ids: list[str], single: str, rel: str, base: str) -> None:
    assert len(rows) == 4
    by_id = {r["record_id"]: r for r in rows}
    sessions = {by_id[i]["session_id"] for i in turn_ids}
    assert len(sessions) == 1 and by_id[single]["session_id"] == single
    assert [by_id[i]["turn"] for i in turn_ids] == [0, 1, 2]
    assert [by_id[i]["release_id"] for i in turn_ids] == [base] * 3
    assert by_id[single]["release_id"] == rel
    fb = by_id[turn_ids[1]]["feedback"]
    assert (
        len(fb) == 1 and fb[0]["score"] == 0.5 and json.loads(fb[0]["feedback"]) == {"note": "ok"}
    )
    assert list(fb[0]["references"]) == turn_ids
    assert json.loads(by_id[single]["feedback"][0]["feedback"]) == "wrong"
    assert list(by_id[turn_ids[2]]["prompt_token_ids"])[:2] == [1, 100]
    assert json.loads(by_id[turn_ids[2]]["messages"])[-1] == {"role": "user", "content": "q2"}


@pytest.mark.parametrize("target", ["out.jsonl", "out.parquet", "out-hf"])
def test_export_formats(
    store: SQLStore,
    database_url: str,
    tmp_path: Path,
    target: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    turn_ids, single, rel = _fill(store)
    base = store.list_releases(S)[0].id
    out = tmp_path / target
    args = ["export", "--scenario", S, "--output", str(out), "--database-url", database_url, "-q"]
    assert main(args) == 0
    assert "exported 4 records" in capsys.readouterr().out
    if target.endswith(".jsonl"):
        rows = [json.loads(line) for line in out.read_text().splitlines()]
    elif target.endswith(".parquet"):
        rows = pq.read_table(out).to_pylist()
    else:
        ds = datasets.load_from_disk(str(out))
        assert isinstance(ds, datasets.Dataset)
        rows = ds.to_list()
    _check(rows, turn_ids, single, rel, base)


def test_export_of_unknown_scenario_fails(
    database_url: str, tmp_path: Path, store: SQLStore, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "x.jsonl"
    args = ["export", "--scenario", "nope", "--output", str(out), "--database-url", database_url]
    assert main(args) == 1
    assert "nope" in capsys.readouterr().err and not out.exists()
