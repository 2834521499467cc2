"""OpenTelemetry export to a real OTLP/HTTP receiver on loopback, which decodes each request
with the official protobuf classes (opentelemetry-proto's ExportTraceServiceRequest): calls
made through the official openai SDK become GenAI spans (with their scenario, release and
record), a report becomes a span under the record it quotes and linked to each, the exporter's
counters reach /metrics, a full queue drops and counts, and with no endpoint the SDK is never
imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from reef.cli.testing import InProcessReef
from reef.otlp import OTLPTelemetry, record_span_ids
from reef.records import Record, Report, new_id, utcnow
from reef.settings import TelemetrySettings

ROOT = Path(__file__).resolve().parents[2]


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


class Receiver:
    """An OTLP/HTTP traces receiver: POST /v1/traces with a protobuf body, decoded with the
    official classes; `status` is what it answers (200, or a refusal)."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.requests: list[dict[str, str]] = []
        self.status = 200
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                request = ExportTraceServiceRequest.FromString(body)
                with receiver.lock:
                    receiver.requests.append(
                        {"path": self.path, **{k.lower(): v for k, v in self.headers.items()}}
                    )
                    if receiver.status == 200:
                        receiver.take(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(receiver.status)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self, request: ExportTraceServiceRequest) -> None:
        for resource in request.resource_spans:
            service = {a.key: _value(a.value) for a in resource.resource.attributes}
            for scope in resource.scope_spans:
                for span in scope.spans:
                    self.spans.append(
                        {
                            "name": span.name,
                            "kind": span.kind,
                            "trace_id": int.from_bytes(span.trace_id, "big"),
                            "span_id": int.from_bytes(span.span_id, "big"),
                            "parent_span_id": int.from_bytes(span.parent_span_id or b"\0", "big"),
                            "start": span.start_time_unix_nano,
                            "end": span.end_time_unix_nano,
                            "status": span.status.code,
                            "attributes": {a.key: _value(a.value) for a in span.attributes},
                            "links": [
                                (
                                    int.from_bytes(x.trace_id, "big"),
                                    int.from_bytes(x.span_id, "big"),
                                )
                                for x in span.links
                            ],
                            "resource": service,
                        }
                    )

    def wait(self, name: str, n: int = 1, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                found = [s for s in self.spans if s["name"] == name]
            if len(found) >= n:
                return found
            time.sleep(0.05)
        raise AssertionError(
            f"{n} span(s) {name!r} expected; got {[s['name'] for s in self.spans]}"
        )


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


def test_calls_and_reports_become_genai_spans(tmp_path: Path, receiver: Receiver) -> None:
    telemetry = {
        "otlp_endpoint": receiver.url,
        "otlp_headers": "authorization=Basic abc,x-tenant=reef",
        "service_name": "reef-test",
        "export_interval_s": 0.1,
    }
    with InProcessReef(tmp_path, telemetry=telemetry) as srv:
        client = openai.OpenAI(
            base_url=srv.base_url,
            api_key="unused",
            default_headers={"x-reef-scenario": "traced"},
        )
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0
        )
        answer = raw.parse()
        receipt, release = raw.headers["x-reef-agent-record-id"], raw.headers["x-reef-release-id"]
        with client.chat.completions.with_streaming_response.create(
            model="tiny", messages=[{"role": "user", "content": "Yo"}], max_tokens=3, stream=True
        ) as streamed:
            streamed_receipt = streamed.headers["x-reef-agent-record-id"]
            for _ in streamed.iter_lines():
                pass
        r = httpx.post(
            f"{srv.url}/reef/report",
            headers={"x-reef-scenario": "traced"},
            json={"score": 1.0, "references": [receipt, streamed_receipt]},
        )
        assert r.status_code == 201, r.text
        report_id = r.json()["id"]

        calls = receiver.wait("chat tiny", 2)
        (report,) = receiver.wait("reef.report")
        time.sleep(0.3)  # one more export interval: the counters follow the receiver's answer
        metrics = httpx.get(f"{srv.url}/metrics").text

    by_record = {s["attributes"]["reef.record_id"]: s for s in calls}
    span = by_record[receipt]
    a = span["attributes"]
    assert span["kind"] == Span.SpanKind.SPAN_KIND_SERVER
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "tiny"
    assert a["gen_ai.response.model"] == answer.model and a["gen_ai.response.id"] == answer.id
    assert answer.usage is not None
    assert a["gen_ai.usage.input_tokens"] == answer.usage.prompt_tokens > 0
    assert a["gen_ai.usage.output_tokens"] == answer.usage.completion_tokens > 0
    assert a["gen_ai.request.max_tokens"] == 4 and a["gen_ai.request.temperature"] == 0
    assert a["gen_ai.response.finish_reasons"] == [answer.choices[0].finish_reason]
    assert a["reef.scenario"] == "traced" and a["reef.release_id"] == release
    assert a["reef.stream"] is False and by_record[streamed_receipt]["attributes"]["reef.stream"]
    assert a["reef.timings.server_ms"] > 0 and span["end"] > span["start"] > 0
    assert "gen_ai.conversation.id" in a
    assert span["resource"]["service.name"] == "reef-test"
    # the ids follow from the receipt: whoever holds one can find its span
    assert (span["trace_id"], span["span_id"]) == record_span_ids(receipt)

    # the report: a child of the first record it quotes, linked to each
    assert report["attributes"]["reef.report_id"] == report_id
    assert report["attributes"]["reef.record_ids"] == [receipt, streamed_receipt]
    assert (report["trace_id"], report["parent_span_id"]) == record_span_ids(receipt)
    assert report["links"] == [record_span_ids(receipt), record_span_ids(streamed_receipt)]

    first = receiver.requests[0]
    assert first["path"] == "/v1/traces" and first["content-type"] == "application/x-protobuf"
    assert first["authorization"] == "Basic abc" and first["x-tenant"] == "reef"
    exported = _metric(metrics, "reef_otlp_spans_exported_total")
    assert exported >= 3 and _metric(metrics, "reef_otlp_spans_dropped_total") == 0
    assert _metric(metrics, "reef_otlp_spans_failed_total") == 0


def _metric(text: str, name: str) -> float:
    line = next(x for x in text.splitlines() if x.startswith(name + " "))
    return float(line.split()[1])


def _record(i: int) -> Record:
    return Record(
        id=new_id("rec"),
        scenario="q",
        created_at=utcnow(),
        route="chat.completions",
        model="m",
        stream=False,
        request={"messages": [{"role": "user", "content": str(i)}]},
        response={"model": "m", "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
        release_id="rel_1",
        timings={"server_ms": 1.5},
    )


def test_a_full_queue_drops_and_counts_and_refusals_count_as_failed(receiver: Receiver) -> None:
    settings = TelemetrySettings(otlp_endpoint=receiver.url, queue_size=3, batch_size=2)
    telemetry = OTLPTelemetry(settings)  # not started: only flush() exports
    try:
        telemetry.records([_record(i) for i in range(4)])
        telemetry.report(Report(new_id("rpt"), "q", utcnow(), ("rec_x",)))
        assert (telemetry.queued, telemetry.dropped) == (3, 2)
        telemetry.flush()
        assert telemetry.queued == 0 and telemetry.exported == 3
        assert {s["attributes"]["gen_ai.usage.input_tokens"] for s in receiver.spans} == {3}
        assert len(receiver.requests) == 2  # batches of batch_size

        receiver.status = 400  # a refusal that no retry would change
        telemetry.records([_record(9)])
        telemetry.flush()
        assert telemetry.failed == 1 and telemetry.exported == 3
    finally:
        telemetry.stop()


def test_off_means_the_sdk_is_never_imported(tmp_path: Path) -> None:
    """A server without an endpoint answers a call, and neither the OpenTelemetry SDK, its
    exporter nor reef.otlp was imported (checked in a fresh process)."""
    script = textwrap.dedent(
        f"""
        import sys, httpx
        from reef.cli.testing import InProcessReef
        with InProcessReef({str(tmp_path)!r}) as srv:
            r = httpx.post(
                f"{{srv.url}}/v1/chat/completions",
                json={{"model": "tiny", "messages": [{{"role": "user", "content": "hi"}}],
                      "max_tokens": 2}},
                timeout=60,
            )
            assert r.status_code == 200, r.text
            assert srv.settings.telemetry.otlp_endpoint is None
        loaded = [m for m in sys.modules
                  if m == "reef.otlp" or m.startswith(("opentelemetry.sdk", "opentelemetry.exporter"))]
        print("LOADED", loaded)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "LOADED []" in out.stdout, out.stdout
