"""A report's named metrics checked against what its scenario declares (metrics.<name>,
scenarios.<name>.metrics): an undeclared name, a value of the wrong type, a float outside its
range or a categorical value not listed is a 400 naming the metric."""

from __future__ import annotations

import math
from collections.abc import Mapping

from reef.errors import BadRequest
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
