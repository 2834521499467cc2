"""Experience readiness in /metrics: a Prometheus collector over every scenario's readiness."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from reef.artifacts import ArtifactStore
from reef.background import BackgroundTask
from reef.readiness import Readiness, scenario_readiness
from reef.settings import Settings
from reef.store.base import Store

log = logging.getLogger("reef.api")


class ReadinessCollector(Collector):
    """Readiness per scenario as gauges. Computing it costs a few queries per scenario (the
    reported records and one count), so a scrape never waits for it (the event loop renders
    /metrics): a scrape serves the last computed numbers and, when they are older than
    `interval_s`, triggers one refresh by its background task (`start()` / `stop()` it with
    the app). The first scrape after start therefore shows nothing yet.

    With `scenario_labels` off the gauges are totals over the scenarios (label `kind` only):
    eligible samples, records awaiting feedback and dropped samples summed, and
    `reef_experience_ready` counting the scenarios whose batch is ready."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        artifacts: ArtifactStore,
        interval_s: float = 15.0,
        scenario_labels: bool = True,
    ):
        self.store = store
        self.settings = settings  # each scenario's own learning settings (for_scenario)
        self.artifacts = artifacts
        self.interval_s = interval_s
        self.scenario_labels = scenario_labels
        self._lock = threading.Lock()
        self._refreshing = False
        self._at = float("-inf")
        self._values: list[Readiness] = []
        self.task = BackgroundTask("readiness-metrics", self.refresh)

    def start(self) -> None:
        self.task.start()

    def stop(self) -> None:
        self.task.stop()

    def refresh(self) -> None:
        """Recompute now (in the calling thread)."""
        try:
            values = [
                scenario_readiness(self.store, s.name, self.settings, artifacts=self.artifacts)
                for s in self.store.list_scenarios()
            ]
        except Exception:
            log.exception("computing experience readiness for /metrics failed")
            values = self._values
        with self._lock:
            self._values, self._at, self._refreshing = values, time.monotonic(), False

    def _maybe_refresh(self) -> None:
        with self._lock:
            if self._refreshing or time.monotonic() - self._at < self.interval_s:
                return
            self._refreshing = True
        self.task.trigger()

    def describe(self) -> list[GaugeMetricFamily]:
        return []  # computed lazily: nothing to describe at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self._maybe_refresh()
        with self._lock:
            values = list(self._values)
        if not self.scenario_labels:
            yield from self._totals(values)
            return
        labels = ["scenario", "kind"]
        eligible = GaugeMetricFamily(
            "reef_experience_eligible", "Samples waiting for the next batch", labels=labels
        )
        batch = GaugeMetricFamily(
            "reef_experience_batch_size", "Samples a batch needs (reef.batch_size)", labels=labels
        )
        ready = GaugeMetricFamily(
            "reef_experience_ready", "1 when eligible >= batch size", labels=labels
        )
        awaiting = GaugeMetricFamily(
            "reef_experience_awaiting_feedback", "Records no report quotes yet", labels=labels
        )
        dropped = GaugeMetricFamily(
            "reef_experience_dropped",
            "Samples left out of the experience, by reason",
            labels=[*labels, "reason"],
        )
        for r in values:
            key = [r.scenario, r.kind]
            eligible.add_metric(key, r.eligible)
            batch.add_metric(key, r.batch_size)
            ready.add_metric(key, 1.0 if r.ready else 0.0)
            awaiting.add_metric(key, r.awaiting_feedback)
            for reason, n in sorted(r.dropped.items()):
                dropped.add_metric([*key, reason], n)
        yield from (eligible, batch, ready, awaiting, dropped)
        yield from judge_gauges(values)

    def _totals(self, values: list[Readiness]) -> Iterator[GaugeMetricFamily]:
        labels = ["kind"]
        eligible = GaugeMetricFamily(
            "reef_experience_eligible", "Samples waiting for a batch, all scenarios", labels=labels
        )
        batch = GaugeMetricFamily(
            "reef_experience_batch_size", "Samples a batch needs (reef.batch_size)", labels=labels
        )
        ready = GaugeMetricFamily(
            "reef_experience_ready",
            "Scenarios whose eligible samples reach the batch size",
            labels=labels,
        )
        awaiting = GaugeMetricFamily(
            "reef_experience_awaiting_feedback",
            "Records no report quotes yet, all scenarios",
            labels=labels,
        )
        dropped = GaugeMetricFamily(
            "reef_experience_dropped",
            "Samples left out of the experience, by reason, all scenarios",
            labels=[*labels, "reason"],
        )
        for kind in sorted({r.kind for r in values}):
            of_kind = [r for r in values if r.kind == kind]
            eligible.add_metric([kind], sum(r.eligible for r in of_kind))
            batch.add_metric([kind], max(r.batch_size for r in of_kind))
            ready.add_metric([kind], sum(1 for r in of_kind if r.ready))
            awaiting.add_metric([kind], sum(r.awaiting_feedback for r in of_kind))
            reasons: Counter[str] = Counter()
            for r in of_kind:
                reasons.update(r.dropped)
            for reason, n in sorted(reasons.items()):
                dropped.add_metric([kind, reason], n)
        yield from (eligible, batch, ready, awaiting, dropped)


def judge_gauges(values: list[Readiness]) -> Iterator[GaugeMetricFamily]:
    """The judge's record per scenario (reef.judge.JudgeQuality), for scenarios it judged."""
    judged = GaugeMetricFamily("reef_judge_judged", "Turns the judge judged", labels=["scenario"])
    dropped = GaugeMetricFamily(
        "reef_judge_dropped",
        "Turns the judge could not judge after its retries, by reason",
        labels=["scenario", "reason"],
    )
    void = GaugeMetricFamily(
        "reef_judge_void_rate", "Share of judgments with no valid verdict", labels=["scenario"]
    )
    confidence = GaugeMetricFamily(
        "reef_judge_confidence_mean", "Mean confidence of the verdicts", labels=["scenario"]
    )
    agreement = GaugeMetricFamily(
        "reef_judge_agreement",
        "Share of verdicts that agree with a person's score on the same turn",
        labels=["scenario"],
    )
    compared = GaugeMetricFamily(
        "reef_judge_compared",
        "Turns with both a verdict and a person's decisive score",
        labels=["scenario"],
    )
    for r in values:
        q = r.judge
        if q is None:
            continue
        judged.add_metric([r.scenario], q.judged)
        for reason, n in sorted(q.dropped.items()):
            dropped.add_metric([r.scenario, reason], n)
        if q.void_rate is not None:
            void.add_metric([r.scenario], q.void_rate)
        if q.mean_confidence is not None:
            confidence.add_metric([r.scenario], q.mean_confidence)
        compared.add_metric([r.scenario], q.compared)
        if q.agreement is not None:
            agreement.add_metric([r.scenario], q.agreement)
    yield from (judged, dropped, void, confidence, agreement, compared)
