"""The HTTP API against its own OpenAPI spec: schemathesis generates requests from the spec (valid
ones and, in the coverage phase, invalid ones) and sends them to a real server over HTTP; every
answer's status code, content type, headers and body must be what the spec says for it.

The spec is docs/openapi.json, the copy `reef openapi` writes (tests/api/test_openapi.py keeps
it current); the server fixture checks it is the spec the server serves.

The server has an admin token and a metrics token, as one off loopback would, so the 401s are
real answers too (`ignored_auth` sends each request without its token)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import Response, checks

from reef.api.auth import hash_token
from reef.cli.testing import InProcessReef

pytestmark = pytest.mark.contract  # 50 s to 2 min on 2 cores: `make test-contract`, a CI stage

SPEC = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
ADMIN = "contract-admin-token"
METRICS = "contract-metrics-token"
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.response_headers_conformance,
    checks.ignored_auth,
]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    state: Path = tmp_path_factory.mktemp("reef-contract")
    config = state / "serve.yaml"
    config.write_text(
        f"server:\n  max_body_bytes: 65536\n  max_tokens_cap: 16\n  metrics_token: {METRICS}\n"
        "engine:\n  default_max_tokens: 8\n"
        f"auth:\n  tokens:\n    - {{name: ops, sha256: {hash_token(ADMIN)}, admin: true}}\n"
    )
    with InProcessReef(state, config=config) as srv:
        served = httpx.get(f"{srv.url}/openapi.json").json()
        assert served == schema.raw_schema, "docs/openapi.json is stale: `reef openapi -o` it"
        yield srv


@schemathesis.serializer("application/x-ndjson")
def _jsonl(ctx: object, value: object) -> bytes:
    """A records:import body: each item of the generated array a line of JSON."""
    items = value if isinstance(value, list) else [value]
    return b"".join(json.dumps(item).encode() + b"\n" for item in items)


schema = schemathesis.openapi.from_path(
    SPEC,
    config=schemathesis.Config.from_dict(
        {
            "seed": 36,
            "phases": {"examples": {"enabled": True}, "coverage": {"enabled": True}},
            "generation": {"mode": "all", "max-examples": 12},
            # each operation's token, sent the way its security scheme says
            "auth": {
                "openapi": {
                    "bearerAuth": {"bearer": ADMIN},
                    "apiKey": {"api_key": ADMIN},
                    "metricsToken": {"bearer": METRICS},
                }
            },
        }
    ),
)


@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck))
def test_answers_conform_to_the_spec(case: schemathesis.Case, served: InProcessReef) -> None:
    if isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
        # the model this server serves (the spec cannot know it), so that generated calls
        # are answered and their answers checked, not only refused with 404
        case.body["model"] = "tiny"
    excluded = []
    if case.operation.path == "/reef/train":
        # its documented 503: no worker runs jobs on a test server
        excluded.append(checks.not_a_server_error)
    case.call_and_validate(base_url=served.url, checks=CHECKS, excluded_checks=excluded)


ANSWERED = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 4}),
]


def _call(path: str, method: str, served: InProcessReef, **kwargs: object) -> Response:
    """One request made by hand, its answer checked against the spec as the generated ones."""
    auth = {"authorization": f"Bearer {ADMIN}"}
    case = schema[path][method].Case(**kwargs)  # type: ignore[arg-type]
    case.headers = {**(case.headers or {}), **auth}
    return case.call_and_validate(
        base_url=served.url, checks=[c for c in CHECKS if c is not checks.ignored_auth]
    )


def _header(response: Response, name: str) -> str | None:
    values = {k.lower(): v for k, v in response.headers.items()}.get(name)
    return values[0] if values else None


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(("path", "body"), ANSWERED, ids=[p for p, _ in ANSWERED])
def test_answers_and_replays_conform(
    served: InProcessReef, path: str, body: dict[str, object], stream: bool
) -> None:
    """What generated requests rarely reach: answers in both media types, an idempotent
    replay (its extra header), and a stored response read back."""
    headers = {
        "x-reef-scenario": "contract",
        "Idempotency-Key": f"key-{path}-{stream}",
        "x-reef-tag-suite": "contract",
    }
    calls = [
        _call(
            path,
            "POST",
            served,
            body={**body, "model": "tiny", "stream": stream},
            headers=headers,
            media_type="application/json",
        )
        for _ in range(2)
    ]
    for r in calls:
        assert r.status_code == 200
        media_type = _header(r, "content-type") or ""
        assert media_type.startswith("text/event-stream" if stream else "application/json")
        assert _header(r, "x-reef-agent-record-id")
    assert _header(calls[0], "x-reef-idempotent-replay") is None
    assert _header(calls[1], "x-reef-idempotent-replay") == "true"
    if path == "/v1/responses" and not stream:
        stored = _call(
            "/v1/responses/{response_id}",
            "GET",
            served,
            path_parameters={"response_id": calls[0].json()["id"]},
            headers={"x-reef-scenario": "contract"},
        )
        assert stored.json() == calls[0].json()
