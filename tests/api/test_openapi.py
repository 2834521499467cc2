"""The OpenAPI spec as a document: valid OpenAPI 3.1, every reference resolved, and saying what
the routes really read and answer (the request bodies they validate, the headers they read,
auth, streaming, the error shape). tests/api/test_conformance.py checks the answers of a real
server against it; tests/api/test_health.py keeps docs/openapi.json current."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute, iter_route_contexts
from openapi_spec_validator import validate

from reef.api.app import create_app
from reef.api.contract import Extra
from reef.engines.upstream import UpstreamEngine
from reef.settings import load_settings

INFERENCE = ("/v1/chat/completions", "/v1/messages", "/v1/responses")


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    # what `reef openapi` builds: an app, never started
    settings = load_settings(None, server={"state_dir": str(tmp_path_factory.mktemp("spec"))})
    return create_app(settings, UpstreamEngine("http://127.0.0.1:9/v1", model="reef"))


@pytest.fixture(scope="module")
def spec(app: FastAPI) -> dict[str, Any]:
    return app.openapi()


def _operations(spec: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in spec["paths"].items():
        for method, op in item.items():
            yield path, method, op


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def test_the_spec_is_valid_openapi(spec: dict[str, Any]) -> None:
    validate(spec)
    assert spec["openapi"].startswith("3.1")


def test_every_reference_resolves(spec: dict[str, Any]) -> None:
    # openapi-spec-validator does not follow every $ref (a request body's dangled unseen)
    refs = set(_refs(spec))
    assert refs
    for ref in refs:
        node: Any = spec
        for part in ref.removeprefix("#/").split("/"):
            assert isinstance(node, dict) and part in node, f"dangling {ref}"
            node = node[part]


def test_no_422_and_errors_carry_the_error_schema(spec: dict[str, Any]) -> None:
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    for path, method, op in _operations(spec):
        assert "422" not in op["responses"], (method, path)
        assert "421" in op["responses"], (method, path)  # the Host guard answers everywhere
        if "requestBody" in op:
            assert {"400", "413", "415"} <= op["responses"].keys(), (method, path)
        for status, answer in op["responses"].items():
            if status[0] == "4" or (status[0] == "5" and path != "/readyz"):
                schema = answer["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorOut"}, (method, path, status)
    error = spec["components"]["schemas"]["ErrorDetail"]
    assert set(error["required"]) == {"message", "type"}


def _routes(app: FastAPI) -> Iterator[APIRoute]:
    for context in iter_route_contexts(app.routes):
        route = context.original_route
        if isinstance(route, APIRoute) and route.include_in_schema:
            yield route


def test_request_bodies_are_the_models_the_routes_validate_with(
    app: FastAPI, spec: dict[str, Any]
) -> None:
    """A route that reads its body declares the model it validates it with (`reads`), and the
    spec's body is that model's schema: they cannot drift apart."""
    checked = 0
    for route in _routes(app):
        source = inspect.getsource(route.endpoint)
        validated = set(re.findall(r"\bvalidate\(\s*(\w+)", source))
        extra = route.openapi_extra
        declared = {m.__name__ for m in extra.models} if isinstance(extra, Extra) else set()
        assert validated == declared, route.path
        for method in route.methods:
            op = spec["paths"][route.path_format][method.lower()]
            if validated:
                (name,) = validated
                body = op["requestBody"]["content"]["application/json"]["schema"]
                assert body == {"$ref": f"#/components/schemas/{name}"}, route.path
                assert name in spec["components"]["schemas"]
                checked += 1
            elif "requestBody" in op:  # a body streamed as it is (JSONL), not a JSON model
                content = op["requestBody"]["content"]
                assert "capped_body(request" in source, route.path  # api.bodies: streamed
                assert list(content) == ["application/x-ndjson"], route.path
    assert checked >= 17  # every body-reading route, the harness, train and generate included
    for name in ("HarnessIn", "TrainIn", "EngineGenerateIn", "RolloutAbort", "RolloutPromote"):
        assert name in spec["components"]["schemas"], name


def test_inference_routes_declare_headers_streams_and_answers(spec: dict[str, Any]) -> None:
    components = spec["components"]
    for path in INFERENCE:
        op = spec["paths"][path]["post"]
        headers = {
            components["parameters"][p["$ref"].rsplit("/", 1)[1]]["name"] for p in op["parameters"]
        }
        assert headers == {
            "x-reef-scenario",
            "Idempotency-Key",
            "x-reef-session-id",
            "x-reef-user-id",
        }
        assert "x-reef-tag-" in op["description"]  # a family of names: described, not listed
        ok = op["responses"]["200"]
        assert set(ok["content"]) == {"application/json", "text/event-stream"}
        schema = ok["content"]["application/json"]["schema"]
        assert schema["$ref"].rsplit("/", 1)[1] in components["schemas"]
        assert set(ok["headers"]) == {
            "x-reef-agent-record-id",
            "x-reef-release-id",
            "x-reef-idempotent-replay",
        }
        assert "retry-after" in op["responses"]["429"]["headers"]
    for name in ("ChatCompletionOut", "AnthropicMessageOut", "ResponseObject"):
        assert components["schemas"][name]["required"], name


def test_auth_is_declared(spec: dict[str, Any]) -> None:
    schemes = spec["components"]["securitySchemes"]
    assert schemes["bearerAuth"] == {**schemes["bearerAuth"], "type": "http", "scheme": "bearer"}
    assert schemes["apiKey"]["name"] == "x-api-key"
    assert spec["security"] == [{"bearerAuth": []}, {"apiKey": []}]
    public = {p for p, _, op in _operations(spec) if op.get("security") == []}
    assert public == {"/healthz", "/readyz"}
    assert spec["paths"]["/metrics"]["get"]["security"] == [{"metricsToken": []}]
    for path, method, op in _operations(spec):
        assert ("401" in op["responses"]) == (path not in public), (method, path)


def test_metrics_are_prometheus_text(spec: dict[str, Any]) -> None:
    ok = spec["paths"]["/metrics"]["get"]["responses"]["200"]
    assert set(ok["content"]) == {"text/plain"}
