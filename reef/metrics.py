"""A report's named metrics checked against what its scenario declares (metrics.<name>,
scenarios.<name>.metrics): an undeclared name, a value of the wrong type, a float outside its
range or a categorical value not listed is a 400 naming the metric."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from reef.errors import BadRequest
from reef.records import Report
from reef.settings.metrics import MetricSettings

MetricValue = bool | float | str


def check_metrics(
    scenario: str, values: Mapping[str, MetricValue], declared: Mapping[str, MetricSettings]
) -> None:
    """Raise BadRequest (code invalid_metric, param metrics.<name>) on the first bad value."""
    for name, value in values.items():
        spec = declared.get(name)
        if spec is None:
            known = ", ".join(sorted(declared)) or "none"
            raise _bad(
                name, f"'{name}' is not a metric of scenario '{scenario}' (declared: {known})"
            )
        if spec.type == "boolean":
            if not isinstance(value, bool):
                raise _bad(name, f"metric '{name}' is boolean: give true or false")
        elif spec.type == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise _bad(name, f"metric '{name}' is a number")
            if not math.isfinite(value):
                raise _bad(name, f"metric '{name}' must be finite")
            if spec.range is not None and not spec.range[0] <= value <= spec.range[1]:
                low, high = spec.range
                raise _bad(name, f"metric '{name}' is {value}, outside its range [{low}, {high}]")
        elif not isinstance(value, str) or value not in spec.values:
            raise _bad(name, f"metric '{name}' is one of {', '.join(spec.values)}")


def _bad(name: str, message: str) -> BadRequest:
    return BadRequest(message, code="invalid_metric", param=f"metrics.{name}")


class Tally:
    """Each declared metric over the reports it is shown: how many give it (n), and the share
    that said true (boolean), the mean, lowest and highest (float) or the count per value
    (categorical). `watch` counts reports as another reader goes through them (one read)."""

    def __init__(self, declared: Mapping[str, MetricSettings]):
        self.declared = dict(declared)
        self.values: dict[str, list[MetricValue]] = {name: [] for name in declared}

    def watch(self, reports: Iterable[Report]) -> Iterator[Report]:
        for rep in reports:
            for name, value in rep.metrics.items():
                if name in self.values:
                    self.values[name].append(value)
            yield rep

    def summary(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for name, spec in sorted(self.declared.items()):
            given = self.values[name]
            row: dict[str, Any] = {"type": spec.type, "n": len(given)}
            if spec.type == "boolean":
                row["share_true"] = sum(v is True for v in given) / len(given) if given else None
            elif spec.type == "float":
                numbers = [float(v) for v in given]
                row["mean"] = sum(numbers) / len(numbers) if numbers else None
                row["min"] = min(numbers, default=None)
                row["max"] = max(numbers, default=None)
            else:
                counted = Counter(str(v) for v in given)
                row["counts"] = {value: counted[value] for value in spec.values}
            out[name] = row
        return out
