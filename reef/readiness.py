"""Readiness: whether a scenario has a batch of experience waiting for its recipe."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reef.experience import collect, reports_of
from reef.judge import JudgeQuality, judge_quality
from reef.recipe import recipe_class
from reef.samples import Kind, check_kind
from reef.store.base import Store

if TYPE_CHECKING:
    from reef.artifacts import ArtifactStore
    from reef.settings import LoopSettings


@dataclass(frozen=True)
class Readiness:
    """Whether a scenario has a batch waiting for its recipe (computed, never stored)."""

    scenario: str
    kind: Kind
    eligible: int
    batch_size: int
    ready: bool
    dropped: Counter[str]
    awaiting_feedback: int
    last_materialization: dict[str, Any] | None
    judge: JudgeQuality | None = None  # None: the scenario has no judgment yet


def readiness(
    store: Store,
    scenario: str,
    loop_settings: LoopSettings,
    recipe_kind: str | None = None,
    *,
    artifacts: ArtifactStore | None = None,
) -> Readiness:
    """How many samples wait for the loop's recipe vs its batch size. No side effects."""
    kind = check_kind(recipe_kind or recipe_class(loop_settings.recipe).kind)
    exp = collect(
        store,
        scenario,
        kind,
        recipe=loop_settings.recipe,
        max_staleness=loop_settings.max_staleness,
    )
    last = None
    if artifacts is not None:
        from reef.datasets import last_materialization

        last = last_materialization(artifacts, scenario)
    quality = judge_quality(reports_of(store, scenario))
    judged = quality.judged or quality.dropped
    return Readiness(
        judge=quality if judged else None,
        scenario=scenario,
        kind=kind,
        eligible=len(exp.samples),
        batch_size=loop_settings.batch_size,
        ready=len(exp.samples) >= loop_settings.batch_size,
        dropped=exp.dropped,
        awaiting_feedback=exp.awaiting_feedback,
        last_materialization=last,
    )
