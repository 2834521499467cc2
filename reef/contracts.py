"""Data contracts: Great Expectations checks every snapshot before anything trains on it.

The expectations a snapshot of any kind must meet:

- exactly its kind's columns (reef.datasets.SCHEMAS), at least one row;
- scores present, finite and within the recipe's range (NaN counts as missing, so a NaN
  score fails `expect_column_values_to_not_be_null`; ±inf fails the range);
- prompt + completion tokens (`n_tokens`, where known) within the model's context;
- unique `sample_id`s; `staleness` within the loop's bound; one scenario only.

A failure raises ContractViolation naming each failed expectation with its column and what
was observed; the caller stops (no training on a failed snapshot). GX Core is imported only
here and only when validating: it takes seconds to import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from reef.datasets import SCHEMAS
from reef.errors import ReefError
from reef.samples import check_kind

DEFAULT_SCORE_RANGE = (-1e6, 1e6)
_SCORE_COLUMNS = {
    "scored": ("score",),
    "rollout": ("score",),
    "trajectory": ("score",),
    "preference": ("chosen_score", "rejected_score"),
}


class ContractViolation(ReefError):
    """A snapshot failed its data contract; nothing may train on it."""

    status = 422
    type = "invalid_request_error"
    code = "contract_violation"

    def __init__(self, message: str, report: ValidationReport):
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class Failure:
    expectation: str
    column: str | None
    observed: Any

    def describe(self) -> str:
        where = f" on column '{self.column}'" if self.column else ""
        return f"{self.expectation}{where}: observed {self.observed}"


@dataclass(frozen=True)
class ValidationReport:
    kind: str
    rows: int
    success: bool
    evaluated: int
    failures: tuple[Failure, ...] = field(default=())

    def describe(self) -> str:
        head = f"{self.kind} snapshot of {self.rows} rows: "
        if self.success:
            return head + f"all {self.evaluated} expectations met"
        lines = [head + f"{len(self.failures)} of {self.evaluated} expectations failed"]
        lines += [f"  - {f.describe()}" for f in self.failures]
        return "\n".join(lines)


def _observed(result: dict[str, Any]) -> Any:
    if "observed_value" in result and result["observed_value"] is not None:
        return result["observed_value"]
    if "unexpected_count" in result:
        sample = result.get("partial_unexpected_list") or []
        return f"{result['unexpected_count']} unexpected value(s), e.g. {sample[:5]}"
    return result or "n/a"


def _suite(
    kind: str,
    *,
    max_context: int | None,
    max_staleness: int | None,
    score_range: tuple[float, float],
) -> Any:
    import great_expectations as gx

    E = gx.expectations
    suite = gx.ExpectationSuite(name=f"reef-{kind}")
    add = suite.add_expectation
    add(E.ExpectTableColumnsToMatchSet(column_set=SCHEMAS[kind].names, exact_match=True))
    add(E.ExpectTableRowCountToBeBetween(min_value=1))
    add(E.ExpectColumnValuesToNotBeNull(column="sample_id"))
    add(E.ExpectColumnValuesToBeUnique(column="sample_id"))
    add(E.ExpectColumnUniqueValueCountToBeBetween(column="scenario", min_value=1, max_value=1))
    lo, hi = score_range
    for col in _SCORE_COLUMNS[kind]:
        add(E.ExpectColumnValuesToNotBeNull(column=col))
        add(E.ExpectColumnValuesToBeBetween(column=col, min_value=lo, max_value=hi))
    if max_context is not None:
        add(E.ExpectColumnValuesToBeBetween(column="n_tokens", min_value=0, max_value=max_context))
    if max_staleness is not None:
        add(
            E.ExpectColumnValuesToBeBetween(
                column="staleness", min_value=0, max_value=max_staleness
            )
        )
    return suite


def validate(
    snapshot: pa.Table | str | Path,
    kind: str,
    *,
    max_context: int | None = None,
    max_staleness: int | None = None,
    score_range: tuple[float, float] = DEFAULT_SCORE_RANGE,
) -> ValidationReport:
    """Check a snapshot (a table or a local parquet path) against its kind's contract.
    Returns the report when every expectation holds; raises ContractViolation otherwise."""
    kind = check_kind(kind)
    table = snapshot if isinstance(snapshot, pa.Table) else pq.read_table(snapshot)

    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    source = context.data_sources.add_pandas("reef")
    batch_definition = source.add_dataframe_asset("snapshot").add_batch_definition_whole_dataframe(
        "whole"
    )
    batch = batch_definition.get_batch(batch_parameters={"dataframe": table.to_pandas()})
    suite = _suite(
        kind, max_context=max_context, max_staleness=max_staleness, score_range=score_range
    )
    result = batch.validate(suite)
    failures = tuple(
        Failure(
            expectation=r.expectation_config.type,
            column=r.expectation_config.kwargs.get("column"),
            observed=_observed(dict(r.result)),
        )
        for r in result.results
        if not r.success
    )
    report = ValidationReport(
        kind=kind,
        rows=table.num_rows,
        success=bool(result.success),
        evaluated=len(result.results),
        failures=failures,
    )
    if not report.success:
        raise ContractViolation(report.describe(), report)
    return report
