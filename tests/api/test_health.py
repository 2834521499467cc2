"""Liveness, readiness, metrics and the published OpenAPI spec."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from reef.cli.testing import InProcessReef


def test_healthz_and_readyz(server: InProcessReef) -> None:
    assert httpx.get(f"{server.url}/healthz").json() == {"status": "ok"}
    r = httpx.get(f"{server.url}/readyz")
    assert r.status_code == 200
    assert r.json() == {
        "status": "ready",
        "dependencies": {
            "store": {"state": "ok", "needed_to": "serve"},
            "engine": {"state": "ok", "needed_to": "serve"},
            "artifact_store": {"state": "ok", "needed_to": "learn"},
            "mlflow": {"state": "ok", "needed_to": "learn"},
            "worker": {"state": "off", "needed_to": "learn"},  # reef.auto is off here
        },
    }


def test_metrics_count_requests_tokens_records_and_errors(
    server: InProcessReef, scenario: str
) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    httpx.post(
        f"{server.url}/v1/chat/completions", json=body, headers={"x-reef-scenario": scenario}
    )
    httpx.post(
        f"{server.url}/v1/chat/completions",
        json={**body, "model": "nope"},
        headers={"x-reef-scenario": scenario},
    )
    text = httpx.get(f"{server.url}/metrics").text
    assert (
        f'reef_records_written_total{{route="chat.completions",scenario="{scenario}"}} 1.0' in text
    )
    assert f'reef_tokens_total{{kind="completion",scenario="{scenario}"}}' in text
    assert (
        'reef_http_requests_total{method="POST",route="/v1/chat/completions",status="200"}' in text
    )
    assert (
        'reef_http_requests_total{method="POST",route="/v1/chat/completions",status="404"}' in text
    )
    assert 'reef_errors_total{code="model_not_found",type="not_found_error"}' in text
    assert (
        'reef_http_request_seconds_bucket{le="0.5",method="POST",route="/v1/chat/completions",status="200"}'
        in text
    )


def test_openapi_spec_documents_the_routes(server: InProcessReef) -> None:
    spec = httpx.get(f"{server.url}/openapi.json").json()
    for path in (
        "/v1/chat/completions",
        "/v1/messages",
        "/v1/models",
        "/reef/report",
        "/reef/scenarios",
    ):
        assert path in spec["paths"], path
    body = spec["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"][
        "application/json"
    ]
    assert body["schema"]["$ref"] == "#/components/schemas/ChatCompletionRequest"
    assert "messages" in spec["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert "references" in spec["components"]["schemas"]["ReportIn"]["properties"]


def test_committed_openapi_copy_is_current(tmp_path: Path) -> None:
    """docs/openapi.json is what `reef openapi` prints; regenerate it with
    `.venv/bin/reef openapi -o docs/openapi.json` after changing a route."""
    from reef.cli.main import main

    assert main(["openapi", "-o", str(tmp_path / "spec.json")]) == 0
    fresh = json.loads((tmp_path / "spec.json").read_text())
    committed = json.loads(
        (Path(__file__).resolve().parents[2] / "docs" / "openapi.json").read_text()
    )
    assert fresh == committed
