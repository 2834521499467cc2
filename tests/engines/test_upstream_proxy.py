"""The upstream engine's own HTTP client behind a proxy (HTTPS_PROXY, HTTP_PROXY, NO_PROXY).

The proxy is written here, on asyncio: CONNECT tunnels and absolute-form forwarding, resolving
names through its own table (the test's DNS), so an upstream named `upstream.reef.test` is only
reachable through it. The upstream is bench/echo_upstream.py, over TLS for the CONNECT case.
"""

from __future__ import annotations

import asyncio
import base64
import shutil
import subprocess
import sys
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from reef.engines.upstream import UpstreamEngine
from reef.errors import UpstreamError
from tests.engines.test_upstream import ECHO, KEY, chat, collect, echo_url, with_engine

__all__ = ["echo_url"]  # the module fixture, shared

NAME = "upstream.reef.test"  # resolved by the proxy only
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop}
try:
    import uvloop

    LOOPS["uvloop"] = uvloop.new_event_loop  # what reef serve runs
except ImportError:  # pragma: no cover
    pass


class Proxy:
    """An HTTP proxy on loopback. `seen`: each request line it was sent, with its
    Proxy-Authorization; CONNECT to a name in `refuse` gets 403."""

    def __init__(self, refuse: tuple[str, ...] = ()):
        self.refuse = refuse
        self.seen: list[tuple[str, str | None]] = []
        self.url = ""

    async def __aenter__(self) -> Proxy:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        line, *fields = head.decode("latin-1").split("\r\n")[:-2]
        headers = dict(f.split(": ", 1) for f in fields)
        headers = {k.lower(): v for k, v in headers.items()}
        self.seen.append((line, headers.get("proxy-authorization")))
        method, target, _ = line.split(" ")
        if method == "CONNECT":
            await self._tunnel(target, reader, writer)
        else:
            await self._forward(method, target, headers, reader, writer)

    async def _tunnel(
        self, target: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        host, port = target.rsplit(":", 1)
        if host in self.refuse:
            writer.write(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n")
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(self._resolve(host), int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    async def _forward(
        self,
        method: str,
        target: str,
        headers: dict[str, str],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        """One request per connection: sent on in origin form, the answer relayed until the
        upstream closes."""
        url = urlsplit(target)
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        kept = {k: v for k, v in headers.items() if k not in ("connection", "proxy-authorization")}
        head = f"{method} {url.path} HTTP/1.1\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in {**kept, "connection": "close"}.items()
        )
        up_reader, up_writer = await asyncio.open_connection(self._resolve(url.hostname), url.port)
        up_writer.write(head.encode("latin-1") + b"\r\n" + body)
        await _pipe(up_reader, writer)
        up_writer.close()

    @staticmethod
    def _resolve(host: str | None) -> str:
        assert host == NAME, host
        return "127.0.0.1"


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    except ConnectionError:
        pass
    finally:
        dst.close()


@pytest.fixture
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The environment without any proxy setting of the machine running the tests."""
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return monkeypatch


@pytest.fixture(scope="module")
def tls_echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """An HTTPS echo upstream with a certificate for NAME: (its port, the certificate)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a certificate")
    tmp = tmp_path_factory.mktemp("tls")
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", f"/CN={NAME}"),
            *("-addext", f"subjectAltName=DNS:{NAME}"),
        ],
        check=True,
        capture_output=True,
    )
    cmd = [sys.executable, str(ECHO), "--port", "0", "--api-key", KEY, "--model", "echo"]
    cmd += ["--tls-cert", str(cert), "--tls-key", str(key)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline().split()[-1].rsplit(":", 1)[1]), cert
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _run(loop: str, coro: Coroutine[Any, Any, Any]) -> Any:
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        return runner.run(coro)


@pytest.mark.parametrize("loop", list(LOOPS))
def test_https_goes_through_a_connect_tunnel(
    loop: str, tls_echo: tuple[int, Path], no_proxy_env: pytest.MonkeyPatch
) -> None:
    import ssl

    port, cert = tls_echo
    trusted = ssl.create_default_context(cafile=str(cert))

    async def go() -> tuple[Proxy, Any, Any]:
        async with Proxy() as proxy:
            host, proxy_port = proxy.url.rsplit(":", 1)
            no_proxy_env.setenv("HTTPS_PROXY", f"http://reef:s%40cret@{host[7:]}:{proxy_port}")

            async def calls(engine: UpstreamEngine) -> tuple[Any, Any]:
                plain = await engine.complete(chat("through the tunnel"))
                _, streamed = await collect(engine, chat("streamed through it"))
                return plain, streamed

            url = f"https://{NAME}:{port}/v1"
            plain, streamed = await with_engine(url, calls, model="echo", ssl_context=trusted)
            return proxy, plain, streamed

    proxy, plain, streamed = _run(loop, go())
    assert plain.response["choices"][0]["message"]["content"] == "through the tunnel"
    assert streamed.response["choices"][0]["message"]["content"] == "streamed through it"
    # one tunnel, kept alive for the second call; the proxy's credentials sent with it
    auth = "Basic " + base64.b64encode(b"reef:s@cret").decode()
    assert proxy.seen == [(f"CONNECT {NAME}:{port} HTTP/1.1", auth)]


def test_http_is_forwarded_in_absolute_form(
    echo_url: str, no_proxy_env: pytest.MonkeyPatch
) -> None:
    port = urlsplit(echo_url).port

    async def go() -> tuple[Proxy, Any]:
        async with Proxy() as proxy:
            no_proxy_env.setenv("http_proxy", proxy.url)  # the lower-case name counts too

            async def call(engine: UpstreamEngine) -> Any:
                return await engine.complete(chat("forwarded"))

            done = await with_engine(f"http://{NAME}:{port}/v1", call, model="echo")
            return proxy, done

    proxy, done = _run("asyncio", go())
    assert done.response["choices"][0]["message"]["content"] == "forwarded"
    assert proxy.seen == [(f"POST http://{NAME}:{port}/v1/chat/completions HTTP/1.1", None)]


def test_no_proxy_and_loopback_go_direct(echo_url: str, no_proxy_env: pytest.MonkeyPatch) -> None:
    port = urlsplit(echo_url).port

    async def go() -> tuple[Proxy, str, str]:
        async with Proxy() as proxy:
            no_proxy_env.setenv("HTTP_PROXY", proxy.url)
            no_proxy_env.setenv("NO_PROXY", "localhost,.reef.test")

            async def call(engine: UpstreamEngine) -> str:
                done = await engine.complete(chat("direct"))
                return str(done.response["choices"][0]["message"]["content"])

            direct = await with_engine(echo_url, call, model="echo")  # 127.0.0.1: never proxied
            try:  # NO_PROXY names it: dialled directly, and only the proxy knows the name
                await with_engine(f"http://{NAME}:{port}/v1", call, model="echo")
            except UpstreamError as e:
                return proxy, direct, e.message
            raise AssertionError("reached a name only the proxy resolves")

    proxy, direct, error = _run("asyncio", go())
    assert direct == "direct"
    assert f"upstream http://{NAME}:{port}/v1 unreachable: " in error
    assert proxy.seen == []


def test_a_refusing_proxy_is_named(no_proxy_env: pytest.MonkeyPatch) -> None:
    async def go() -> tuple[Proxy, str]:
        async with Proxy(refuse=("blocked.reef.test",)) as proxy:
            no_proxy_env.setenv("HTTPS_PROXY", proxy.url)

            async def call(engine: UpstreamEngine) -> object:
                return await engine.complete(chat())

            try:
                await with_engine("https://blocked.reef.test/v1", call, model="echo")
            except UpstreamError as e:
                return proxy, e.message
            raise AssertionError("the proxy refused, the call went through")

    proxy, error = _run("asyncio", go())
    assert error == (
        f"upstream https://blocked.reef.test/v1 unreachable through the proxy {proxy.url}: "
        f"proxy {proxy.url} refused CONNECT blocked.reef.test:443: HTTP/1.1 403 Forbidden"
    )
    assert proxy.seen == [("CONNECT blocked.reef.test:443 HTTP/1.1", None)]


def test_an_unusable_proxy_url_fails_the_start(no_proxy_env: pytest.MonkeyPatch) -> None:
    no_proxy_env.setenv("HTTPS_PROXY", "socks5://127.0.0.1:1080")
    with pytest.raises(UpstreamError, match="only http:// proxies are supported"):
        _run("asyncio", UpstreamEngine("https://api.example.com/v1", model="m").start())
