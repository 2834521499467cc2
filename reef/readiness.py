"""Readiness: whether a scenario has a batch of experience waiting for its recipe."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from reef.evaluation_pool import fraction, held_out
from reef.experience import collect, reports_of
from reef.judge import JudgeQuality, judge_quality
from reef.metrics import Tally
from reef.recipe import recipe_class
from reef.samples import Kind, check_kind
from reef.store.base import Store

if TYPE_CHECKING:
    from reef.artifacts import ArtifactStore
    from reef.settings import LoopSettings, Settings
    from reef.settings.metrics import MetricSettings


EMPTY_POOL = "the gate's evaluation pool is empty: waiting for a held-out sample to decide on"


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
    waiting: str | None = None  # why a full batch is not ready yet
    # why the judge's verdicts do not train now (judge.min_agreement not shown), if they do not
    judge_refused: str | None = None
    # each declared metric over the scenario's reports (reef.metrics.Tally)
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)


def readiness(
    store: Store,
    scenario: str,
    loop_settings: LoopSettings,
    recipe_kind: str | None = None,
    *,
    artifacts: ArtifactStore | None = None,
    holdout: float = 0.0,
    judge: bool = True,
    min_agreement: float | None = None,
    agreement_window: int = 50,
    metrics: Mapping[str, MetricSettings] | None = None,
) -> Readiness:
    """How many samples wait for the loop's recipe vs its batch size. No side effects.

    `holdout` is the share of samples that are evaluation samples (reef.evaluation_pool:
    `fraction(settings)`): they never train, so they count among the dropped, as "held_out",
    not toward the batch. With a share, a batch is ready only once the gate has at least one
    evaluation sample to decide on: a batch trained before that would be refused for want of
    evidence and its samples spent. `judge`: also the judge's record (a second read of the
    scenario's reports: for what shows it, not for deciding whether to evolve).
    `min_agreement` (judge.min_agreement): while the judge's agreement with people is not shown
    that high, its verdicts count for nothing (`judge_refused` says why). `metrics`: the
    scenario's declared metrics, summarized over its reports in the judge's read (with
    `judge` only: a check that decides whether to evolve does not read them)."""
    kind = check_kind(recipe_kind or recipe_class(loop_settings.recipe).kind)
    quality = None
    summarized: dict[str, dict[str, Any]] = {}
    if judge or min_agreement is not None:
        # the metrics are for what shows readiness (judge=True), counted in the same read
        tally = Tally(metrics if judge and metrics else {})
        quality = judge_quality(tally.watch(reports_of(store, scenario)), agreement_window)
        summarized = tally.summary()
    refused = judge_refusal(quality, min_agreement)
    exp = collect(
        store,
        scenario,
        kind,
        recipe=loop_settings.recipe,
        max_staleness=loop_settings.max_staleness,
        select=loop_settings.select.slice(),
        metric=loop_settings.metric,
        judgments=refused is None,
    )
    dropped = Counter(exp.dropped)
    trainable = [s for s in exp.samples if not held_out(s, holdout)]
    if len(trainable) < len(exp.samples):
        dropped["held_out"] = len(exp.samples) - len(trainable)
    last = None
    if artifacts is not None:
        from reef.datasets import last_materialization

        last = last_materialization(artifacts, scenario)
    judged = judge and quality is not None and (quality.judged or quality.dropped)
    full = len(trainable) >= loop_settings.batch_size
    no_evidence = holdout > 0 and len(trainable) == len(exp.samples)
    return Readiness(
        judge=quality if judged else None,
        waiting=EMPTY_POOL if full and no_evidence else None,
        judge_refused=refused,
        metrics=summarized,
        scenario=scenario,
        kind=kind,
        eligible=len(trainable),
        batch_size=loop_settings.batch_size,
        ready=full and not no_evidence,
        dropped=dropped,
        awaiting_feedback=exp.awaiting_feedback,
        last_materialization=last,
    )


def judge_refusal(quality: JudgeQuality | None, min_agreement: float | None) -> str | None:
    """Why the judge's verdicts may not train (judge.min_agreement), where it judged at all."""
    if quality is None or not quality.judged:
        return None
    return quality.trust(min_agreement)


def scenario_readiness(
    store: Store,
    scenario: str,
    settings: Settings,
    recipe_kind: str | None = None,
    *,
    artifacts: ArtifactStore | None = None,
    judge: bool = True,
) -> Readiness:
    """`readiness` with the scenario's own learning settings (`scenarios.<name>` and what was
    set at run time): its recipe, batch size, staleness, slice and its gate's held-out share."""
    from reef.scenario_settings import learning_settings

    own = learning_settings(settings, store, scenario)
    return own_readiness(store, scenario, own, recipe_kind, artifacts=artifacts, judge=judge)


def own_readiness(
    store: Store,
    scenario: str,
    own: Settings,
    recipe_kind: str | None = None,
    *,
    artifacts: ArtifactStore | None = None,
    judge: bool = True,
) -> Readiness:
    """`readiness` under `own`, a scenario's resolved settings (Settings.for_scenario): its
    loop, its gate's held-out share, its judge's agreement check and its declared metrics."""
    return readiness(
        store,
        scenario,
        own.reef,
        recipe_kind,
        artifacts=artifacts,
        holdout=fraction(own),
        judge=judge,
        min_agreement=own.judge.min_agreement,
        agreement_window=own.judge.agreement_window,
        metrics=own.metrics,
    )
