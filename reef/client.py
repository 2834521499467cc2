"""A Python client for Reef's own routes: report feedback on receipts, read records and releases.

    from reef.client import Reef

    reef = Reef("http://127.0.0.1:8900", scenario="support-bot")  # api_key: $REEF_API_KEY
    reef.report(receipt, score=1.0, feedback={"correction": "Paris."}, report_id="judge-42")
    page = reef.records(limit=10)          # RecordList: data, has_more, last_id
    reports = reef.reports().data          # ReportOut: score, feedback, references, ...
    turns = reef.session(page.data[0].session_id).data
    head = next(r for r in reef.releases().data if r.current)

`AsyncReef` has the same methods, awaited. Bodies are checked and answers parsed with the API's
own models (reef.wire: `ReportIn`, `ReportOut`, `RecordList`, `ReleaseList`), so a report the
server would refuse for its shape is refused here, before it is sent.

A 429 or 503 answer, and a connection that could not be opened, are tried again (`max_retries`
times) after the server's `Retry-After` when it sends one, else after an exponential backoff
with jitter; a `Retry-After` longer than `max_backoff_s` is not waited for: the error is raised
at once. Nothing else is retried: a request that reached the server may have been stored (give
`report_id` to make a report safe to send again: the same id and content answer 200).

Errors are `reef.errors.ReefError`s: `ReefAPIError` (the server's status, type, code, param
and message) and `ReefConnectionError`; a report of the wrong shape is a `BadRequest`.

Only httpx and pydantic are needed: importing this module loads no torch, FastAPI or
transformers (tests/test_client.py checks it), so an application that only sends reports
needs nothing else of Reef.
"""

from __future__ import annotations

import asyncio
import email.utils
import os
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from reef.errors import BadRequest, ReefError
from reef.wire import RecordList, RecordOut, ReleaseList, ReportIn, ReportList, ReportOut

__all__ = [
    "AsyncReef",
    "RecordList",
    "RecordOut",
    "Reef",
    "ReefAPIError",
    "ReefConnectionError",
    "ReleaseList",
    "ReportList",
    "ReportOut",
]

DEFAULT_BASE_URL = "http://127.0.0.1:8900"
BASE_URL_ENV = "REEF_BASE_URL"
API_KEY_ENV = "REEF_API_KEY"
RETRY_STATUSES = frozenset({429, 503})
DEFAULT_SCENARIO = "default"

Model = TypeVar("Model", bound=BaseModel)


class ReefAPIError(ReefError):
    """The server answered with an error: `status` (HTTP), and the `type`, `code`, `param` and
    `message` of its OpenAI-style error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        code: str | None = None,
        param: str | None = None,
    ):
        super().__init__(message, code=code, param=param)
        self.status = status
        self.type = type or "api_error"

    def __str__(self) -> str:
        return f"{self.status} {self.code or self.type}: {self.message}"


class ReefConnectionError(ReefError):
    """The server could not be reached, or did not answer in time."""

    status = 503
    type = "connection_error"
    code = "unreachable"


@dataclass(frozen=True)
class _Call:
    """One request to send."""

    method: str
    path: str
    body: dict[str, Any] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


def _base_url(base_url: str | None) -> str:
    """The server's root URL. The OpenAI SDK's base URL (`.../v1`) is taken too."""
    url = (base_url or os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL).rstrip("/")
    return url.removesuffix("/v1")


def _headers(api_key: str | None) -> dict[str, str]:
    key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
    return {"authorization": f"Bearer {key}"} if key else {}


def _problems(e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"])
        parts.append(f"{loc}: {err['msg']}" if loc else err["msg"])
    return "; ".join(parts)


def _report_body(
    receipts: str | Iterable[str],
    score: float | None,
    feedback: str | dict[str, Any] | None,
    report_id: str | None,
    metadata: dict[str, Any] | None,
    metrics: dict[str, bool | float | str] | None = None,
) -> dict[str, Any]:
    references = [receipts] if isinstance(receipts, str) else list(receipts)
    raw: dict[str, Any] = {"references": references, "metadata": metadata or {}}
    if metrics:
        raw["metrics"] = metrics
    for key, value in (("score", score), ("feedback", feedback), ("report_id", report_id)):
        if value is not None:
            raw[key] = value
    try:
        body = ReportIn.model_validate(raw)
    except ValidationError as e:
        raise BadRequest(f"invalid report: {_problems(e)}", code="invalid_value") from None
    return body.model_dump(mode="json", exclude_none=True)


def _error(r: httpx.Response) -> ReefAPIError:
    try:
        err = r.json()["error"]
        message = str(err["message"])
    except (ValueError, KeyError, TypeError):
        return ReefAPIError(r.status_code, r.text[:500] or r.reason_phrase)
    return ReefAPIError(
        r.status_code, message, type=err.get("type"), code=err.get("code"), param=err.get("param")
    )


def _answer(r: httpx.Response, model: type[Model]) -> Model:
    if r.status_code >= 400:
        raise _error(r)
    return model.model_validate_json(r.content)


def _retry_after(value: str | None) -> float | None:
    """Seconds a `Retry-After` header asks for (a number of seconds or an HTTP date)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


class _Client:
    """What the sync and async clients share: settings, the calls, and when to retry."""

    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        scenario: str | None,
        max_retries: int,
        backoff_s: float,
        max_backoff_s: float,
    ):
        self.base_url = _base_url(base_url)
        self.scenario = scenario
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._auth = _headers(api_key)

    def _path_scenario(self, scenario: str | None) -> str:
        return scenario or self.scenario or DEFAULT_SCENARIO

    def _report_call(
        self,
        receipts: str | Iterable[str],
        score: float | None,
        feedback: str | dict[str, Any] | None,
        report_id: str | None,
        metadata: dict[str, Any] | None,
        scenario: str | None,
        metrics: dict[str, bool | float | str] | None = None,
    ) -> _Call:
        body = _report_body(receipts, score, feedback, report_id, metadata, metrics)
        name = scenario or self.scenario
        headers = {"x-reef-scenario": name} if name else {}
        return _Call("POST", "/reef/report", body=body, headers=headers)

    def _records_call(self, scenario: str | None, after: str | None, limit: int) -> _Call:
        params: dict[str, Any] = {"limit": limit}
        if after:
            params["after"] = after
        path = f"/reef/scenarios/{self._path_scenario(scenario)}/records"
        return _Call("GET", path, params=params)

    def _record_call(self, record_id: str, scenario: str | None) -> _Call:
        path = f"/reef/scenarios/{self._path_scenario(scenario)}/records/{record_id}"
        return _Call("GET", path)

    def _reports_call(self, scenario: str | None, after: str | None, limit: int) -> _Call:
        params: dict[str, Any] = {"limit": limit}
        if after:
            params["after"] = after
        return _Call(
            "GET", f"/reef/scenarios/{self._path_scenario(scenario)}/reports", params=params
        )

    def _session_call(self, session_id: str, scenario: str | None) -> _Call:
        path = f"/reef/scenarios/{self._path_scenario(scenario)}/sessions/{session_id}"
        return _Call("GET", path)

    def _releases_call(self, scenario: str | None) -> _Call:
        path = f"/reef/scenarios/{self._path_scenario(scenario)}/releases"
        return _Call("GET", path)

    def _backoff(self, attempt: int) -> float:
        return min(self.backoff_s * 2**attempt, self.max_backoff_s) * random.uniform(0.5, 1.0)

    def _retry_delay(self, r: httpx.Response, attempt: int) -> float | None:
        """How long to wait before trying `r`'s request again; None: do not."""
        if r.status_code not in RETRY_STATUSES or attempt >= self.max_retries:
            return None
        asked = _retry_after(r.headers.get("retry-after"))
        if asked is None:
            return self._backoff(attempt)
        return asked if asked <= self.max_backoff_s else None

    def _unreachable(self, e: httpx.HTTPError) -> ReefConnectionError:
        what = "no answer in time" if isinstance(e, httpx.TimeoutException) else "unreachable"
        return ReefConnectionError(f"Reef at {self.base_url}: {what} ({e or type(e).__name__})")


# A connection that was never opened: the request did not reach the server, safe to retry.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout)


class Reef(_Client):
    """Synchronous client. `base_url`: the server's root (default $REEF_BASE_URL, else
    http://127.0.0.1:8900); `api_key`: a token (default $REEF_API_KEY); `scenario`: the default
    scenario of every call (reports without one go to the server's default scenario, reads to
    `default`). `http_client`: an httpx.Client of your own (its base URL is set to `base_url`)."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        scenario: str | None = None,
        timeout_s: float = 30.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 60.0,
        http_client: httpx.Client | None = None,
    ):
        super().__init__(base_url, api_key, scenario, max_retries, backoff_s, max_backoff_s)
        self._http = http_client or httpx.Client(timeout=timeout_s)
        self._http.base_url = httpx.URL(self.base_url)
        self._http.headers.update(self._auth)

    def report(
        self,
        receipts: str | Iterable[str],
        *,
        score: float | None = None,
        feedback: str | dict[str, Any] | None = None,
        report_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        scenario: str | None = None,
        metrics: dict[str, bool | float | str] | None = None,
    ) -> ReportOut:
        """Feedback on one receipt or several (`x-reef-agent-record-id` values): a `score`,
        `feedback` (text, or an object such as `{"correction": "..."}`), named `metrics` the
        scenario declares (`{"helpful": True, "accuracy": 0.7}`), or several of them.
        `report_id` makes it idempotent. `created` in the answer is False for a retry of a
        stored report."""
        call = self._report_call(receipts, score, feedback, report_id, metadata, scenario, metrics)
        return self._send(call, ReportOut)

    def records(
        self, scenario: str | None = None, *, after: str | None = None, limit: int = 100
    ) -> RecordList:
        """A page of the scenario's records, oldest first; `after=page.last_id` for the next."""
        return self._send(self._records_call(scenario, after, limit), RecordList)

    def record(self, record_id: str, *, scenario: str | None = None) -> RecordOut:
        return self._send(self._record_call(record_id, scenario), RecordOut)

    def reports(
        self, scenario: str | None = None, *, after: str | None = None, limit: int = 100
    ) -> ReportList:
        """A page of the scenario's reports, oldest first; `after=page.last_id` for the next."""
        return self._send(self._reports_call(scenario, after, limit), ReportList)

    def session(self, session_id: str, *, scenario: str | None = None) -> RecordList:
        """A session's records, first turn first (`RecordOut.session_id` names it)."""
        return self._send(self._session_call(session_id, scenario), RecordList)

    def releases(self, scenario: str | None = None) -> ReleaseList:
        """The scenario's release chain, newest first (`current` marks the head)."""
        return self._send(self._releases_call(scenario), ReleaseList)

    def _send(self, call: _Call, model: type[Model]) -> Model:
        attempt = 0
        while True:
            try:
                r = self._http.request(
                    call.method, call.path, json=call.body, params=call.params, headers=call.headers
                )
            except _NOT_SENT as e:
                if attempt >= self.max_retries:
                    raise self._unreachable(e) from None
                delay = self._backoff(attempt)
            except httpx.HTTPError as e:
                raise self._unreachable(e) from None
            else:
                wait = self._retry_delay(r, attempt)
                if wait is None:
                    return _answer(r, model)
                delay = wait
            time.sleep(delay)
            attempt += 1

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Reef:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncReef(_Client):
    """Asynchronous client: `Reef`'s arguments and methods, awaited (`http_client`: an
    httpx.AsyncClient)."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        scenario: str | None = None,
        timeout_s: float = 30.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 60.0,
        http_client: httpx.AsyncClient | None = None,
    ):
        super().__init__(base_url, api_key, scenario, max_retries, backoff_s, max_backoff_s)
        self._http = http_client or httpx.AsyncClient(timeout=timeout_s)
        self._http.base_url = httpx.URL(self.base_url)
        self._http.headers.update(self._auth)

    async def report(
        self,
        receipts: str | Iterable[str],
        *,
        score: float | None = None,
        feedback: str | dict[str, Any] | None = None,
        report_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        scenario: str | None = None,
        metrics: dict[str, bool | float | str] | None = None,
    ) -> ReportOut:
        """See `Reef.report`."""
        call = self._report_call(receipts, score, feedback, report_id, metadata, scenario, metrics)
        return await self._send(call, ReportOut)

    async def records(
        self, scenario: str | None = None, *, after: str | None = None, limit: int = 100
    ) -> RecordList:
        return await self._send(self._records_call(scenario, after, limit), RecordList)

    async def record(self, record_id: str, *, scenario: str | None = None) -> RecordOut:
        return await self._send(self._record_call(record_id, scenario), RecordOut)

    async def reports(
        self, scenario: str | None = None, *, after: str | None = None, limit: int = 100
    ) -> ReportList:
        return await self._send(self._reports_call(scenario, after, limit), ReportList)

    async def session(self, session_id: str, *, scenario: str | None = None) -> RecordList:
        return await self._send(self._session_call(session_id, scenario), RecordList)

    async def releases(self, scenario: str | None = None) -> ReleaseList:
        return await self._send(self._releases_call(scenario), ReleaseList)

    async def _send(self, call: _Call, model: type[Model]) -> Model:
        attempt = 0
        while True:
            try:
                r = await self._http.request(
                    call.method, call.path, json=call.body, params=call.params, headers=call.headers
                )
            except _NOT_SENT as e:
                if attempt >= self.max_retries:
                    raise self._unreachable(e) from None
                delay = self._backoff(attempt)
            except httpx.HTTPError as e:
                raise self._unreachable(e) from None
            else:
                wait = self._retry_delay(r, attempt)
                if wait is None:
                    return _answer(r, model)
                delay = wait
            await asyncio.sleep(delay)
            attempt += 1

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncReef:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
