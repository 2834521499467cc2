"""The upstream engine: serve chat completions by forwarding them to an OpenAI-compatible server.

The request body goes to `{base_url}/chat/completions` as the client sent it (tools,
response_format and fields Reef does not know included); only `model` is replaced when an
upstream model is configured, and a request that names no max_tokens gets
`max_completion_tokens` = the configured default (an upstream would otherwise generate to the
end of its context). With `capture_tokens` the engine also asks a vLLM upstream for
the exact token ids and log-probs (`return_token_ids`, `logprobs`, usage in streams), keeps
them for the record, and takes out of the answer what the client did not ask for, so the
client sees what it would have seen without Reef.

vLLM's extension fields (vllm/entrypoints/openai/chat_completion/protocol.py): a response
carries top-level `prompt_token_ids` and `choices[i].token_ids`; a stream carries
`prompt_token_ids` in its first chunk and each chunk's own `choices[i].token_ids`.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

import orjson

from reef.engines.base import CAPTURE_TOPK, Completion
from reef.engines.chunks import assemble
from reef.engines.defaults import sampling_record, with_defaults
from reef.engines.http_client import ConnectionPool, Response, proxy_for
from reef.errors import UpstreamError, UpstreamRejected
from reef.settings.engine import UPSTREAM_CONNECTIONS

if TYPE_CHECKING:
    from reef.settings import EngineSettings

log = logging.getLogger(__name__)

# How long a readiness answer is reused: /readyz floods must not become upstream floods.
READY_CACHE_S = 1.5
READY_TIMEOUT_S = 2.0
_POST = b"POST"
_GET = b"GET"
_ERROR_BODY_CHARS = 500
# The events that end a Responses stream; each carries the whole response object.
_RESPONSE_ENDS = frozenset({"response.completed", "response.incomplete", "response.failed"})


class UpstreamEngine:
    """An Engine backed by any OpenAI-compatible server (vLLM, a hosted API, another Reef)."""

    kind = "upstream"

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        capture_tokens: bool = False,
        max_connections: int = UPSTREAM_CONNECTIONS,
        ssl_context: ssl.SSLContext | None = None,
        default_max_tokens: int | None = None,
        serves_responses: bool = False,
        capture_topk: bool = False,
        sampling_defaults: dict[str, float] | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        # The upstream serves the Responses API itself: /v1/responses bodies go to it unchanged
        # (`respond`, `respond_stream`) instead of being translated to chat completions.
        self.serves_responses = serves_responses
        self.model = model
        self.timeout_s = timeout_s
        self.capture_tokens = capture_tokens
        # Also ask for the top-K capture (Completion.topk): a vLLM extension
        # (return_tokens_as_token_ids) other upstreams refuse, so only the vLLM engine sets it.
        self.capture_topk = capture_tokens and capture_topk
        self.default_max_tokens = default_max_tokens
        # Filled into a request that leaves them out (None: nothing is; the upstream applies
        # its own defaults, as vLLM applies the model's generation_config).
        self.sampling_defaults = dict(sampling_defaults or {})
        self._api_key = api_key
        self._max_connections = max_connections
        self._ssl_context = ssl_context
        self._pool: ConnectionPool | None = None
        self._models: list[str] = [model] if model else []
        self._chat_target = b""
        self._responses_target = b""
        self._models_target = b""
        self._ready_at = -1.0
        self._ready = False
        self._ready_check: asyncio.Task[bool] | None = None

    @classmethod
    def from_settings(
        cls, settings: EngineSettings, *, default_max_tokens: int | None = None
    ) -> UpstreamEngine:
        """The engine `settings.upstream` describes (reef.settings.engine.UpstreamSettings).
        `default_max_tokens`: the one to send (Settings.default_max_tokens holds it to the
        server's cap); default engine.default_max_tokens."""
        upstream = settings.upstream
        if not upstream.url:
            raise ValueError("the upstream engine needs engine.upstream.url")
        key = upstream.api_key
        return cls(
            upstream.url,
            model=upstream.model,
            api_key=key.get_secret_value() if key else None,
            timeout_s=upstream.timeout_s,
            capture_tokens=upstream.capture_tokens,
            default_max_tokens=default_max_tokens or settings.default_max_tokens,
            serves_responses=upstream.responses,
            sampling_defaults=settings.sampling_defaults,
        )

    # Engine protocol

    def models(self) -> list[str]:
        return list(self._models)

    async def start(self) -> None:
        if self._pool is not None:
            return
        headers = {"authorization": f"Bearer {self._api_key}"} if self._api_key else None
        try:  # HTTPS_PROXY / HTTP_PROXY / NO_PROXY, read once
            proxy = proxy_for(self.base_url)
        except ValueError as e:
            raise UpstreamError(f"upstream {self.base_url}: {e}", code="upstream_proxy") from None
        if proxy is not None:
            log.info("upstream %s: through the proxy %s", self.base_url, proxy.url)
        self._pool = ConnectionPool(
            self.base_url,
            max_connections=self._max_connections,
            ssl_context=self._ssl_context,
            headers=headers,
            proxy=proxy,
        )
        self._chat_target = self._pool.path("/chat/completions")
        self._responses_target = self._pool.path("/responses")
        self._models_target = self._pool.path("/models")
        if self.model is None:
            self._models = await self._list_models(self.timeout_s)
            if not self._models:
                raise UpstreamError(f"upstream {self.base_url} lists no models at /models")

    async def ready(self) -> bool:
        if time.monotonic() - self._ready_at < READY_CACHE_S:
            return self._ready
        if self._ready_check is None:  # concurrent callers share one check
            self._ready_check = asyncio.ensure_future(self._check_ready())
        try:
            return await asyncio.shield(self._ready_check)
        finally:
            if self._ready_check is not None and self._ready_check.done():
                self._ready_check = None

    async def complete(
        self, body: dict[str, Any], *, sampling_defaults: dict[str, float] | None = None
    ) -> Completion:
        defaults = self.sampling_defaults if sampling_defaults is None else sampling_defaults
        payload = self._payload(body, defaults, stream=False)
        t0 = time.perf_counter()
        response = await self._post_json(self._chat_target, payload)
        choices = response.get("choices") or []
        first = choices[0] if choices and isinstance(choices[0], dict) else {}
        prompt_ids = response.get("prompt_token_ids")
        completion_ids = first.get("token_ids")
        logprobs = _logprob_values(first.get("logprobs"))
        topk = None
        if self.capture_tokens:
            if self.capture_topk and not body.get("logprobs"):
                topk = _topk_capture(first.get("logprobs"))
            self._hide_unasked(body, response, choices)
        return Completion(
            response=response,
            prompt_token_ids=prompt_ids,
            completion_token_ids=completion_ids,
            logprobs=logprobs,
            timings={"total_ms": (time.perf_counter() - t0) * 1e3},
            topk=topk,
            sampling=sampling_record(*with_defaults(body, defaults)),
        )

    async def stream(
        self, body: dict[str, Any], *, sampling_defaults: dict[str, float] | None = None
    ) -> AsyncIterator[dict[str, Any] | Completion]:
        pool = self._started()
        defaults = self.sampling_defaults if sampling_defaults is None else sampling_defaults
        payload = self._payload(body, defaults, stream=True)
        capture = self.capture_tokens
        keep_logprobs = not capture or bool(body.get("logprobs"))
        keep_ids = not capture or bool(body.get("return_token_ids"))
        keep_usage = not capture or bool((body.get("stream_options") or {}).get("include_usage"))
        t0 = time.perf_counter()
        response = await self._open_stream(pool, self._chat_target, payload)
        _require_event_stream(response)
        seen: list[dict[str, Any]] = []  # what the client got: the record assembles these
        prompt_ids: list[int] | None = None
        completion_ids: list[int] | None = None
        logprobs: list[float] | None = None
        capture_entries: list[Any] | None = (
            [] if self.capture_topk and not body.get("logprobs") else None
        )
        ttft_ms: float | None = None
        events = decode_sse(response.iter_bytes(self.timeout_s))
        try:
            async for chunk in events:
                if "choices" not in chunk and ("error" in chunk or chunk.get("object") == "error"):
                    raise _stream_error(chunk, before_first=not seen)
                choices = chunk.get("choices") or []
                if prompt_ids is None and chunk.get("prompt_token_ids") is not None:
                    prompt_ids = chunk["prompt_token_ids"]
                if choices and choices[0].get("index", 0) == 0:
                    first = choices[0]
                    if first.get("token_ids"):
                        if completion_ids is None:
                            completion_ids = []
                        completion_ids.extend(first["token_ids"])
                    if capture_entries is not None:
                        capture_entries += (first.get("logprobs") or {}).get("content") or []
                    values = _logprob_values(first.get("logprobs"))
                    if values:
                        if logprobs is None:
                            logprobs = []
                        logprobs.extend(values)
                if capture:
                    if not keep_usage and "usage" in chunk:
                        if not choices and chunk["usage"] is not None:
                            continue  # the usage-only chunk the client did not ask for
                        del chunk["usage"]
                    if not keep_ids and "prompt_token_ids" in chunk:
                        chunk["prompt_token_ids"] = None
                    for c in choices:
                        if not keep_ids and "token_ids" in c:
                            c["token_ids"] = None
                        if not keep_logprobs and "logprobs" in c:
                            c["logprobs"] = None
                if ttft_ms is None:
                    ttft_ms = (time.perf_counter() - t0) * 1e3
                seen.append(chunk)
                yield chunk
        except OSError as e:  # TimeoutError included
            raise self._stream_broke(e, f"{len(seen)} chunks") from None
        finally:
            await events.aclose()
            response.close()
        yield Completion(
            timings=_timings(t0, ttft_ms),  # first: the time taken, not the assembling after it
            response=assemble(seen),
            prompt_token_ids=prompt_ids,
            completion_token_ids=completion_ids,
            logprobs=logprobs,
            topk=_topk_capture({"content": capture_entries}) if capture_entries else None,
            sampling=sampling_record(*with_defaults(body, defaults)),
        )

    # the Responses API, passed through (serves_responses)

    async def respond(self, body: dict[str, Any]) -> Completion:
        """A Responses request sent to the upstream's /responses as it is (the model
        replaced when one is configured); its response object, as it answered."""
        payload = self._responses_payload(body, stream=False)
        t0 = time.perf_counter()
        response = await self._post_json(self._responses_target, payload)
        return Completion(response=response, timings={"total_ms": (time.perf_counter() - t0) * 1e3})

    async def _open_stream(self, pool: ConnectionPool, target: bytes, payload: bytes) -> Response:
        """POST a streamed request: the upstream's response once its status line and headers
        are in, or the error that says why there is none (timeout, unreachable, its refusal)."""
        try:
            async with asyncio.timeout(self.timeout_s):
                response = await pool.request(_POST, target, payload)
                if response.status >= 300:
                    raise _status_error(response.status, await response.read())
        except TimeoutError:
            raise self._timed_out() from None
        except OSError as e:
            raise self._unreachable(e) from None
        return response

    async def _post_json(self, target: bytes, payload: bytes) -> dict[str, Any]:
        """POST a whole (non-streamed) request; the upstream's JSON object, or the error that
        says why there is none (timeout, unreachable, its refusal, invalid JSON)."""
        pool = self._started()
        try:
            async with asyncio.timeout(self.timeout_s):
                status, data = await pool.fetch(_POST, target, payload)
        except TimeoutError:
            raise self._timed_out() from None
        except OSError as e:
            raise self._unreachable(e) from None
        if status >= 300:
            raise _status_error(status, data)
        try:
            response = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise UpstreamError(
                f"upstream sent invalid JSON: {_excerpt(data)}", code="upstream_invalid_response"
            ) from None
        if not isinstance(response, dict):
            raise UpstreamError("upstream answered with JSON that is not an object")
        return response

    async def respond_stream(
        self, body: dict[str, Any]
    ) -> AsyncIterator[dict[str, Any] | Completion]:
        """A streamed Responses request relayed event by event, except the one that ends it
        (`response.completed`, `.incomplete` or `.failed`): that one is the final
        Completion's `response`, so the caller sends it once the record is durable."""
        pool = self._started()
        payload = self._responses_payload(body, stream=True)
        t0 = time.perf_counter()
        response = await self._open_stream(pool, self._responses_target, payload)
        if not response.headers.get(b"content-type", b"").startswith(b"text/event-stream"):
            response.close()
            raise UpstreamError(
                "upstream answered a streamed /responses request without an event stream",
                code="upstream_invalid_response",
            )
        last: dict[str, Any] | None = None
        sent = 0
        ttft_ms: float | None = None
        events = decode_sse(response.iter_bytes(self.timeout_s))
        try:
            async for event in events:
                if event.get("type") in _RESPONSE_ENDS:
                    last = event
                    continue
                if event.get("type") == "error" and sent == 0:
                    message, code = _message_of(event)
                    raise UpstreamError(f"upstream stream failed: {message}", code=code)
                if ttft_ms is None:
                    ttft_ms = (time.perf_counter() - t0) * 1e3
                sent += 1
                yield event
        except OSError as e:  # TimeoutError included
            raise self._stream_broke(e, f"{sent} events") from None
        finally:
            await events.aclose()
            response.close()
        if last is None:
            raise UpstreamError(
                f"upstream stream ended after {sent} events without its final response event",
                code="upstream_stream_broken",
            )
        yield Completion(response=last, timings=_timings(t0, ttft_ms))

    def _responses_payload(self, body: dict[str, Any], *, stream: bool) -> bytes:
        out = dict(body)
        if self.model is not None:
            out["model"] = self.model
        out["stream"] = stream
        return orjson.dumps(out)

    async def aclose(self) -> None:
        if self._ready_check is not None:
            self._ready_check.cancel()
            self._ready_check = None
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.aclose()

    # helpers

    def _started(self) -> ConnectionPool:
        if self._pool is None:
            raise UpstreamError("the upstream engine is not started")
        return self._pool

    def _payload(self, body: dict[str, Any], defaults: dict[str, float], *, stream: bool) -> bytes:
        # A shallow copy: the caller's body stays what the client sent (it is recorded).
        out = dict(with_defaults(body, defaults)[0])
        model = self._wire_model(body)
        if model is not None:
            out["model"] = model
        if stream:
            out["stream"] = True
        elif out.get("stream"):
            out["stream"] = False
        if (
            self.default_max_tokens is not None
            and out.get("max_tokens") is None
            and out.get("max_completion_tokens") is None
        ):
            # OpenAI's current name for it (its reasoning models refuse max_tokens); vLLM
            # and Reef read it too.
            out["max_completion_tokens"] = self.default_max_tokens
        if self.capture_tokens:
            out["return_token_ids"] = True
            out["logprobs"] = True
            if self.capture_topk and not body.get("logprobs"):
                # The top-K capture (Completion.topk), as ids: vLLM renders every token of the
                # logprobs as "token_id:<id>" then. Only when the client did not ask for
                # log-probs, whose tokens must stay text (its records then have no capture).
                out["top_logprobs"] = CAPTURE_TOPK
                out["return_tokens_as_token_ids"] = True
            if stream:
                out["stream_options"] = {**(out.get("stream_options") or {}), "include_usage": True}
        return orjson.dumps(out)

    def _wire_model(self, body: dict[str, Any]) -> str | None:
        """The model name sent upstream (None: the client's, unchanged)."""
        return self.model

    @staticmethod
    def _hide_unasked(
        body: dict[str, Any], response: dict[str, Any], choices: list[dict[str, Any]]
    ) -> None:
        """Null what capture added and the client did not ask for, as vLLM would have."""
        if not body.get("return_token_ids"):
            if "prompt_token_ids" in response:
                response["prompt_token_ids"] = None
            for c in choices:
                if "token_ids" in c:
                    c["token_ids"] = None
        if not body.get("logprobs"):
            for c in choices:
                if "logprobs" in c:
                    c["logprobs"] = None

    async def _list_models(self, timeout_s: float) -> list[str]:
        pool = self._started()
        try:
            async with asyncio.timeout(timeout_s):
                status, data = await pool.fetch(_GET, self._models_target)
        except TimeoutError:
            raise self._timed_out(timeout_s) from None
        except OSError as e:
            raise self._unreachable(e) from None
        if status >= 300:
            raise _status_error(status, data)
        try:
            listing = orjson.loads(data)
            return [m["id"] for m in listing["data"]]
        except (orjson.JSONDecodeError, KeyError, TypeError) as e:
            raise UpstreamError(
                f"upstream /models answer is not an OpenAI model list ({e}): {_excerpt(data)}",
                code="upstream_invalid_response",
            ) from None

    async def _check_ready(self) -> bool:
        try:
            await self._list_models(min(READY_TIMEOUT_S, self.timeout_s))
            ok = True
        except (UpstreamError, UpstreamRejected):
            ok = False
        self._ready, self._ready_at = ok, time.monotonic()
        return ok

    def _timed_out(self, timeout_s: float | None = None) -> UpstreamError:
        t = self.timeout_s if timeout_s is None else timeout_s
        return UpstreamError(
            f"upstream {self.base_url} did not answer within {t:g}s", code="upstream_timeout"
        )

    def _unreachable(self, e: OSError) -> UpstreamError:
        proxy = self._pool.proxy if self._pool is not None else None
        via = f" through the proxy {proxy.url}" if proxy is not None else ""
        return UpstreamError(
            f"upstream {self.base_url} unreachable{via}: {e or type(e).__name__}",
            code="upstream_unreachable",
        )

    def _stream_broke(self, e: OSError, sent: str) -> UpstreamError:
        """An open stream that stalled (no data for timeout_s: a TimeoutError) or broke after
        `sent` ("12 chunks", "3 events")."""
        if isinstance(e, TimeoutError):
            return UpstreamError(
                f"upstream stream stalled: no data for {self.timeout_s:g}s after {sent}",
                code="upstream_timeout",
            )
        return UpstreamError(
            f"upstream stream broke after {sent}: {e}", code="upstream_stream_broken"
        )


async def decode_sse(pieces: AsyncGenerator[bytes, None]) -> AsyncGenerator[dict[str, Any], None]:
    """Server-sent events as they arrive, however the bytes are split: each `data:` payload
    parsed as a JSON object, until `data: [DONE]`.

    Reads `pieces` to their end after [DONE] (the rest of the body is there already) so that
    the connection goes back to the pool instead of being closed.
    """
    buffer = b""
    done = False
    async with aclosing(pieces):
        async for piece in pieces:
            if done:
                continue
            buffer += piece
            if b"\r" in buffer:  # SSE allows CRLF and CR line ends; normalise to LF
                # A CR at the very end may be half of a CRLF whose LF is still on its way.
                tail = b"\r" if buffer.endswith(b"\r") else b""
                body = buffer[:-1] if tail else buffer
                buffer = body.replace(b"\r\n", b"\n").replace(b"\r", b"\n") + tail
            while True:
                end = buffer.find(b"\n\n")
                if end < 0:
                    break
                event, buffer = buffer[:end], buffer[end + 2 :]
                data = _event_data(event)
                if data is None:
                    continue
                if data == b"[DONE]":
                    done = True
                    break
                try:
                    chunk = orjson.loads(data)
                except orjson.JSONDecodeError:
                    raise UpstreamError(
                        f"upstream sent an event that is not JSON: {_excerpt(data)}",
                        code="upstream_invalid_response",
                    ) from None
                if isinstance(chunk, dict):
                    yield chunk


def _event_data(event: bytes) -> bytes | None:
    if event.startswith(b"data: ") and b"\n" not in event:  # the usual one-line event
        return event[6:]
    lines = [
        line[5:].removeprefix(b" ") for line in event.split(b"\n") if line.startswith(b"data:")
    ]
    return b"\n".join(lines) if lines else None  # comments, `event:` and `id:` lines only


def _topk_capture(logprobs: Any) -> dict[str, Any] | None:
    """The top-K capture (Completion.topk) from vLLM logprobs whose tokens are rendered as
    "token_id:<id>" (return_tokens_as_token_ids); None when they are not all there."""
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not content:
        return None
    ids: list[list[int]] = []
    values: list[list[float]] = []
    try:
        for entry in content:
            top = entry["top_logprobs"]
            ids.append([int(str(t["token"]).removeprefix("token_id:")) for t in top])
            values.append([max(float(t["logprob"]), -9999.0) for t in top])
    except (KeyError, TypeError, ValueError):
        return None
    if any(len(row) < CAPTURE_TOPK for row in ids):
        return None
    return {"k": CAPTURE_TOPK, "ids": ids, "logprobs": values}


def _logprob_values(logprobs: Any) -> list[float] | None:
    if not isinstance(logprobs, dict):
        return None
    content = logprobs.get("content")
    if not content:
        return None
    try:
        return [float(entry["logprob"]) for entry in content]
    except (KeyError, TypeError, ValueError):  # malformed: the answer still goes through
        return None


def _message(data: bytes) -> tuple[str, str | None]:
    """The upstream's error message (OpenAI, vLLM or FastAPI error JSON), and its code."""
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        return _excerpt(data), None
    return _message_of(payload, data)


def _message_of(payload: Any, data: bytes | None = None) -> tuple[str, str | None]:
    if isinstance(payload, dict):
        error = payload.get("error", payload)
        if isinstance(error, dict):
            message = error.get("message") or error.get("detail")
            code = error.get("code")
            if message:
                return str(message), code if isinstance(code, str) else None
        elif isinstance(error, str):
            return error, None
    return _excerpt(data if data is not None else orjson.dumps(payload)), None


def _status_error(status: int, data: bytes) -> UpstreamError | UpstreamRejected:
    message, code = _message(data)
    if 400 <= status < 500:
        return UpstreamRejected(message, status=status, code=code)
    return UpstreamError(f"upstream answered {status}: {message}")


def _require_event_stream(response: Response) -> None:
    """Close `response` and raise unless it is an event stream (what a stream request asked
    for)."""
    content_type = response.headers.get(b"content-type", b"")
    if not content_type.startswith(b"text/event-stream"):
        response.close()
        raise UpstreamError(
            f"upstream answered a stream request with {content_type.decode(errors='replace')!r}"
            ", not an event stream",
            code="upstream_invalid_response",
        )


def _timings(t0: float, ttft_ms: float | None) -> dict[str, float]:
    """Completion.timings of a stream that began at `t0` (perf_counter) and ends now."""
    timings = {"total_ms": (time.perf_counter() - t0) * 1e3}
    if ttft_ms is not None:
        timings["ttft_ms"] = ttft_ms
    return timings


def _stream_error(chunk: dict[str, Any], *, before_first: bool) -> UpstreamError | UpstreamRejected:
    message, _ = _message_of(chunk)
    error = chunk.get("error")
    status = (error.get("code") if isinstance(error, dict) else None) or chunk.get("code")
    if before_first and isinstance(status, int) and 400 <= status < 500:
        return UpstreamRejected(message, status=status)
    return UpstreamError(f"upstream stream failed: {message}", code="upstream_stream_failed")


def _excerpt(data: bytes) -> str:
    text = data[:_ERROR_BODY_CHARS].decode(errors="replace").strip()
    return text or "(empty body)"
