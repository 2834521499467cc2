"""metrics.<name>: the named metrics a scenario's reports may carry beside `score` (the default
metric): whether a turn helped (boolean), how accurate it was (float in a range), its tone
(categorical). Declared at the top level for every scenario and per scenario under
`scenarios.<name>.metrics`; a report's `metrics` are checked against them (reef.metrics)."""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from reef.settings.section import Section

# What a metric may be called: a short identifier; `score` is the default metric's own name.
METRIC_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


class MetricSettings(Section):
    """One named metric: its type, and the range (float) or the values (categorical) it takes."""

    type: Literal["boolean", "float", "categorical"] = Field(
        description="boolean (true/false), float (a number, in `range` when given) or "
        "categorical (one of `values`)"
    )
    range: tuple[float, float] | None = Field(
        None, description="float only: the lowest and highest value a report may give"
    )
    values: tuple[str, ...] = Field(
        (), description="categorical only: the values a report may give"
    )
    description: str | None = Field(None, description="what the metric measures, for people")

    @model_validator(mode="after")
    def _shape(self) -> MetricSettings:
        if self.type == "categorical":
            if not self.values:
                raise ValueError("a categorical metric lists its values")
            if len(set(self.values)) != len(self.values):
                raise ValueError("values must be unique")
        elif self.values:
            raise ValueError(f"values belong to categorical metrics, not {self.type}")
        if self.range is not None:
            if self.type != "float":
                raise ValueError(f"range belongs to float metrics, not {self.type}")
            low, high = self.range
            if not (math.isfinite(low) and math.isfinite(high) and low < high):
                raise ValueError("range is [low, high] with finite low < high")
        return self


def _check_names(metrics: dict[str, MetricSettings]) -> dict[str, MetricSettings]:
    for name in metrics:
        if name == "score":
            raise ValueError(
                "'score' is the default metric (a report's `score`): pick another name"
            )
        if not METRIC_NAME.match(name):
            raise ValueError(f"metric name '{name}' must match {METRIC_NAME.pattern}")
    return metrics


# A metrics section by name (the top level's and each scenario's), its names checked.
Metrics = Annotated[dict[str, MetricSettings], AfterValidator(_check_names)]


def check_learning_metric(metric: str, declared: dict[str, MetricSettings]) -> None:
    """reef.metric names `score` or a declared boolean or float metric (a number to learn from)."""
    if metric == "score":
        return
    spec = declared.get(metric)
    if spec is None:
        known = ", ".join(sorted(declared)) or "none declared"
        raise ValueError(f"reef.metric '{metric}' is not a declared metric ({known}) nor score")
    if spec.type == "categorical":
        raise ValueError(
            f"reef.metric '{metric}' is categorical: learn from a boolean or float metric"
        )
