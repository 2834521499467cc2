"""Prometheus metrics: one registry per app (no import-time globals) and a lean ASGI timer."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

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


class Metrics:
    def __init__(self) -> None:
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
        self.tokens = Counter(
            "reef_tokens_total", "Tokens served", ["scenario", "kind"], registry=self.registry
        )
        self.records = Counter(
            "reef_records_written_total",
            "Records made durable",
            ["scenario", "route"],
            registry=self.registry,
        )
        self.idempotent_replays = Counter(
            "reef_idempotent_replays_total",
            "Requests answered with the stored record of their Idempotency-Key",
            ["scenario", "route"],
            registry=self.registry,
        )
        self.reports = Counter(
            "reef_reports_total", "Reports stored", ["scenario"], registry=self.registry
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


class MetricsMiddleware:
    """Times every request by its route template (not its raw path, to bound label cardinality)."""

    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
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
