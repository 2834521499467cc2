"""rollout: how an accepted release reaches live traffic (immediate, canary, shadow, ab)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from reef.errors import ConfigError
from reef.settings.section import DOTTED, Section, describe


class ShadowSettings(Section):
    """rollout.shadow (mode shadow): the candidate answers copies of a sample of calls, off the request
    path, and the copies are scored against the head's answers (reef.shadow)."""

    sample: float = Field(0.1, gt=0.0, le=1.0, description="share of calls copied to it")
    max_concurrency: int = Field(
        4, ge=1, description="shadow calls in flight per process; a copy beyond it is dropped"
    )
    scorer: str | None = Field(
        None,
        description="pkg.module:fn(completions, prompts=...) -> list[float] in [0, 1] scoring "
        "each answer; default gate.scorer, else the judge (judge.function or judge.url)",
    )

    @field_validator("scorer")
    @classmethod
    def _dotted(cls, v: str | None) -> str | None:
        if v is not None and not DOTTED.fullmatch(v):
            raise ValueError("shadow.scorer must be a dotted path pkg.module:function")
        return v


class ABSettings(Section):
    """rollout.ab (mode ab): a fixed, sticky split between two named releases, kept until an
    operator ends it (reef.rollouts)."""

    releases: tuple[str, ...] = Field(
        (), description="[a, b]: the two release ids compared (both on the scenario's chain)"
    )
    share: float = Field(0.5, gt=0.0, lt=1.0, description="share of sessions release b serves")

    @field_validator("releases")
    @classmethod
    def _pair(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if v and (len(v) != 2 or v[0] == v[1]):
            raise ValueError("ab.releases names two different release ids: [a, b]")
        return v


class RolloutSettings(Section):
    """rollout: how an accepted release reaches live traffic (reef.rollouts); `scenarios` overrides any
    key per scenario."""

    mode: Literal["immediate", "canary", "shadow", "ab"] = Field(
        "immediate",
        description="immediate: the head moves at once; canary: a sticky share of sessions "
        "first, promoted or rolled back by a sequential test on their reports; shadow: the "
        "candidate answers copies of calls, scored against the head's, and the same test "
        "decides; ab: a fixed split between ab.releases until an operator ends it",
    )
    shadow: ShadowSettings = ShadowSettings()
    ab: ABSettings = ABSettings()
    share: float = Field(0.1, gt=0.0, lt=1.0, description="canary: share of sessions it serves")
    sticky: str = Field(
        "session",
        pattern=r"^(session|user|tag:[A-Za-z0-9_.-]+)$",
        description="what keeps one arm: session (x-reef-session-id, else the conversation's "
        "first message), user (x-reef-user-id), or tag:<name>",
    )
    confidence: float = Field(
        0.95, gt=0.5, lt=1.0, description="the sequential test's confidence level"
    )
    margin: float = Field(0.0, ge=0.0, description="difference in mean score that counts")
    min_samples: int = Field(30, ge=1, description="reports per arm before a decision")
    max_duration_s: float = Field(
        24 * 3600.0, gt=0, description="a rollout still undecided this long is inconclusive"
    )
    on_inconclusive: Literal["promote", "rollback"] = Field(
        "rollback", description="what ends a rollout that reached max_duration_s undecided"
    )
    max_error_rate_increase: float = Field(
        0.05, ge=0.0, description="guardrail: canary error rate above the control's"
    )
    max_p95_ratio: float = Field(2.0, gt=1.0, description="guardrail: canary p95 / control's")
    guard_min_requests: int = Field(20, ge=1, description="guardrail: canary calls to judge")
    check_interval_s: float = Field(5.0, gt=0, description="how often live rollouts are checked")
    scenarios: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="per-scenario overrides of the keys above"
    )

    def for_scenario(self, name: str) -> RolloutSettings:
        """The rollout keys of scenario `name`: the defaults with its overrides."""
        override = self.scenarios.get(name)
        if not override:
            return self
        base = self.model_dump(exclude={"scenarios"})
        merged = {**base, **override}
        for section in ("shadow", "ab"):  # a section's keys override one by one
            if isinstance(override.get(section), dict):
                merged[section] = {**base[section], **override[section]}
        try:
            return RolloutSettings.model_validate(merged)
        except ValidationError as e:
            raise ConfigError(f"rollout.scenarios.{name}: {describe(e)}") from None
