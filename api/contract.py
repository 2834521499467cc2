"""The HTTP API's OpenAPI contract: what each route declares, and how the spec is finished.

Most routes read their body themselves (size cap, strict validation, unknown fields passed
through), so FastAPI cannot see it. A route declares it with `reads(Model)` as its
`openapi_extra`: that puts the body in the operation and remembers the model, and `finish`
collects the schemas of every model the routes name (no hand-kept list to forget one in). The
headers a route reads (`x-reef-scenario`, `Idempotency-Key`, ...) are declared the same way.

`finish` then adds what follows from how every request is handled, so no route has to repeat
it: 421 from the Host guard on every route, 403 from its cross-site check on every write, 401
on every route that takes a token, 400/413/415 where a body is read, 400 where parameters are
checked (validation answers 400 in the error shape, never FastAPI's 422), and the error schema
on every 4xx and 5xx answer. The rest (404, 409, 429, 503, ...) each route declares with
`errors(...)`, only where it can answer them.
"""

from __future__ import annotations

import copy
from typing import Annotated, Any

from fastapi import Path, Query
from fastapi.routing import iter_route_contexts
from pydantic import BaseModel

from reef.wire import ID_PATTERN, SCENARIO_PATTERN, ErrorOut

REF = "#/components/schemas/"

# The scenario in a path or a query: the routes check the pattern themselves (400
# invalid_scenario, the same answer as for the header), so it is declared, not validated here.
ScenarioPath = Annotated[
    str, Path(description="a scenario's name", json_schema_extra={"pattern": SCENARIO_PATTERN})
]
ScenarioQuery = Annotated[
    str | None,
    Query(
        description="a scenario's name (default: the x-reef-scenario header's)",
        json_schema_extra={"pattern": SCENARIO_PATTERN},
    ),
]

# --- the headers a request may carry (components.parameters) ---------------------------------

SCENARIO = "Scenario"
IDEMPOTENCY_KEY = "IdempotencyKey"
SESSION_ID = "SessionId"
USER_ID = "UserId"
CALL_HEADERS = (SCENARIO, IDEMPOTENCY_KEY, SESSION_ID, USER_ID)

PARAMETERS: dict[str, dict[str, Any]] = {
    SCENARIO: {
        "name": "x-reef-scenario",
        "in": "header",
        "required": False,
        "description": "The scenario the call belongs to (default: server.default_scenario). "
        "The inference routes create it on first use.",
        "schema": {"type": "string", "pattern": SCENARIO_PATTERN},
    },
    IDEMPOTENCY_KEY: {
        "name": "Idempotency-Key",
        "in": "header",
        "required": False,
        "description": "A retry with the same key (in the same scenario) is answered with the "
        "stored answer, marked `x-reef-idempotent-replay: true`, and nothing is served or "
        "recorded again; the same key with another body is 409.",
        # printable ASCII; HTTP drops whitespace at either end, so the key neither starts nor
        # ends with a space
        "schema": {"type": "string", "pattern": r"^[\x21-\x7e]([\x20-\x7e]{0,253}[\x21-\x7e])?$"},
    },
    SESSION_ID: {
        "name": "x-reef-session-id",
        "in": "header",
        "required": False,
        "description": "The conversation this exchange belongs to (otherwise Reef finds it "
        "from the messages the request continues).",
        "schema": {"type": "string", "pattern": ID_PATTERN},
    },
    USER_ID: {
        "name": "x-reef-user-id",
        "in": "header",
        "required": False,
        "description": "The end user (1-512 characters): recorded as the tag `reef.user`, so "
        "`reef.select.users` can train on one user's turns; with `rollout.sticky: user` each "
        "user stays on one arm of a rollout.",
        "schema": {"type": "string"},
    },
}

TAGS_NOTE = (
    "\n\nTags: any number of headers `x-reef-tag-<name>: <value>` (names matching "
    "`^x-reef-tag-[^\\s:]+$`, at most 32, values up to 512 characters) become the record's "
    "tags. Names under `x-reef-tag-reef.` are Reef's own and refused (400). OpenAPI cannot "
    "describe a family of header names, so they are listed here and not as parameters."
)

# --- the headers an answer may carry (components.headers) ------------------------------------

HEADERS: dict[str, dict[str, Any]] = {
    "RecordId": {
        "description": "The receipt: the id of the record of this exchange (quote it in "
        "POST /reef/report).",
        "required": True,
        "schema": {"type": "string"},
    },
    "ReleaseId": {
        "description": "The release of the scenario that answered.",
        "required": True,
        "schema": {"type": "string"},
    },
    "IdempotentReplay": {
        "description": "Present on the stored answer to a retried Idempotency-Key.",
        "required": False,
        "schema": {"type": "string", "enum": ["true"]},
    },
    "RetryAfter": {
        "description": "Seconds until the quota's window that is full ends, or, for a busy "
        "engine, until its line has probably drained.",
        "required": True,
        "schema": {"type": "integer", "minimum": 0},
    },
}


def header_ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/headers/{name}"}


RECEIPT_HEADERS = {
    "x-reef-agent-record-id": header_ref("RecordId"),
    "x-reef-release-id": header_ref("ReleaseId"),
    "x-reef-idempotent-replay": header_ref("IdempotentReplay"),
}

# --- auth ------------------------------------------------------------------------------------

SECURITY_SCHEMES = {
    "bearerAuth": {
        "type": "http",
        "scheme": "bearer",
        "description": "An API token of auth.tokens (an admin's, or one bound to scenarios). "
        "Required once the server has tokens, and it must have them to listen beyond "
        "loopback; with none configured every caller is an admin.",
    },
    "apiKey": {
        "type": "apiKey",
        "in": "header",
        "name": "x-api-key",
        "description": "The same token, as Anthropic's clients send it.",
    },
    "metricsToken": {
        "type": "http",
        "scheme": "bearer",
        "description": "server.metrics_token, when one is set (/metrics only).",
    },
}
TOKEN: list[dict[str, list[str]]] = [{"bearerAuth": []}, {"apiKey": []}]
PUBLIC: dict[str, Any] = {"security": []}
METRICS: dict[str, Any] = {"security": [{"metricsToken": []}]}

# --- errors ----------------------------------------------------------------------------------

WHY = {
    400: "Invalid request: a body, parameter or header that does not validate",
    401: "Missing or unknown API token",
    403: "The token may not do this (another scenario, or it is not an admin's), or a "
    "cross-site request from a web page",
    404: "Not found",
    409: "Conflict with the stored state",
    413: "The body is larger than server.max_body_bytes",
    415: "The body is not sent as JSON",
    421: "The Host header names a server this one does not answer for",
    429: "The token's quota is spent for now (auth.tokens[].quota), or the engine is busy "
    "(code engine_busy: its line of waiting calls is full, engine.max_queue, or the call waited "
    "engine.max_queue_wait_s; it was not run, nothing is recorded); Retry-After says how long",
    500: "The engine failed while serving the request",
    502: "The upstream engine failed or could not be reached",
    503: "Something the request needs is not available now (the store, the engine, a worker)",
}
UPSTREAM_REFUSED: dict[int | str, dict[str, Any]] = {
    "4XX": {
        "description": "With an upstream engine: its refusal of the request, relayed with its "
        "status and message"
    }
}
_WRITES = frozenset({"post", "put", "patch", "delete"})


def errors(*statuses: int, **why: str) -> dict[int | str, dict[str, Any]]:
    """`responses` entries for the error statuses a route can answer (beyond those `finish`
    adds to every route of its kind); `why` overrides a description: `e409="..."`."""
    return {s: {"description": why.get(f"e{s}", WHY[s])} for s in statuses}


class Extra(dict[str, Any]):
    """A route's `openapi_extra` that also remembers the models it names."""

    def __init__(self, content: dict[str, Any], models: tuple[type[BaseModel], ...] = ()):
        super().__init__(content)
        self.models = models


def reads(
    body: type[BaseModel] | None = None,
    *,
    headers: tuple[str, ...] = (),
    optional: bool = False,
    description: str | None = None,
) -> Extra:
    """The `openapi_extra` of a route that reads its JSON body (`body`: the model it validates
    it with) or headers (names in PARAMETERS) itself."""
    content: dict[str, Any] = {}
    if body is not None:
        content["requestBody"] = {
            "required": not optional,
            "content": {"application/json": {"schema": {"$ref": REF + body.__name__}}},
        }
    if headers:
        content["parameters"] = [{"$ref": f"#/components/parameters/{h}"} for h in headers]
    if description is not None:
        content["description"] = description
    return Extra(content, (body,) if body is not None else ())


def events(description: str, *, named: bool, json: bool) -> dict[str, Any]:
    """The schema of one server-sent event of a stream (OpenAPI 3.1 describes an event stream
    by its events): its `data`, and its `event` name when the stream names them."""
    data: dict[str, Any] = {"type": "string"}
    if json:
        data["contentMediaType"] = "application/json"
    schema: dict[str, Any] = {
        "type": "object",
        "description": description,
        "required": ["event", "data"] if named else ["data"],
        "properties": {"data": data},
    }
    if named:
        schema["properties"]["event"] = {"type": "string"}
    return schema


def inference(
    model: type[BaseModel], stream: dict[str, Any], *statuses: int
) -> dict[int | str, dict[str, Any]]:
    """`responses` of an inference route: `model` as JSON or, with `stream: true`, server-sent
    events (`stream`: one event's schema); both carry the receipt headers."""
    return {
        200: {
            "model": model,
            "description": "The answer; with `stream: true`, its server-sent events",
            "headers": RECEIPT_HEADERS,
            "content": {"text/event-stream": {"schema": stream}},
        },
        **errors(*statuses),
        **UPSTREAM_REFUSED,
    }


def declared_models(routes: list[Any]) -> list[type[BaseModel]]:
    """The request models the routes declare (`reads`), each once, in route order."""
    seen: dict[type[BaseModel], None] = {}
    # the routes of included routers too, as FastAPI's own spec walks them
    for context in iter_route_contexts(routes):
        extra = getattr(context.original_route, "openapi_extra", None)
        if isinstance(extra, Extra):
            seen.update(dict.fromkeys(extra.models))
    return list(seen)


def _add_schema(schemas: dict[str, Any], model: type[BaseModel]) -> None:
    schema = model.model_json_schema(ref_template=REF + "{model}")
    schemas.update(schema.pop("$defs", {}))
    schemas[model.__name__] = schema


def _complete(method: str, op: dict[str, Any], default_security: list[Any]) -> None:
    """The statuses every operation of its kind can answer, and the error schema."""
    responses: dict[str, Any] = op.setdefault("responses", {})
    responses.pop("422", None)  # FastAPI's; validation answers 400
    implied = {421}
    if op.get("security", default_security):
        implied.add(401)
    if method in _WRITES:
        implied.add(403)
    if "requestBody" in op:
        implied |= {400, 413, 415}
    if op.get("parameters"):
        implied.add(400)
    for code in implied:
        responses.setdefault(str(code), {"description": WHY[code]})
    for status, answer in responses.items():
        if status[0] in "45" and "content" not in answer:
            answer["content"] = {"application/json": {"schema": {"$ref": REF + "ErrorOut"}}}
        if status == "429":
            answer.setdefault("headers", {})["retry-after"] = header_ref("RetryAfter")
    op["responses"] = dict(sorted(responses.items()))


def finish(spec: dict[str, Any], routes: list[Any]) -> dict[str, Any]:
    """FastAPI's spec made exact: the request models the routes declare, the shared
    parameters, headers and security schemes, and each operation's error answers."""
    components = spec.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for fastapi_only in ("HTTPValidationError", "ValidationError"):
        schemas.pop(fastapi_only, None)
    models: list[type[BaseModel]] = [ErrorOut, *declared_models(routes)]
    for model in models:
        _add_schema(schemas, model)
    components["parameters"] = copy.deepcopy(PARAMETERS)
    components["headers"] = copy.deepcopy(HEADERS)
    components["securitySchemes"] = copy.deepcopy(SECURITY_SCHEMES)
    spec["security"] = copy.deepcopy(TOKEN)
    for item in spec.get("paths", {}).values():
        for method, op in item.items():
            _complete(method, op, TOKEN)
    return spec
