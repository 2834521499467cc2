"""scenarios.<name>: one scenario's own learning strategy over the defaults, so that different
applications on one Reef learn each their own way (a support bot with sft on corrections, a
coding agent with openclaw on next turns, each with its batch size, gate and judge)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from reef.settings.engine import check_sampling_defaults
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


class ScenarioEngine(Section):
    """scenarios.<name>.engine: how the engine samples this scenario's calls. The rest of the
    engine section (which model, where it runs, its limits) is the process's, shared by every
    scenario it serves."""

    sampling_defaults: dict[str, float] | None = Field(
        None,
        description="temperature / top_p given to this scenario's requests that name neither "
        "(as engine.sampling_defaults, which it replaces as a whole for the scenario); {}: "
        "none, the request's own values or the engine's plain ones; unset: engine."
        "sampling_defaults",
    )

    @field_validator("sampling_defaults")
    @classmethod
    def _sampling_ranges(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        return check_sampling_defaults(v)


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

    engine: ScenarioEngine = Field(
        default_factory=ScenarioEngine,
        description="engine.sampling_defaults for this scenario's calls (the other engine "
        "keys are process-wide)",
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


# Mappings replaced as a whole by an override, never merged: a scenario's sampling values are
# one choice ({} must turn the configuration's off, not keep them).
WHOLE = frozenset({"sampling_defaults"})


def merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`override` over `base`, mappings merged key by key (but those named in WHOLE), anything
    else replaced."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key not in WHOLE:
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out
