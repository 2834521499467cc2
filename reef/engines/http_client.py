"""A lean pooled HTTP/1.1 client on asyncio and httptools, for the upstream engine's hot path.

Why not httpx: measured on the project machine against bench/echo_upstream.py, an httpx
AsyncClient spends ~750-1000 µs of CPU per small POST and ~1.5-2.3 ms per request at 16
concurrent requests (its pool and anyio locks), which alone caps a single-core proxy below
700 requests/s. This client spends ~15-50 µs (aiohttp: ~95-165 µs) by doing only what an
OpenAI-compatible upstream needs: keep-alive connections to one origin, one write per
request, llhttp (via httptools, which uvicorn[standard] ships) to parse responses,
content-length, chunked and read-until-close bodies, TLS through asyncio. No redirects,
cookies, compression or HTTP/2.

Proxies: `proxy_for` reads the environment's HTTPS_PROXY / HTTP_PROXY / ALL_PROXY and
NO_PROXY (lower-case names too) as curl and httpx do, except that a loopback origin never goes
through a proxy (as Go's net/http: a proxy cannot reach this host's loopback). An https origin
is reached through a CONNECT tunnel to the proxy, TLS inside it; an http origin by sending
absolute-form requests to the proxy. Decided once per pool: without a proxy, nothing on the
request path changes.

Timeouts are the caller's (`asyncio.timeout` around the call); cancelling a request closes
its connection rather than returning it half-read to the pool.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import ssl
import time
import urllib.request
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import httptools

# A connection idle this long is not reused (aiohttp's default). A server that closes idle
# connections first (uvicorn, so vLLM: after 5 s) sends a FIN we see before reuse; this bounds
# the damage of middleboxes that drop idle connections silently.
IDLE_EXPIRY_S = 15.0
# Pause reading a streamed body when this much is buffered and unread.
_HIGH_WATER = 1 << 20


class ProtocolError(ConnectionError):
    """The upstream sent something that is not HTTP/1.1, or closed mid-message."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.got_bytes = False
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(ProtocolError(f"malformed HTTP response: {e}"))
            self.abort()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.complete:  # idle in the pool, or the answer was whole already
            return
        if self.head_done and exc is None and not self._framed():
            # No content-length and not chunked: the body ends when the connection does.
            self.complete = True
            self.keep_alive = False
            self._wake()
            return
        reason = f": {exc}" if exc else ""
        self._fail(ProtocolError(f"upstream closed the connection mid-response{reason}"))

    def pause_writing(self) -> None:  # request bodies are small; nothing to throttle
        pass

    def resume_writing(self) -> None:
        pass

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > _HIGH_WATER and self.transport is not None:
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()
        self._wake()

    # used by the pool and responses
    def _framed(self) -> bool:
        return b"content-length" in self.headers or b"chunked" in self.headers.get(
            b"transfer-encoding", b""
        )

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        w = self.waiter
        if w is not None and not w.done():
            w.set_exception(error)
            w.exception()  # mark retrieved: the waiter may already have given up (timeout)

    async def wait(self, ready: bool) -> None:
        """Wait until something changed (unless `ready` already holds)."""
        if ready:
            return
        if self.error is not None:
            raise self.error
        if self.closed:
            raise ProtocolError("upstream closed the connection")
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    def take_body(self) -> list[bytes]:
        chunks, self.chunks, self.buffered = self.chunks, [], 0
        if self.transport is not None and not self.complete and not self.closed:
            self.transport.resume_reading()
        return chunks

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self._reset()
        self.transport.write(data)

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class Response:
    """A response whose head has arrived; read or stream the body, then it is released."""

    def __init__(self, pool: ConnectionPool, conn: _Connection):
        self._pool = pool
        self._conn: _Connection | None = conn
        self.status = conn.status
        self.headers = conn.headers  # lower-cased names

    async def read(self) -> bytes:
        return b"".join([c async for c in self.iter_bytes()])

    async def iter_bytes(self, read_timeout_s: float | None = None) -> AsyncGenerator[bytes, None]:
        """Body pieces as they arrive; each wait for more is bounded by `read_timeout_s`."""
        conn = self._conn
        assert conn is not None, "response body already consumed"
        try:
            while True:
                if conn.chunks:
                    for chunk in conn.take_body():
                        yield chunk
                    continue
                if conn.complete:
                    break
                async with asyncio.timeout(read_timeout_s):
                    await conn.wait(bool(conn.chunks) or conn.complete)
        except BaseException:
            self.close()
            raise
        self._release()

    def _release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool._release(conn, reusable=conn.complete and conn.keep_alive)

    def close(self) -> None:
        """Give up on the rest of the body (if any): the connection is not reused."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool._release(conn, reusable=False)


@dataclass(frozen=True)
class Proxy:
    """An HTTP proxy: where it listens, its Proxy-Authorization (from the URL's user info),
    and its URL without credentials (for messages)."""

    host: str
    port: int
    url: str
    authorization: str | None = None


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def proxy_for(url: str) -> Proxy | None:
    """The proxy the environment names for requests to `url`, or None (no proxy set, NO_PROXY
    names its host, or the host is loopback). Raises ValueError for a proxy URL this client
    cannot use (only http:// proxies)."""
    target = urlsplit(url)
    host = target.hostname or ""
    if _is_loopback(host):
        return None
    proxies = urllib.request.getproxies_environment()
    given = proxies.get(target.scheme) or proxies.get("all")
    if not given:
        return None
    port = target.port or (443 if target.scheme == "https" else 80)
    bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]
    if proxies.get("no") and bypass(f"{host}:{port}", proxies):
        return None
    proxy = urlsplit(given if "://" in given else f"http://{given}")
    if proxy.scheme != "http" or not proxy.hostname:
        raise ValueError(f"proxy {given!r}: only http:// proxies are supported")
    authorization = None
    if proxy.username is not None:
        pair = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}"
        authorization = "Basic " + base64.b64encode(pair.encode()).decode()
    shown = f"http://{proxy.hostname}:{proxy.port or 80}"
    return Proxy(proxy.hostname, proxy.port or 80, shown, authorization)


class _TunnelOpener(asyncio.Protocol):
    """Reads a proxy's answer to CONNECT (its head: no body follows a 2xx)."""

    def __init__(self) -> None:
        self.head = b""
        self.answered: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.head += data
        if b"\r\n\r\n" in self.head and not self.answered.done():
            self.answered.set_result(self.head.split(b"\r\n", 1)[0])

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.answered.done():
            self.answered.set_exception(ProtocolError("the proxy closed the connection"))


class ConnectionPool:
    """Keep-alive connections to one origin (scheme://host:port), at most `max_connections`."""

    def __init__(
        self,
        base_url: str,
        *,
        max_connections: int = 512,
        ssl_context: ssl.SSLContext | None = None,
        headers: dict[str, str] | None = None,
        proxy: Proxy | None = None,
    ):
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.prefix = url.path.rstrip("/")
        self._ssl: ssl.SSLContext | None = None
        if url.scheme == "https":
            self._ssl = ssl_context or ssl.create_default_context()
        host = self.host if ":" not in self.host else f"[{self.host}]"
        default_port = self.port == (443 if self._ssl else 80)
        authority = host if default_port else f"{host}:{self.port}"
        fixed = {"host": authority, "user-agent": "reef", "accept": "*/*", **(headers or {})}
        self.proxy = proxy
        # Where connections go: the origin, or the proxy (an http origin: requests name the
        # origin in absolute form; an https origin: a CONNECT tunnel, `_tunnel`).
        self._dial = (self.host, self.port) if proxy is None else (proxy.host, proxy.port)
        self._tunnel_request = b""
        if proxy is not None and self._ssl is not None:
            tunnel = {"host": f"{host}:{self.port}", "user-agent": "reef"}
            if proxy.authorization:
                tunnel["proxy-authorization"] = proxy.authorization
            self._tunnel_request = (
                f"CONNECT {host}:{self.port} HTTP/1.1\r\n"
                + "".join(f"{k}: {v}\r\n" for k, v in tunnel.items())
                + "\r\n"
            ).encode("latin-1")
        elif proxy is not None:
            self.prefix = f"http://{authority}{self.prefix}"
            if proxy.authorization:
                fixed["proxy-authorization"] = proxy.authorization
        # The header block every request shares, encoded once.
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in fixed.items()).encode("latin-1")
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)
        self._closed = False

    def path(self, tail: str) -> bytes:
        """The request target for `tail` under the base URL's path (`/models` → `/v1/models`)."""
        return (self.prefix + tail).encode()

    async def request(
        self, method: bytes, target: bytes, body: bytes | None = None, content_type: bytes = b""
    ) -> Response:
        """Send a request and wait for the response head. The caller must read or close it."""
        head = b"%s %s HTTP/1.1\r\n%s" % (method, target, self._fixed)
        if body is not None:
            head += b"content-type: %s\r\ncontent-length: %d\r\n" % (
                content_type or b"application/json",
                len(body),
            )
            data = head + b"\r\n" + body
        else:
            data = head + b"\r\n"
        await self._slots.acquire()
        try:
            conn = await self._exchange(data)
        except BaseException:
            self._slots.release()
            raise
        return Response(self, conn)

    async def fetch(
        self, method: bytes, target: bytes, body: bytes | None = None
    ) -> tuple[int, bytes]:
        """Request and read the whole body: the lean path for non-streamed answers."""
        response = await self.request(method, target, body)
        conn = response._conn
        assert conn is not None
        parts: list[bytes] = []
        try:
            while True:
                if conn.chunks:
                    parts += conn.take_body()
                if conn.complete:
                    break
                await conn.wait(bool(conn.chunks))
        except BaseException:
            response.close()
            raise
        response._release()
        return response.status, parts[0] if len(parts) == 1 else b"".join(parts)

    async def _exchange(self, data: bytes) -> _Connection:
        conn, reused = self._checkout(), True
        if conn is None:
            conn, reused = await self._connect(), False
        try:
            conn.send(data)
            await self._head(conn)
            return conn
        except ConnectionError:
            conn.abort()
            if not reused or conn.got_bytes:
                raise
        except BaseException:
            conn.abort()
            raise
        # A pooled connection the server had just closed (keep-alive race) fails before any
        # byte of answer: the server never read the request, so it is sent once more, fresh.
        conn = await self._connect()
        try:
            conn.send(data)
            await self._head(conn)
        except BaseException:
            conn.abort()
            raise
        return conn

    @staticmethod
    async def _head(conn: _Connection) -> None:
        while not conn.head_done:
            await conn.wait(conn.head_done)

    def _checkout(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()  # LIFO: the warmest connection first
            if not conn.closed and now - conn.idle_since < IDLE_EXPIRY_S:
                return conn
            conn.abort()
        return None

    async def _connect(self) -> _Connection:
        if self._tunnel_request:
            return await self._tunnel()
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(
            _Connection,
            *self._dial,
            ssl=self._ssl,
            server_hostname=self.host if self._ssl else None,
        )
        return conn

    async def _tunnel(self) -> _Connection:
        """A connection to the https origin through the proxy: CONNECT, then TLS inside."""
        assert self.proxy is not None and self._ssl is not None
        loop = asyncio.get_running_loop()
        transport, opener = await loop.create_connection(_TunnelOpener, *self._dial)
        try:
            transport.write(self._tunnel_request)
            status_line = await opener.answered
            parts = status_line.split(b" ", 2)
            if len(parts) < 2 or not parts[1].startswith(b"2"):
                said = status_line.decode("latin-1", errors="replace")
                raise ProtocolError(
                    f"proxy {self.proxy.url} refused CONNECT {self.host}:{self.port}: {said}"
                )
            conn = _Connection()
            tls = await loop.start_tls(transport, conn, self._ssl, server_hostname=self.host)
        except BaseException:
            transport.abort()
            raise
        assert tls is not None
        conn.connection_made(tls)
        return conn

    def _release(self, conn: _Connection, *, reusable: bool) -> None:
        self._slots.release()
        if reusable and not conn.closed and not self._closed:
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            conn.abort()

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            if conn.transport is not None:
                conn.transport.close()
                conn.closed = True
        # Let the transports' close callbacks run before the loop may stop.
        await asyncio.sleep(0)
