"""scenarios.<name>: one scenario's own learning strategy over the defaults, so that different
applications on one Reef learn each their own way (a support bot with sft on corrections, a
coding agent with openclaw on next turns, each with its batch size, gate and judge)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from reef.settings.metrics import Metrics
from reef.settings.section import Section

# reef.* keys that belong to the process, not to a scenario: where deploys go, how the worker
# runs, when it looks.
PROCESS_KEYS = frozenset(
    {
        "auto",
        "engine_url",
        "engine_token",
        "schedule_s",
        "train_threads",
        "worker_priority",
        "train",
    }
)


class ScenarioSettings(Section):
    """scenarios.<name>: overrides of the learning sections for one scenario, merged key by
    key over the top-level ones (nested mappings merged too, lists replaced)."""

    reef: dict[str, Any] = Field(
        default_factory=dict,
        description="reef.* keys for this scenario: recipe, batch_size, max_staleness, params, "
        "select, seed (the process-wide ones, such as auto or worker_priority, stay top-level)",
    )
    gate: dict[str, Any] = Field(default_factory=dict, description="gate.* keys for this scenario")
    judge: dict[str, Any] = Field(
        default_factory=dict,
        description="judge.* keys for this scenario: enabled, method, url, model, function, "
        "votes, hints, min_confidence, ...",
    )
    review: dict[str, Any] = Field(
        default_factory=dict,
        description="review.* keys for this scenario: which turns fill its annotation queue "
        "(sample, unsure_below, disagreement, canary), lease_s",
    )

    metrics: Metrics = Field(
        default_factory=dict,
        description="named metrics this scenario's reports may carry, beside the top-level "
        "ones (a name declared in both takes this one)",
    )

    @field_validator("reef")
    @classmethod
    def _scenario_keys(cls, v: dict[str, Any]) -> dict[str, Any]:
        process = sorted(PROCESS_KEYS & set(v))
        if process:
            raise ValueError(f"{', '.join(process)}: process-wide, set at the top level")
        return v


def merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`override` over `base`, mappings merged key by key, anything else replaced."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out
