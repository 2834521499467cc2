"""Data contracts: GX rejects bad snapshots with a report naming each failed expectation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reef.contracts import ContractViolation, validate
from reef.datasets import SCHEMAS, to_table
from reef.experience import collect
from reef.store.sql import SQLStore
from tests.experience.conftest import record, report


def _row(sample_id: str, **fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "sample_id": sample_id,
        "scenario": "c",
        "record_ids": [sample_id],
        "release_id": "rel_1",
        "staleness": 0,
        "report_ids": ["rep_1"],
        "n_tokens": 6,
        "messages": '[{"content":"hi","role":"user"}]',
        "completion": "hello",
        "score": 1.0,
        "report_id": "rep_1",
    }
    return row | fields


def _table(*rows: dict[str, Any]) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=SCHEMAS["scored"])


def test_a_good_snapshot_passes(tmp_path: Path) -> None:
    path = tmp_path / "ok.parquet"
    pq.write_table(_table(_row("a"), _row("b", score=-3.5)), path)
    result = validate(path, "scored", max_context=2048, max_staleness=0)
    assert result.success and result.rows == 2 and not result.failures


def test_nan_score_is_rejected() -> None:
    with pytest.raises(ContractViolation) as err:
        validate(_table(_row("a"), _row("b", score=float("nan"))), "scored", max_context=2048)
    assert err.value.status == 422
    (failure,) = err.value.report.failures
    assert (failure.expectation, failure.column) == ("expect_column_values_to_not_be_null", "score")
    assert "expect_column_values_to_not_be_null on column 'score'" in err.value.message


def test_over_length_sample_is_rejected() -> None:
    with pytest.raises(ContractViolation) as err:
        validate(_table(_row("a"), _row("b", n_tokens=4097)), "scored", max_context=4096)
    (failure,) = err.value.report.failures
    assert (failure.expectation, failure.column) == (
        "expect_column_values_to_be_between",
        "n_tokens",
    )
    assert "4097" in err.value.message


def test_every_failure_is_named() -> None:
    table = _table(
        _row("a", score=float("inf"), staleness=3),
        _row("a", scenario="other"),
    )
    with pytest.raises(ContractViolation) as err:
        validate(table, "scored", max_staleness=1, score_range=(0.0, 1.0))
    failed = {(f.expectation, f.column) for f in err.value.report.failures}
    assert failed == {
        ("expect_column_values_to_be_unique", "sample_id"),
        ("expect_column_unique_value_count_to_be_between", "scenario"),
        ("expect_column_values_to_be_between", "score"),
        ("expect_column_values_to_be_between", "staleness"),
    }
    with pytest.raises(ContractViolation) as err:
        validate(_table(), "scored")
    assert "expect_table_row_count_to_be_between" in err.value.message
    with pytest.raises(ContractViolation) as err:
        validate(_table(_row("a")).drop_columns(["n_tokens"]), "scored")
    assert "expect_table_columns_to_match_set" in err.value.message


def test_collected_experience_meets_its_contract(store: SQLStore) -> None:
    base = store.ensure_scenario("c").head_release_id
    recs = [record("c", base) for _ in range(3)]
    store.add_records(recs)
    for rec in recs:
        store.add_report(report("c", rec.id, score=0.5))
    for kind, recipe in (("scored", "sft"), ("rollout", "grpo"), ("trajectory", "harness")):
        table = to_table(collect(store, "c", kind, recipe=recipe, max_staleness=0))
        assert validate(table, kind, max_context=4096, max_staleness=0).rows == 3
