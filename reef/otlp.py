"""The OTLP exporter behind reef.telemetry: the official OpenTelemetry SDK and its OTLP/HTTP
(protobuf) span exporter, fed through one bounded queue per process.

Imported only when `telemetry.otlp_endpoint` is set. Callers hand over records, reports and
finished spans; nothing here builds a span on their thread except `span()`, which flows use
around their steps. A thread of its own turns what waits into spans (records into GenAI call
spans with the SDK's tracer, their ids derived from the record ids) and exports them in
batches of `batch_size`, every `export_interval_s` or as soon as a batch is full."""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator

from reef.background import BackgroundTask
from reef.records import Record, Report
from reef.settings.telemetry import TelemetrySettings

log = logging.getLogger(__name__)

Item = Record | Report | ReadableSpan

# The wire route of a record -> gen_ai.operation.name (every route Reef serves is a chat).
_OPERATIONS = {"chat.completions": "chat", "messages": "chat", "responses": "chat"}
_REQUEST_NUMBERS = {
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "max_output_tokens": "gen_ai.request.max_tokens",
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "seed": "gen_ai.request.seed",
}


class _Ids(IdGenerator):
    """Random ids, except for the span a thread has named its ids for (a record's)."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()
        self._forced = threading.local()

    @contextmanager
    def forced(self, trace_id: int, span_id: int) -> Iterator[None]:
        self._forced.ids = (trace_id, span_id)
        try:
            yield
        finally:
            self._forced.ids = None

    def generate_trace_id(self) -> int:
        ids = getattr(self._forced, "ids", None)
        return ids[0] if ids else self._random.generate_trace_id()

    def generate_span_id(self) -> int:
        ids = getattr(self._forced, "ids", None)
        return ids[1] if ids else self._random.generate_span_id()


def record_span_ids(record_id: str) -> tuple[int, int]:
    """The (trace id, span id) of the span of the call that made record `record_id`: derived
    from the id, so a report (or an operator holding a receipt) can point at it."""
    digest = hashlib.sha256(f"reef-record:{record_id}".encode()).digest()
    trace_id = int.from_bytes(digest[:16], "big") or 1
    span_id = int.from_bytes(digest[16:24], "big") or 1
    return trace_id, span_id


class _Handle:
    def __init__(self, span: trace.Span):
        self._span = span

    def set(self, attributes: Mapping[str, Any]) -> None:
        self._span.set_attributes({k: v for k, v in attributes.items() if v is not None})


class OTLPTelemetry(SpanProcessor):
    """reef.telemetry.Telemetry switched on: a bounded queue, an export thread and the
    OTLP/HTTP exporter.
    It is also the SDK tracer's span processor: a span that ends joins the queue (or, on the
    export thread, the batch being built)."""

    enabled = True

    def __init__(self, settings: TelemetrySettings):
        self.settings = settings
        self.dropped = self.exported = self.failed = 0
        self._queue: deque[Item] = deque()
        self._count_lock = threading.Lock()
        self._export_lock = threading.Lock()
        self._building = threading.local()  # the export thread's batch in the making
        self._ids = _Ids()
        resource = Resource.create({"service.name": settings.service_name})
        self._provider = TracerProvider(
            resource=resource, id_generator=self._ids, shutdown_on_exit=False
        )
        self._provider.add_span_processor(self)
        self._tracer = self._provider.get_tracer("reef")
        self._exporter = OTLPSpanExporter(
            endpoint=settings.traces_url,
            headers=settings.header_map(),
            timeout=settings.export_timeout_s,
        )
        self._task = BackgroundTask(
            "otlp-export", self._drain, every_s=settings.export_interval_s, last=self._drain
        )
        self._stopped = False

    # what callers hand over ---------------------------------------------------------------
    @property
    def queued(self) -> int:
        return len(self._queue)

    def records(self, records: Sequence[Record]) -> None:
        self._put(records)

    def report(self, report: Report) -> None:
        self._put((report,))

    @contextmanager
    def span(self, name: str, attributes: Mapping[str, Any] | None = None) -> Iterator[_Handle]:
        given = {k: v for k, v in (attributes or {}).items() if v is not None}
        with self._tracer.start_as_current_span(name, attributes=given) as span:
            yield _Handle(span)

    def _put(self, items: Sequence[Item]) -> None:
        room = self.settings.queue_size - len(self._queue)
        if room < len(items):
            with self._count_lock:
                self.dropped += len(items) - max(room, 0)
            items = items[: max(room, 0)]
        self._queue.extend(items)
        if len(self._queue) >= self.settings.batch_size:
            self._task.trigger()

    # SpanProcessor ------------------------------------------------------------------------
    def on_end(self, span: ReadableSpan) -> None:
        batch = getattr(self._building, "batch", None)
        if batch is not None:
            batch.append(span)
        else:
            self._put((span,))

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.flush(timeout_millis / 1000)
        return True

    # life ---------------------------------------------------------------------------------
    def start(self) -> None:
        self._task.start()

    def flush(self, timeout_s: float = 10.0) -> None:
        self._drain()

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._task.stop()  # its `last` exports what still waits
        self._exporter.shutdown()

    # the export thread --------------------------------------------------------------------
    def _drain(self) -> None:
        """Export everything waiting, a batch at a time."""
        with self._export_lock:
            while self._queue:
                n = min(len(self._queue), self.settings.batch_size)
                items = [self._queue.popleft() for _ in range(n)]
                self._export(self._spans(items))

    def _spans(self, items: list[Item]) -> list[ReadableSpan]:
        self._building.batch = spans = []
        try:
            for item in items:
                try:
                    if isinstance(item, Record):
                        self._record_span(item)
                    elif isinstance(item, Report):
                        self._report_span(item)
                    else:
                        spans.append(item)
                except Exception:  # one odd record never costs the batch
                    log.exception("telemetry: no span for %r", getattr(item, "id", item))
        finally:
            self._building.batch = None
        return spans

    def _export(self, spans: list[ReadableSpan]) -> None:
        if not spans:
            return
        try:
            ok = self._exporter.export(spans) == SpanExportResult.SUCCESS
        except Exception as e:  # the exporter's own failure: counted like a refusal
            log.warning("telemetry: exporting %d spans failed: %s", len(spans), e)
            ok = False
        with self._count_lock:
            if ok:
                self.exported += len(spans)
            else:
                self.failed += len(spans)

    def _record_span(self, record: Record) -> None:
        end_ns = int(record.created_at.timestamp() * 1e9)
        start_ns = end_ns - int(float(record.timings.get("server_ms", 0.0)) * 1e6)
        attributes = record_attributes(record)
        name = f"{attributes['gen_ai.operation.name']} {record.model}".strip()
        with self._ids.forced(*record_span_ids(record.id)):
            span = self._tracer.start_span(
                name,
                context=otel_context.Context(),  # a trace of its own
                kind=trace.SpanKind.SERVER,
                attributes=attributes,
                start_time=start_ns,
            )
        span.end(end_time=end_ns)

    def _report_span(self, report: Report) -> None:
        contexts = [_record_context(r) for r in report.references]
        parent = otel_context.Context()
        if contexts:  # a child of the first record's span, linked to each
            parent = trace.set_span_in_context(trace.NonRecordingSpan(contexts[0]))
        at_ns = int(report.created_at.timestamp() * 1e9)
        attributes: dict[str, Any] = {
            "reef.scenario": report.scenario,
            "reef.report_id": report.id,
            "reef.record_ids": list(report.references),
        }
        if report.score is not None:
            attributes["reef.report.score"] = float(report.score)
        span = self._tracer.start_span(
            "reef.report",
            context=parent,
            attributes=attributes,
            links=[trace.Link(c) for c in contexts],
            start_time=at_ns,
        )
        span.end(end_time=at_ns)


def _record_context(record_id: str) -> trace.SpanContext:
    trace_id, span_id = record_span_ids(record_id)
    return trace.SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED)
    )


def record_attributes(record: Record) -> dict[str, Any]:
    """A record's call span attributes: the GenAI conventions' and Reef's own."""
    response, request = record.response or {}, record.request or {}
    out: dict[str, Any] = {
        "gen_ai.operation.name": _OPERATIONS.get(record.route, "chat"),
        "gen_ai.provider.name": "reef",
        "gen_ai.request.model": record.model,
        "reef.scenario": record.scenario,
        "reef.release_id": record.release_id,
        "reef.record_id": record.id,
        "reef.route": record.route,
        "reef.stream": record.stream,
    }
    for key, name in _REQUEST_NUMBERS.items():
        value = request.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = value
    if isinstance(response.get("model"), str):
        out["gen_ai.response.model"] = response["model"]
    if isinstance(response.get("id"), str):
        out["gen_ai.response.id"] = response["id"]
    input_tokens, output_tokens = _usage(record)
    if input_tokens is not None:
        out["gen_ai.usage.input_tokens"] = input_tokens
    if output_tokens is not None:
        out["gen_ai.usage.output_tokens"] = output_tokens
    reasons = _finish_reasons(response)
    if reasons:
        out["gen_ai.response.finish_reasons"] = reasons
    if record.session_id is not None:
        out["gen_ai.conversation.id"] = record.session_id
        out["reef.session.turn"] = record.turn if record.turn is not None else 0
    for key, value in record.timings.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f"reef.timings.{key}"] = float(value)
    return out


def _usage(record: Record) -> tuple[int | None, int | None]:
    """(input, output) tokens: the answer's usage (OpenAI's or Anthropic's names), else the
    token ids the engine recorded."""
    usage = (record.response or {}).get("usage") or {}
    given_in = usage.get("prompt_tokens", usage.get("input_tokens"))
    given_out = usage.get("completion_tokens", usage.get("output_tokens"))
    if not isinstance(given_in, int):
        given_in = len(record.prompt_token_ids) if record.prompt_token_ids is not None else None
    if not isinstance(given_out, int):
        ids = record.completion_token_ids
        given_out = len(ids) if ids is not None else None
    return given_in, given_out


def _finish_reasons(response: dict[str, Any]) -> list[str]:
    reasons: list[str] = [
        str(c["finish_reason"])
        for c in response.get("choices") or []
        if isinstance(c, dict) and isinstance(c.get("finish_reason"), str)
    ]
    if isinstance(response.get("stop_reason"), str):  # Anthropic's
        reasons.append(response["stop_reason"])
    if isinstance(response.get("status"), str) and response.get("object") == "response":
        reasons.append(response["status"])  # Responses'
    return reasons
