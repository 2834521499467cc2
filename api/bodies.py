"""Request bodies: size-capped reads, JSON parsing and validation into wire models."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from reef.api.errors import from_validation
from reef.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType
from reef.records import USER_TAG
from reef.wire import ID_PATTERN, RESERVED_TAG_PREFIX

M = TypeVar("M", bound=BaseModel)


def is_json(content_type: str | None) -> bool:
    """`application/json`, or any `+json` type, with or without parameters (charset)."""
    if not content_type:
        return False
    media = content_type.partition(";")[0].strip().lower()
    kind, _, subtype = media.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


async def capped_body(request: Request, limit: int) -> AsyncIterator[bytes]:
    """The body's chunks as they arrive; 413 past `limit` bytes, by the declared
    Content-Length at once and by what arrived while reading (a lying or missing one cannot
    make us take more)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body is {declared} bytes, above the cap of {limit} bytes")
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds the cap of {limit} bytes")
        yield chunk


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The body as a JSON object; 415 unless it says it is JSON (a web page can send
    text/plain to loopback without asking first, never application/json); 413 past `limit`
    bytes (checked while reading, so a lying or missing Content-Length cannot make us buffer
    more), 400 for anything but a JSON object."""
    content_type = request.headers.get("content-type")
    if not is_json(content_type):
        raise UnsupportedMediaType(
            f"send the body as JSON with 'Content-Type: application/json' (got "
            f"{repr(content_type[:100]) if content_type else 'none'})"
        )
    raw = b"".join([chunk async for chunk in capped_body(request, limit)])
    if not raw:
        raise BadRequest("request body is empty; expected a JSON object", code="invalid_json")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    return data


def validate(model: type[M], data: dict[str, Any]) -> M:
    """`data` as `model`. An integer field sent as a whole number with a fraction part (6.0,
    which JSON Schema counts as an integer) is set back into `data` as the int the model
    took, so what is forwarded (and checked against caps) is the same number as an int."""
    try:
        validated = model.model_validate(data)
    except ValidationError as e:
        raise from_validation(e) from None
    for key, value in data.items():
        if type(value) is float:
            taken = getattr(validated, key, value)
            if type(taken) is int:
                data[key] = taken
    return validated


_TAG_PREFIX = b"x-reef-tag-"
_RESERVED_TAG = (_TAG_PREFIX + RESERVED_TAG_PREFIX.encode()).lower()
_SESSION = b"x-reef-session-id"
_USER = b"x-reef-user-id"
_IDEMPOTENCY = b"idempotency-key"
_SESSION_ID = re.compile(ID_PATTERN)
# Printable ASCII, as Stripe and the IETF draft use it.
_IDEMPOTENCY_KEY = re.compile(r"^[\x20-\x7e]{1,255}$")


@dataclass(frozen=True)
class CallHeaders:
    """What an inference call's headers ask of Reef (beyond auth and scenario)."""

    tags: dict[str, str]
    session_id: str | None = None
    idempotency_key: str | None = None
    user_id: str | None = None  # the end user (recorded as the tag reef.user)


def call_headers(request: Request) -> CallHeaders:
    """`x-reef-tag-<name>: <value>` headers as the record's tags, `x-reef-session-id`,
    `x-reef-user-id` and `Idempotency-Key`, checked.

    Scans the raw ASGI header list (names arrive lower-cased) rather than building Starlette's
    Headers view: this runs on every inference call."""
    tags: dict[str, str] = {}
    session_id: str | None = None
    idempotency_key: str | None = None
    user_id: str | None = None
    for key, value in request.scope["headers"]:
        if key.startswith(_TAG_PREFIX) and len(key) > len(_TAG_PREFIX):
            if key.startswith(_RESERVED_TAG):
                raise BadRequest(
                    f"tags under '{RESERVED_TAG_PREFIX}' are Reef's own: "
                    f"drop the {key.decode('latin-1')} header",
                    code="reserved_tag",
                    param=key.decode("latin-1"),
                )
            if len(tags) >= 32 or len(value) > 512:
                raise BadRequest("at most 32 x-reef-tag-* headers of up to 512 characters each")
            tags[key[len(_TAG_PREFIX) :].decode("latin-1")] = value.decode("latin-1")
        elif key == _SESSION:
            session_id = value.decode("latin-1")
            if not _SESSION_ID.fullmatch(session_id):
                raise BadRequest(
                    "invalid x-reef-session-id: use 1-128 letters, digits, '.', '_', ':' or '-'",
                    code="invalid_session_id",
                )
        elif key == _IDEMPOTENCY:
            idempotency_key = value.decode("latin-1")
            if not _IDEMPOTENCY_KEY.fullmatch(idempotency_key):
                raise BadRequest(
                    "invalid Idempotency-Key: use 1-255 printable ASCII characters",
                    code="invalid_idempotency_key",
                )
        elif key == _USER:
            user_id = value.decode("latin-1")
            if not 0 < len(user_id) <= 512:
                raise BadRequest(
                    "invalid x-reef-user-id: use 1-512 characters",
                    code="invalid_user_id",
                    param="x-reef-user-id",
                )
    if user_id:  # who the call served: a slice of the experience (reef.select.users)
        tags[USER_TAG] = user_id
    return CallHeaders(tags, session_id, idempotency_key, user_id)
