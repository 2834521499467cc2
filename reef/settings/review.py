"""review: the annotation queue of each scenario, the turns people are asked to review in the
dashboard, and the policies that fill it (set per scenario under `scenarios.<name>.review`)."""

from __future__ import annotations

from pydantic import Field

from reef.settings.section import Section


class ReviewSettings(Section):
    """review: which turns enter a scenario's annotation queue (any policy that matches adds
    the turn once) and how long a reviewer's claim on an item lasts."""

    sample: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="a random share of the scenario's turns (0.1: one in ten), chosen by the "
        "turn's id so every replica picks the same",
    )
    unsure_below: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="turns whose judgment is less sure than this (its confidence: the share "
        "of a generating judge's votes for its verdict, a vote split, or a likelihood judge's "
        "probability of it); null: none",
    )
    disagreement: bool = Field(
        False,
        description="turns where the judge's verdict and a person's score disagree (+1 against "
        "a score under 0.5, -1 against one of 0.5 or more)",
    )
    canary: bool = Field(
        False, description="turns served by a candidate in canary (rollout.canary_share)"
    )
    guard_failed: bool = Field(
        False,
        description="answers a candidate gave to a gate guard's tasks that the guard's scorer "
        "failed (scored below 1), kept at the gate as records tagged reef.guard (never served "
        "traffic) and queued with reason guard; a correction of one trains as any correction",
    )
    scan: int = Field(
        500, ge=1, le=10_000, description="the most recent turns each fill of the queue looks at"
    )
    lease_s: int = Field(
        900,
        ge=10,
        description="how long a reviewer holds the item they took; after it anyone may take it",
    )

    @property
    def active(self) -> bool:
        """Whether any policy picks from the recent turns (a fill has something to look for).
        `guard_failed` is not one: the gate queues its answers as it keeps them
        (reef.guard_answers)."""
        return bool(
            self.sample or self.unsure_below is not None or self.disagreement or self.canary
        )
