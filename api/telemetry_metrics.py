"""The OTLP exporter's own numbers in /metrics (telemetry.otlp_endpoint set): spans exported,
dropped because the queue was full, lost in failed exports, and waiting now."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from reef.telemetry import Telemetry


class TelemetryCollector(Collector):
    """Reads the exporter's counters at each scrape (attributes: nothing waits)."""

    def __init__(self, telemetry: Telemetry):
        self.telemetry = telemetry

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        t = self.telemetry
        yield CounterMetricFamily(
            "reef_otlp_spans_exported", "Spans the OTLP receiver accepted", value=t.exported
        )
        yield CounterMetricFamily(
            "reef_otlp_spans_dropped",
            "Spans dropped because the export queue was full (telemetry.queue_size)",
            value=t.dropped,
        )
        yield CounterMetricFamily(
            "reef_otlp_spans_failed",
            "Spans in exports the receiver refused or never answered",
            value=t.failed,
        )
        yield GaugeMetricFamily("reef_otlp_queue_spans", "Spans waiting for export", value=t.queued)
