"""Prometheus metrics: one registry per app (no import-time globals) and a lean ASGI timer."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reef.admission import Admission
from reef.logs import REQUEST

_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
)


class _ByScenario:
    """A counter whose first label is the scenario, left out when /metrics may not name
    scenarios (server.metrics_scenario_labels): call sites stay `.labels(scenario, ...)`."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labels: list[str],
        registry: CollectorRegistry,
        scenario_labels: bool,
    ):
        self._named = scenario_labels
        names = ["scenario", *labels] if scenario_labels else labels
        self.counter = Counter(name, documentation, names, registry=registry)

    def labels(self, scenario: str, *rest: str) -> Any:
        if self._named:
            return self.counter.labels(scenario, *rest)
        return self.counter.labels(*rest) if rest else self.counter


class Metrics:
    """The process's metrics. `scenario_labels`: whether series name their scenario (off, a
    scrape shows totals only: scenario names are tenants' names, and /metrics is often open)."""

    def __init__(self, scenario_labels: bool = True) -> None:
        self.scenario_labels = scenario_labels
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "reef_http_requests_total",
            "HTTP requests",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "reef_http_request_seconds",
            "HTTP request latency (to the end of the body for streams)",
            ["route", "method", "status"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        by_scenario = scenario_labels
        self.tokens = _ByScenario(
            "reef_tokens_total", "Tokens served", ["kind"], self.registry, by_scenario
        )
        self.records = _ByScenario(
            "reef_records_written_total",
            "Records made durable",
            ["route"],
            self.registry,
            by_scenario,
        )
        self.idempotent_replays = _ByScenario(
            "reef_idempotent_replays_total",
            "Requests answered with the stored record of their Idempotency-Key",
            ["route"],
            self.registry,
            by_scenario,
        )
        self.reports = _ByScenario(
            "reef_reports_total", "Reports stored", [], self.registry, by_scenario
        )
        self.shadow = _ByScenario(
            "reef_shadow_calls_total",
            "Shadow rollout copies of calls, by outcome: scored, unscored, failed, or dropped "
            "(rollout.shadow.max_concurrency copies were in flight)",
            ["outcome"],
            self.registry,
            by_scenario,
        )
        self.errors = Counter(
            "reef_errors_total",
            "Errors answered, by error type",
            ["type", "code"],
            registry=self.registry,
        )

    def record_written(self, scenario: str, route: str, usage: dict[str, Any] | None) -> None:
        self.records.labels(scenario, route).inc()
        if usage:
            self.tokens.labels(scenario, "prompt").inc(
                usage.get("prompt_tokens") or usage.get("input_tokens") or 0
            )
            self.tokens.labels(scenario, "completion").inc(
                usage.get("completion_tokens") or usage.get("output_tokens") or 0
            )

    def render(self) -> bytes:
        return generate_latest(self.registry)


class AdmissionCollector(Collector):
    """The engine's line (reef.admission) in /metrics: the calls refused by reason, and the
    calls running and waiting now, read when scraped."""

    def __init__(self, admission: Admission):
        self.admission = admission

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        a = self.admission
        refused = CounterMetricFamily(
            "reef_engine_refused",
            "Calls answered 429 engine_busy instead of being run, by reason: queue_full (the "
            "line held engine.max_queue calls) or queue_wait (engine.max_queue_wait_s passed)",
            labels=["reason"],
        )
        for reason, count in sorted(a.refused.items()):
            refused.add_metric([reason], count)
        yield refused
        load = a.load()
        yield GaugeMetricFamily(
            "reef_engine_running", "Calls in the engine now (its running slots taken)", load.running
        )
        yield GaugeMetricFamily(
            "reef_engine_queue_depth", "Calls waiting in line for the engine now", load.waiting
        )
        yield GaugeMetricFamily(
            "reef_engine_max_running", "Calls the engine is given at once", load.max_running
        )
        if load.max_queue is not None:
            yield GaugeMetricFamily(
                "reef_engine_max_queue", "Calls that may wait for the engine", load.max_queue
            )


class MetricsMiddleware:
    """Times every request by its route template (not its raw path, to bound label cardinality)."""

    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        REQUEST.set(scope)  # this request's task: what it logs names it (reef.logs)
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            method = scope["method"]
            self.metrics.requests.labels(path, method, str(status)).inc()
            self.metrics.latency.labels(path, method, str(status)).observe(
                time.perf_counter() - start
            )
