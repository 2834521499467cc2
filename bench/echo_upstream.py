"""A fast OpenAI-compatible echo server on raw asyncio: the remote upstream in tests and benchmarks.

It stands in for a remote OpenAI-compatible server (vLLM, a hosted API) so that Reef's upstream
engine can be tested and benchmarked over real HTTP on loopback. It is not a fake of anything
Reef runs. It answers `GET /v1/models` and `POST /v1/chat/completions` (plain and SSE) by echoing
the last user message back, word by word, deterministically. Like vLLM it reports token ids when
asked with `return_token_ids: true` (top-level `prompt_token_ids`, `choices[0].token_ids`; in a
stream the prompt ids come in the first chunk and each chunk carries its own ids) and log-probs
with `logprobs: true` (`choices[0].logprobs.content[i].logprob`).

A request steers the server through an extra body field, which an OpenAI-compatible proxy must
pass through untouched anyway:

    "echo_upstream": {
        "status": 500 | 400 | ...,   # answer with this status and OpenAI-style error JSON
        "message": "...",            # the error message to send with it
        "delay_s": 1.5,              # wait before answering
        "die_after": 2,              # stream: drop the connection after this many chunks
        "chunk_delay_s": 0.1,        # stream: write chunks one by one, this far apart
        "call_tool": true,           # answer with a call of the first tool in `tools`
        "reflect": true,             # add `echo_request` to the answer: the body and
                                     # authorization received, this connection's number,
                                     # how many /v1/models requests came so far
        "close": true,               # drop the connection after answering (as a server
        "close_delay_s": 0.05,       # does to an idle keep-alive connection), this much later
    }

`--chunk-delay-s S` writes every stream's chunks S apart, as `chunk_delay_s` does for one
request (for clients whose wire format has no room for `echo_upstream`, Anthropic's through
Reef's /v1/messages).

A whole server can also stand in for one with a fixed capacity (a GPU server's batch):
`--capacity N --service-s S` serves at most N chat completions at once, each taking S seconds
(before any `delay_s`); the others wait in its line, as a saturated vLLM's do
(bench/overload.py drives it past that).

It is written against httptools and uvloop directly (both ship with uvicorn[standard]) because
the benchmark shares two cores between wrk, this server and Reef: a framework here would eat
the CPU the measurement is about.

Run: python bench/echo_upstream.py --port 0   (prints `listening on http://HOST:PORT` when ready)
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import ssl
import subprocess
import sys
import time
import zlib
from http import HTTPStatus
from pathlib import Path
from typing import Any

import httptools
import orjson

_WORD = re.compile(r"\s*\S+|\s+")
_TASKS: set[asyncio.Task[None]] = set()
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


def tokenize(text: str) -> list[str]:
    """Words with their leading whitespace: joined they give the text back exactly."""
    return _WORD.findall(text) or [""]


def token_id(token: str) -> int:
    return zlib.crc32(token.encode()) % 100_000


def token_logprob(tid: int) -> float:
    return -round((tid % 997) / 997 * 3 + 0.0001, 4)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: keep the text ones
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _error(status: int, message: str) -> bytes:
    # vLLM's error shape: {"error": {"message", "type", "param", "code"}}
    kind = "BadRequestError" if status < 500 else "InternalServerError"
    return orjson.dumps(
        {"error": {"message": message, "type": kind, "param": None, "code": status}}
    )


class EchoServer:
    """What the server answers, independent of the transport."""

    def __init__(
        self,
        models: list[str],
        api_key: str | None,
        capacity: int = 0,
        service_s: float = 0.0,
        chunk_delay_s: float = 0.0,
    ):
        self.models = models
        self.api_key = api_key
        self.chunk_delay_s = chunk_delay_s  # --chunk-delay-s: every stream's, unless steered
        # --capacity / --service-s: completions served at once, and how long each takes
        self.service_s = service_s
        self.slots = asyncio.Semaphore(capacity) if capacity > 0 else None
        self.counter = 0
        self.connections = 0  # reported by `reflect`: lets tests see keep-alive and caching
        self.models_requests = 0
        self.models_body = orjson.dumps(
            {
                "object": "list",
                "data": [
                    {"id": m, "object": "model", "created": 0, "owned_by": "echo"} for m in models
                ],
            }
        )

    def plan(self, body: dict[str, Any]) -> tuple[str, list[str], list[int]]:
        """The reply text's tokens and the prompt's token ids."""
        messages = body.get("messages") or []
        prompt_ids = [
            token_id(t)
            for m in messages
            if isinstance(m, dict)
            for t in tokenize(_text(m.get("content")))
        ]
        last = next(
            (
                _text(m.get("content"))
                for m in reversed(messages)
                if isinstance(m, dict) and m.get("role") == "user"
            ),
            "",
        )
        tokens = tokenize(last or "(empty)")
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        finish = "stop"
        if isinstance(limit, int) and 0 < limit < len(tokens):
            tokens, finish = tokens[:limit], "length"
        return finish, tokens, prompt_ids

    def next_id(self) -> str:
        self.counter += 1
        return f"chatcmpl-echo-{self.counter}"


def _tool_call(body: dict[str, Any], text: str) -> dict[str, Any] | None:
    tools = body.get("tools") or []
    if not tools:
        return None
    name = tools[0].get("function", {}).get("name", "tool")
    return {"name": name, "arguments": orjson.dumps({"echo": text}).decode()}


def completion(server: EchoServer, body: dict[str, Any], control: dict[str, Any]) -> dict[str, Any]:
    finish, tokens, prompt_ids = server.plan(body)
    text = "".join(tokens)
    ids = [token_id(t) for t in tokens]
    message: dict[str, Any] = {"role": "assistant", "content": text, "tool_calls": []}
    call = _tool_call(body, text) if control.get("call_tool") else None
    if call:
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_echo_0", "type": "function", "function": call}],
        }
        finish = "tool_calls"
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": None,
    }
    if body.get("logprobs"):
        choice["logprobs"] = {
            "content": [_logprob_entry(t, i) for t, i in zip(tokens, ids, strict=True)]
        }
    want_ids = bool(body.get("return_token_ids"))
    if want_ids:
        choice["token_ids"] = ids
    return {
        "id": server.next_id(),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model"),
        "choices": [choice],
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(tokens),
            "total_tokens": len(prompt_ids) + len(tokens),
        },
        "prompt_token_ids": prompt_ids if want_ids else None,
    }


def _logprob_entry(token: str, tid: int) -> dict[str, Any]:
    return {
        "token": token,
        "logprob": token_logprob(tid),
        "bytes": list(token.encode()),
        "top_logprobs": [],
    }


def chunks(
    server: EchoServer, body: dict[str, Any], control: dict[str, Any]
) -> list[dict[str, Any]]:
    """The SSE events of a streamed answer, vLLM-shaped."""
    finish, tokens, prompt_ids = server.plan(body)
    cid, created, model = server.next_id(), int(time.time()), body.get("model")
    want_ids, want_lp = bool(body.get("return_token_ids")), bool(body.get("logprobs"))

    def chunk(delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, **extra}
        return {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [choice],
        }

    first = chunk({"role": "assistant", "content": ""})
    if want_ids:
        first["prompt_token_ids"] = prompt_ids
    out = [first]
    text = "".join(tokens)
    call = _tool_call(body, text) if control.get("call_tool") else None
    if call:
        args = call["arguments"]
        cut = len(args) // 2
        out.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_echo_0",
                            "type": "function",
                            "function": {"name": call["name"], "arguments": args[:cut]},
                        }
                    ]
                }
            )
        )
        out.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": args[cut:]}}]}))
        finish = "tool_calls"
    else:
        for t in tokens:
            tid = token_id(t)
            extra: dict[str, Any] = {}
            if want_ids:
                extra["token_ids"] = [tid]
            c = chunk({"content": t}, **extra)
            if want_lp:
                c["choices"][0]["logprobs"] = {"content": [_logprob_entry(t, tid)]}
            out.append(c)
    out.append(chunk({}, finish_reason=finish, stop_reason=None))
    if (body.get("stream_options") or {}).get("include_usage"):
        n = len(tokens)
        out.append(
            {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [],
                "usage": {
                    "prompt_tokens": len(prompt_ids),
                    "completion_tokens": n,
                    "total_tokens": len(prompt_ids) + n,
                },
            }
        )
    return out


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; one request at a time."""

    def __init__(self, server: EchoServer):
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []
        self.closing = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections += 1
        self.number = self.server.connections

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._send(400, _error(400, "malformed HTTP request"), close=True)

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url, self.headers, self.body = b"", {}, []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.closing:
            return
        method = self.parser.get_method()
        keep = self.parser.should_keep_alive()
        path = self.url.split(b"?", 1)[0]
        if self.server.api_key is not None:
            expected = b"Bearer " + self.server.api_key.encode()
            if self.headers.get(b"authorization") != expected:
                self._send(401, _error(401, "invalid api key"), close=not keep)
                return
        if method == b"GET" and path == b"/v1/models":
            self.server.models_requests += 1
            self._send(200, self.server.models_body, close=not keep)
        elif method == b"POST" and path == b"/v1/chat/completions":
            self._chat(b"".join(self.body), keep)
        else:
            self._send(
                404, _error(404, f"no route {method.decode()} {path.decode()}"), close=not keep
            )

    def _chat(self, raw: bytes, keep: bool) -> None:
        try:
            body = orjson.loads(raw)
            assert isinstance(body, dict)
        except (orjson.JSONDecodeError, AssertionError):
            self._send(400, _error(400, "body is not a JSON object"), close=not keep)
            return
        control = body.get("echo_upstream") or {}
        if control or self.server.service_s > 0 or self.server.chunk_delay_s > 0:
            task = asyncio.get_running_loop().create_task(self._controlled(body, control, keep))
            _TASKS.add(task)  # the loop keeps only weak references to tasks
            task.add_done_callback(_TASKS.discard)
            return
        if body.get("model") not in self.server.models:
            self._send(
                404, _error(404, f"The model `{body.get('model')}` does not exist."), close=not keep
            )
        elif body.get("stream"):
            self._stream(body, control, keep)
        else:
            self._send(200, orjson.dumps(completion(self.server, body, control)), close=not keep)

    async def _controlled(self, body: dict[str, Any], control: dict[str, Any], keep: bool) -> None:
        if self.server.service_s > 0:
            if self.server.slots is None:
                await asyncio.sleep(self.server.service_s)
            else:
                async with self.server.slots:
                    await asyncio.sleep(self.server.service_s)
        if control.get("delay_s"):
            await asyncio.sleep(float(control["delay_s"]))
        if self.transport is None or self.transport.is_closing():
            return
        status = int(control.get("status", 200))
        if status != 200:
            self._send(
                status,
                _error(status, control.get("message", f"echo upstream error {status}")),
                close=not keep,
            )
            return
        if body.get("model") not in self.server.models:
            self._send(
                404, _error(404, f"The model `{body.get('model')}` does not exist."), close=not keep
            )
            return
        if body.get("stream"):
            await self._stream_slowly(body, control, keep)
            return
        answer = completion(self.server, body, control)
        if control.get("reflect"):
            answer["echo_request"] = {
                "body": body,
                "authorization": self.headers.get(b"authorization", b"").decode() or None,
                "connection": self.number,
                "models_requests": self.server.models_requests,
            }
        self._send(200, orjson.dumps(answer), close=not keep)
        if control.get("close") and self.transport is not None:
            # Like a server closing an idle keep-alive connection: requests that arrive
            # meanwhile are dropped unanswered (the client must retry them elsewhere).
            self.closing = True
            asyncio.get_running_loop().call_later(
                float(control.get("close_delay_s", 0)), self.transport.close
            )

    def _stream(self, body: dict[str, Any], control: dict[str, Any], keep: bool) -> None:
        assert self.transport is not None
        parts = [_stream_head(keep)]
        for event in chunks(self.server, body, control):
            parts.append(_sse(b"data: " + orjson.dumps(event) + b"\n\n"))
        parts.append(_sse(b"data: [DONE]\n\n"))
        parts.append(b"0\r\n\r\n")
        self.transport.write(b"".join(parts))
        if not keep:
            self.transport.close()

    async def _stream_slowly(
        self, body: dict[str, Any], control: dict[str, Any], keep: bool
    ) -> None:
        """A stream whose chunks are written one by one, `chunk_delay_s` apart."""
        assert self.transport is not None
        delay = float(control.get("chunk_delay_s", self.server.chunk_delay_s))
        die_after = control.get("die_after")
        self.transport.write(_stream_head(keep))
        for n, event in enumerate(chunks(self.server, body, control)):
            if self.transport.is_closing():
                return
            if die_after is not None and n >= int(die_after):
                self.transport.close()  # the stream dies: no terminating chunk
                return
            self.transport.write(_sse(b"data: " + orjson.dumps(event) + b"\n\n"))
            await asyncio.sleep(delay)
        self.transport.write(_sse(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        if not keep:
            self.transport.close()

    def _send(self, status: int, payload: bytes, *, close: bool) -> None:
        assert self.transport is not None
        if self.transport.is_closing():
            return
        reason = _REASONS.get(status, b"Error")
        head = (
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n"
            % (
                status,
                reason,
                len(payload),
                b"connection: close\r\n" if close else b"",
            )
        )
        self.transport.write(head + payload)
        if close:
            self.transport.close()


def _stream_head(keep: bool) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
        b"transfer-encoding: chunked\r\n"
        + (b"connection: keep-alive\r\n\r\n" if keep else b"connection: close\r\n\r\n")
    )


def _sse(event: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(event), event)


async def serve(
    host: str,
    port: int,
    models: list[str],
    api_key: str | None,
    tls: ssl.SSLContext | None,
    capacity: int = 0,
    service_s: float = 0.0,
    chunk_delay_s: float = 0.0,
) -> None:
    server = EchoServer(models, api_key, capacity, service_s, chunk_delay_s)
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(lambda: _Connection(server), host, port, backlog=1024, ssl=tls)
    bound = srv.sockets[0].getsockname()[1]
    print(f"listening on {'https' if tls else 'http'}://{host}:{bound}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with srv:
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port (printed)")
    p.add_argument("--model", action="append", help="served model id (repeatable); default: echo")
    p.add_argument("--api-key", default=None, help="require this bearer token")
    p.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM)")
    p.add_argument("--tls-key", help="the certificate's private key (PEM)")
    p.add_argument(
        "--capacity", type=int, default=0, help="completions served at once (0: no limit)"
    )
    p.add_argument(
        "--service-s", type=float, default=0.0, help="how long each completion takes (seconds)"
    )
    p.add_argument(
        "--chunk-delay-s", type=float, default=0.0, help="seconds between a stream's chunks"
    )
    args = p.parse_args(argv)
    tls = None
    if args.tls_cert:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(args.tls_cert, args.tls_key)
    coro = serve(
        args.host,
        args.port,
        args.model or ["echo"],
        args.api_key,
        tls,
        args.capacity,
        args.service_s,
        args.chunk_delay_s,
    )
    try:
        import uvloop
    except ImportError:  # plain asyncio still works, just slower
        asyncio.run(coro)
    else:
        uvloop.run(coro)


def launch(*args: str) -> tuple[subprocess.Popen[str], int]:
    """This server in a subprocess on a free loopback port (`args`: more of its flags, e.g.
    "--capacity", "2"): the process and its port, once it listens."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--port", "0", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        raise SystemExit(f"echo upstream did not start: {line!r}")
    return proc, int(line.rsplit(":", 1)[1])


if __name__ == "__main__":
    main()
