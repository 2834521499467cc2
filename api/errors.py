"""The HTTP boundary of the error tree: every failure leaves as OpenAI-style error JSON."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from reef.api.auth import PRINCIPAL
from reef.errors import BadRequest, ReefError
from reef.records import new_id

log = logging.getLogger("reef.api")

_HTTP_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    421: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def error_body(err: ReefError, *, anthropic: bool = False) -> dict[str, Any]:
    """`{"error": {message, type, code, param}}`; Anthropic's routes add `"type": "error"`,
    which makes the same body parse as an Anthropic error too. The message is the error's
    public one (a store's failure does not name the database: the log has that)."""
    message = err.public_message()
    body: dict[str, Any] = {
        "error": {"message": message, "type": err.type, "code": err.code, "param": err.param}
    }
    if anthropic:
        body = {"type": "error", **body}
    return body


def error_response(err: ReefError, request: Request | None = None) -> Response:
    anthropic = request is not None and request.url.path.startswith("/v1/messages")
    retry = getattr(err, "retry_after_s", None)
    return Response(
        orjson.dumps(error_body(err, anthropic=anthropic)),
        status_code=err.status,
        media_type="application/json",
        headers={"retry-after": str(retry)} if retry is not None else None,
    )


def from_validation(
    err: ValidationError | RequestValidationError, what: str = "request body"
) -> BadRequest:
    """A pydantic error as one readable 400: each failing field with its reason."""
    problems = []
    first_param = None
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if p not in ("body",))
        first_param = first_param or loc or None
        problems.append(f"{loc}: {e['msg']}" if loc else e["msg"])
    return BadRequest(
        f"invalid {what}: " + "; ".join(problems), code="invalid_value", param=first_param
    )


_URI = re.compile(r"\b(?:file|s3)://[^\s'\"]*")


class Redactor:
    """Where the server keeps files, taken out of error messages for callers that are not
    admins (a scenario-scoped token, or a request that never authenticated): file:// and s3://
    uris, and the server's own directories (state dir, artifact root, model cache, working
    directory)."""

    def __init__(self, paths: Iterable[str | Path]):
        absolute = {str(p) for p in paths if Path(p).is_absolute() and len(str(p)) > 1}
        self._paths = sorted(absolute, key=len, reverse=True)  # longest (most specific) first

    def __call__(self, message: str) -> str:
        message = _URI.sub("<artifact>", message)
        for path in self._paths:
            message = message.replace(path, "<server>")
        return message


def _server_paths(app: FastAPI) -> list[Path]:
    svc = getattr(app.state, "services", None)
    if svc is None:
        return [Path.cwd()]
    settings = svc.settings
    paths = [settings.server.state_dir, settings.engine.model_cache, Path.cwd()]
    if "://" not in settings.artifacts_url:
        paths.append(Path(settings.artifacts_url))
    return [p.expanduser().resolve() for p in paths]


def install(app: FastAPI) -> None:
    metrics = app.state.services.metrics if hasattr(app.state, "services") else None
    redact = Redactor(_server_paths(app))

    def _count(err: ReefError) -> None:
        if metrics is not None:
            metrics.errors.labels(err.type, err.code or "").inc()

    def _respond(err: ReefError, request: Request) -> Response:
        principal = request.scope.get(PRINCIPAL)
        if principal is None or not principal.admin:
            err.message = redact(err.message)
        return error_response(err, request)

    async def on_reef_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ReefError)
        if exc.status >= 500:
            log.error("%s %s failed: %s", request.method, request.url.path, exc.message)
        _count(exc)
        return _respond(exc, request)

    async def on_validation(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        err = from_validation(exc, "request")
        _count(err)
        return _respond(err, request)

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        err = ReefError(str(exc.detail))
        err.status = exc.status_code
        err.type = _HTTP_TYPES.get(exc.status_code, "server_error")
        err.code = "not_found" if exc.status_code == 404 else None
        _count(err)
        return _respond(err, request)

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        # The exception's text can say anything (paths, values, a body): the log has it, the
        # caller gets a reference to find it there.
        ref = new_id("err")
        log.exception("unhandled error %s on %s %s", ref, request.method, request.url.path)
        err = ReefError(
            f"internal error (reference {ref}: the server's log has the details)",
            code="internal_error",
        )
        _count(err)
        return error_response(err, request)

    app.add_exception_handler(ReefError, on_reef_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(HTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)
