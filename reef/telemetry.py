"""OpenTelemetry traces, when `telemetry.otlp_endpoint` is set: what each process hands over to
be exported. Off, everything here does nothing and the OpenTelemetry SDK is never imported
(reef.otlp, the exporter, is imported only to switch it on).

What becomes a span:

- each inference call, from its durable record (the group committer hands each committed
  batch over, after its waiters were answered): `chat <model>`, following the OpenTelemetry
  GenAI conventions (gen_ai.operation.name, gen_ai.request.model, gen_ai.response.model,
  gen_ai.usage.input_tokens / output_tokens, ...) with reef.scenario, reef.release_id,
  reef.record_id and the call's timings. Its trace and span ids are derived from the record
  id (reef.otlp.record_span_ids), so anything that knows a receipt can point at its span;
- each report: `reef.report`, a child of the first record it quotes and linked to each;
- each evolve run and its four steps, in the worker (`span`): `reef.evolve` and
  `reef.evolve.<step>`, with the scenario, the candidate, the gate's verdict and the release.

Spans wait in one bounded queue per process and leave in batches from a thread of their own,
never on a request's path; a span that finds the queue full is dropped and counted (/metrics:
reef_otlp_spans_dropped_total)."""

from __future__ import annotations

import atexit
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

from reef.records import Record, Report
from reef.settings.telemetry import TelemetrySettings


class SpanHandle(Protocol):
    """A span in progress, as `Telemetry.span` yields it."""

    def set(self, attributes: Mapping[str, Any]) -> None:
        """Add attributes (a None value is left out)."""
        ...


class Telemetry(Protocol):
    """What a process hands to its exporter: OFF (telemetry switched off: every method does
    nothing), or reef.otlp.OTLPTelemetry, which exports."""

    enabled: bool
    dropped: int  # spans dropped: the queue was full
    exported: int  # spans the receiver took
    failed: int  # spans in exports that failed (the receiver down or refusing)

    @property
    def queued(self) -> int:
        """Spans waiting for export."""
        ...

    def records(self, records: Sequence[Record]) -> None:
        """Committed records, each to become its inference call's span."""
        ...

    def report(self, report: Report) -> None:
        """A stored report, to become a span that points at the records it quotes."""
        ...

    def span(
        self, name: str, attributes: Mapping[str, Any] | None = None
    ) -> AbstractContextManager[SpanHandle]:
        """A span around the block (a child of the span around it, in this thread); an
        exception leaving the block marks it failed."""
        ...

    def start(self) -> None: ...

    def flush(self, timeout_s: float = 10.0) -> None:
        """Export what waits now, in the caller's thread (a worker before its run ends)."""
        ...

    def stop(self) -> None:
        """Export what waits, then stop."""
        ...


class _NoSpan:
    def set(self, attributes: Mapping[str, Any]) -> None:
        pass


class _Off:
    """Telemetry switched off: nothing is kept, nothing imported."""

    enabled = False
    dropped = exported = failed = 0
    queued = 0

    def records(self, records: Sequence[Record]) -> None:
        pass

    def report(self, report: Report) -> None:
        pass

    @contextmanager
    def span(self, name: str, attributes: Mapping[str, Any] | None = None) -> Iterator[SpanHandle]:
        yield _NO_SPAN

    def start(self) -> None:
        pass

    def flush(self, timeout_s: float = 10.0) -> None:
        pass

    def stop(self) -> None:
        pass


_NO_SPAN = _NoSpan()
OFF: Telemetry = _Off()


def telemetry_for(settings: TelemetrySettings) -> Telemetry:
    """A new exporter for `settings` (not started), or OFF without an endpoint."""
    if settings.otlp_endpoint is None:
        return OFF
    from reef.otlp import OTLPTelemetry

    return OTLPTelemetry(settings)


_process: dict[tuple[str, str, str], Telemetry] = {}
_process_lock = threading.Lock()


def for_process(settings: TelemetrySettings) -> Telemetry:
    """This process's exporter for `settings`, started on first use and flushed at exit: for
    flows, which run in whatever process a worker gives them. OFF without an endpoint."""
    if settings.otlp_endpoint is None:
        return OFF
    headers = settings.otlp_headers.get_secret_value() if settings.otlp_headers else ""
    key = (settings.traces_url or "", headers, settings.service_name)
    with _process_lock:
        found = _process.get(key)
        if found is None:
            found = _process[key] = telemetry_for(settings)
            found.start()
            atexit.register(found.stop)
    return found
