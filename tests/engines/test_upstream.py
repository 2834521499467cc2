"""The upstream engine against real OpenAI-compatible HTTP servers on loopback.

The main server here is bench/echo_upstream.py: a benchmark and test fixture that stands in
for a remote OpenAI-compatible server (vLLM, a hosted API), answering deterministically and
failing on request. It is not a fake of anything Reef runs; the engine's HTTP client talks to
it over real sockets. A second, minimal uvicorn/Starlette server checks the client against
another HTTP implementation (chunked framing by uvicorn, idle keep-alive connections closed
by the server as vLLM's uvicorn does).
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from reef.engines.base import Completion, Engine
from reef.engines.chunks import assemble
from reef.engines.upstream import UpstreamEngine, decode_sse
from reef.errors import UpstreamError, UpstreamRejected

ECHO = Path(__file__).resolve().parents[2] / "bench" / "echo_upstream.py"
KEY = "sk-echo-test"
T = TypeVar("T")


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, str(ECHO), "--port", "0", "--api-key", KEY, "--model", "echo"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "listening on http://127.0.0.1:PORT"
        assert line.startswith("listening on "), line
        yield line.split()[-1] + "/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def chat(text: str = "hello big blue world", **extra: Any) -> dict[str, Any]:
    return {"model": "echo", "messages": [{"role": "user", "content": text}], **extra}


async def with_engine(url: str, fn: Callable[[UpstreamEngine], Awaitable[T]], **kw: Any) -> T:
    kw.setdefault("api_key", KEY)
    kw.setdefault("timeout_s", 10.0)
    engine = UpstreamEngine(url, **kw)
    await engine.start()
    try:
        return await fn(engine)
    finally:
        await engine.aclose()


async def collect(
    engine: UpstreamEngine, body: dict[str, Any]
) -> tuple[list[dict[str, Any]], Completion]:
    chunks: list[dict[str, Any]] = []
    final: Completion | None = None
    async for item in engine.stream(body):
        if isinstance(item, Completion):
            assert final is None, "exactly one Completion"
            final = item
        else:
            assert final is None, "the Completion comes last"
            chunks.append(item)
    assert final is not None
    return chunks, final


def test_is_an_engine_and_discovers_models(echo_url: str) -> None:
    async def go(engine: UpstreamEngine) -> None:
        assert isinstance(engine, Engine)
        assert engine.kind == "upstream"
        assert engine.models() == ["echo"]
        assert await engine.ready()

    run(with_engine(echo_url, go, model=None))
    assert UpstreamEngine(echo_url, model="served-as").models() == ["served-as"]


def test_complete_round_trip(echo_url: str) -> None:
    async def go(engine: UpstreamEngine) -> Completion:
        return await engine.complete(chat("hello big blue world"))

    c = run(with_engine(echo_url, go))
    assert c.response["object"] == "chat.completion"
    assert c.response["choices"][0]["message"]["content"] == "hello big blue world"
    assert c.response["choices"][0]["finish_reason"] == "stop"
    assert c.response["usage"]["completion_tokens"] == 4
    # Without capture and without the client asking, there are no tokens to keep.
    assert c.prompt_token_ids is None and c.completion_token_ids is None and c.logprobs is None
    assert c.timings["total_ms"] > 0


def test_stream_round_trip_arrives_incrementally(echo_url: str) -> None:
    async def go(engine: UpstreamEngine) -> tuple[list[float], list[dict[str, Any]], Completion]:
        arrivals: list[float] = []
        chunks: list[dict[str, Any]] = []
        final = None
        t0 = time.perf_counter()
        body = chat("one two three four", echo_upstream={"chunk_delay_s": 0.15})
        async for item in engine.stream(body):
            if isinstance(item, Completion):
                final = item
            else:
                arrivals.append(time.perf_counter() - t0)
                chunks.append(item)
        assert final is not None
        return arrivals, chunks, final

    arrivals, chunks, final = run(with_engine(echo_url, go))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    # Six chunks 0.15 s apart: the first must come long before the last (no buffering).
    assert arrivals[-1] - arrivals[0] > 0.5
    assert final.response == assemble(chunks)
    message = final.response["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "one two three four"}
    assert final.response["choices"][0]["finish_reason"] == "stop"
    assert final.timings["ttft_ms"] < final.timings["total_ms"] - 500


def test_body_passes_through_unchanged(echo_url: str) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Look a word up.",
                "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
            },
        }
    ]
    body = chat(
        "find reef",
        tools=tools,
        tool_choice="auto",
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
        temperature=0.3,
        some_future_field={"nested": [1, 2.5, None, "ü"]},
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "find reef"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": '{"word": "reef"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "a ridge of coral"},
            {"role": "user", "content": "thanks"},
        ],
        echo_upstream={"reflect": True},
    )
    sent = orjson.loads(orjson.dumps(body))

    async def go(engine: UpstreamEngine) -> Completion:
        return await engine.complete(body)

    c = run(with_engine(echo_url, go))
    received = c.response["echo_request"]
    assert received["body"] == sent
    assert received["authorization"] == f"Bearer {KEY}"
    assert body == sent, "the caller's body is not modified"


def test_configured_model_replaces_the_clients(echo_url: str) -> None:
    async def replaced(engine: UpstreamEngine) -> Completion:
        return await engine.complete(chat(model="whatever-alias", echo_upstream={"reflect": True}))

    c = run(with_engine(echo_url, replaced, model="echo"))
    assert c.response["echo_request"]["body"]["model"] == "echo"
    assert c.response["model"] == "echo"

    async def passed(engine: UpstreamEngine) -> Completion:
        return await engine.complete(chat(model="not-served"))

    with pytest.raises(UpstreamRejected) as e:  # nothing configured: the client's model goes
        run(with_engine(echo_url, passed, model=None))
    assert e.value.status == 404
    assert "not-served" in e.value.message


def test_token_capture_plain_hides_what_was_not_asked(echo_url: str) -> None:
    async def go(engine: UpstreamEngine) -> tuple[Completion, Completion]:
        plain = await engine.complete(chat("alpha beta gamma", echo_upstream={"reflect": True}))
        asked = await engine.complete(chat("alpha beta gamma", logprobs=True))
        return plain, asked

    plain, asked = run(with_engine(echo_url, go, capture_tokens=True))
    forwarded = plain.response["echo_request"]["body"]
    assert forwarded["return_token_ids"] is True and forwarded["logprobs"] is True
    assert plain.prompt_token_ids is not None and len(plain.prompt_token_ids) == 3
    assert plain.completion_token_ids is not None and len(plain.completion_token_ids) == 3
    assert plain.logprobs is not None and len(plain.logprobs) == 3
    assert all(lp < 0 for lp in plain.logprobs)
    # The client asked for neither: it sees what vLLM sends when not asked.
    choice = plain.response["choices"][0]
    assert choice["logprobs"] is None and choice["token_ids"] is None
    assert plain.response["prompt_token_ids"] is None
    # This client asked for log-probs: it keeps them, but not the token ids.
    choice = asked.response["choices"][0]
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == asked.logprobs
    assert choice["token_ids"] is None
    assert asked.completion_token_ids == plain.completion_token_ids


def test_token_capture_stream(echo_url: str) -> None:
    async def go(engine: UpstreamEngine) -> tuple[Completion, Any, Any]:
        plain = await engine.complete(chat("alpha beta gamma"))
        hidden = await collect(engine, chat("alpha beta gamma"))
        asked = await collect(
            engine,
            chat(
                "alpha beta gamma",
                return_token_ids=True,
                stream_options={"include_usage": True},
            ),
        )
        return plain, hidden, asked

    plain, (chunks, final), (asked_chunks, asked_final) = run(
        with_engine(echo_url, go, capture_tokens=True)
    )
    assert final.prompt_token_ids == plain.prompt_token_ids
    assert final.completion_token_ids == plain.completion_token_ids
    assert final.logprobs == plain.logprobs
    # Not asked: no usage-only chunk, no ids, no log-probs in what the client got.
    assert all(c["choices"] for c in chunks)
    assert all("usage" not in c for c in chunks)
    assert all(c.get("prompt_token_ids") is None for c in chunks)
    assert all(
        ch.get("token_ids") is None and ch["logprobs"] is None
        for c in chunks
        for ch in c["choices"]
    )
    assert "usage" not in final.response and "prompt_token_ids" not in final.response
    # Asked for ids and usage: both arrive; log-probs (not asked) do not.
    assert asked_chunks[-1]["choices"] == [] and asked_chunks[-1]["usage"]["completion_tokens"] == 3
    assert asked_final.response["usage"]["prompt_tokens"] == 3
    assert asked_final.response["prompt_token_ids"] == plain.prompt_token_ids
    assert asked_final.response["choices"][0]["token_ids"] == plain.completion_token_ids
    assert asked_final.response["choices"][0]["logprobs"] is None
    assert asked_final.logprobs == plain.logprobs


def test_stream_tool_call_is_assembled(echo_url: str) -> None:
    tools = [{"type": "function", "function": {"name": "shout", "parameters": {}}}]

    async def go(engine: UpstreamEngine) -> tuple[list[dict[str, Any]], Completion]:
        return await collect(engine, chat("ahoy", tools=tools, echo_upstream={"call_tool": True}))

    chunks, final = run(with_engine(echo_url, go))
    assert sum(1 for c in chunks for ch in c["choices"] if ch["delta"].get("tool_calls")) == 2
    choice = final.response["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["id"] == "call_echo_0" and call["function"]["name"] == "shout"
    assert orjson.loads(call["function"]["arguments"]) == {"echo": "ahoy"}


def test_upstream_5xx_is_an_upstream_error_with_its_message(echo_url: str) -> None:
    failing = {"status": 503, "message": "KV cache exhausted, try later"}

    async def plain(engine: UpstreamEngine) -> Completion:
        return await engine.complete(chat(echo_upstream=failing))

    with pytest.raises(UpstreamError) as e:
        run(with_engine(echo_url, plain))
    assert e.value.status == 502
    assert "503" in e.value.message and "KV cache exhausted, try later" in e.value.message

    async def streamed(engine: UpstreamEngine) -> Any:
        return await collect(engine, chat(echo_upstream=failing))

    with pytest.raises(UpstreamError, match="KV cache exhausted"):
        run(with_engine(echo_url, streamed))


def test_upstream_4xx_is_relayed_with_its_status(echo_url: str) -> None:
    failing = {"status": 400, "message": "max_tokens must be at least 1"}

    async def plain(engine: UpstreamEngine) -> Completion:
        return await engine.complete(chat(echo_upstream=failing))

    with pytest.raises(UpstreamRejected) as e:
        run(with_engine(echo_url, plain))
    assert e.value.status == 400
    assert e.value.message == "max_tokens must be at least 1"

    async def streamed(engine: UpstreamEngine) -> Any:
        return await collect(engine, chat(echo_upstream={**failing, "status": 422}))

    with pytest.raises(UpstreamRejected) as e:
        run(with_engine(echo_url, streamed))
    assert e.value.status == 422

    async def no_key(engine: UpstreamEngine) -> Completion:
        return await engine.complete(chat())

    with pytest.raises(UpstreamRejected) as e:
        run(with_engine(echo_url, no_key, api_key=None, model="echo"))
    assert e.value.status == 401


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"  # nothing listens there now


def test_unreachable_upstream() -> None:
    url = closed_port_url()
    with pytest.raises(UpstreamError, match="unreachable") as e:
        run(with_engine(url, lambda engine: engine.complete(chat())))
    assert e.value.status == 502
    with pytest.raises(UpstreamError, match="unreachable"):  # discovery at start
        run(with_engine(url, lambda engine: asyncio.sleep(0), model=None))

    async def not_ready(engine: UpstreamEngine) -> bool:
        return await engine.ready()

    assert run(with_engine(url, not_ready, model="echo")) is False


def test_timeout_is_an_upstream_error(echo_url: str) -> None:
    async def go(engine: UpstreamEngine) -> Completion:
        return await engine.complete(chat(echo_upstream={"delay_s": 3}))

    t0 = time.monotonic()
    with pytest.raises(UpstreamError, match=r"did not answer within 0\.3s"):
        run(with_engine(echo_url, go, timeout_s=0.3))
    assert time.monotonic() - t0 < 2.5

    async def stalled(engine: UpstreamEngine) -> Any:
        return await collect(engine, chat("a b c", echo_upstream={"chunk_delay_s": 3}))

    with pytest.raises(UpstreamError, match="stalled"):
        run(with_engine(echo_url, stalled, timeout_s=0.3))


def test_stream_dying_midway_is_an_upstream_error(echo_url: str) -> None:
    got: list[dict[str, Any]] = []

    async def go(engine: UpstreamEngine) -> None:
        async for item in engine.stream(chat("a b c d e", echo_upstream={"die_after": 3})):
            assert not isinstance(item, Completion)
            got.append(item)

    with pytest.raises(UpstreamError, match="broke after 3 chunks"):
        run(with_engine(echo_url, go))
    assert len(got) == 3


def test_connections_are_reused_and_readiness_is_cached(echo_url: str) -> None:
    async def go(engine: UpstreamEngine) -> list[dict[str, Any]]:
        seen = []
        for _ in range(3):
            c = await engine.complete(chat(echo_upstream={"reflect": True}))
            seen.append(c.response["echo_request"])
            await collect(engine, chat())
        assert all(await asyncio.gather(*[engine.ready() for _ in range(50)]))
        assert await engine.ready()
        c = await engine.complete(chat(echo_upstream={"reflect": True}))
        seen.append(c.response["echo_request"])
        return seen

    seen = run(with_engine(echo_url, go))
    assert len({s["connection"] for s in seen}) == 1, "one keep-alive connection throughout"
    assert seen[-1]["models_requests"] - seen[0]["models_requests"] == 1


def test_connection_closed_by_the_server_is_not_reused(echo_url: str) -> None:
    async def go(engine: UpstreamEngine) -> list[int]:
        numbers = []
        for _ in range(3):
            c = await engine.complete(chat(echo_upstream={"reflect": True, "close": True}))
            numbers.append(c.response["echo_request"]["connection"])
        return numbers

    numbers = run(with_engine(echo_url, go))
    assert len(set(numbers)) == 3


def test_request_on_a_connection_the_server_is_closing_is_retried(echo_url: str) -> None:
    """The keep-alive race: the next request leaves before the server's close arrives."""

    async def go(engine: UpstreamEngine) -> list[Completion]:
        closing = {"reflect": True, "close": True, "close_delay_s": 0.2}
        first = await engine.complete(chat("first", echo_upstream=closing))
        second = await engine.complete(chat("second", echo_upstream={"reflect": True}))
        return [first, second]

    first, second = run(with_engine(echo_url, go))
    assert second.response["choices"][0]["message"]["content"] == "second"
    assert (
        second.response["echo_request"]["connection"]
        != first.response["echo_request"]["connection"]
    )


def test_many_concurrent_requests(echo_url: str) -> None:
    async def go(engine: UpstreamEngine) -> list[Completion]:
        return await asyncio.gather(*[engine.complete(chat(f"n {i}")) for i in range(200)])

    done = run(with_engine(echo_url, go, max_connections=64))
    assert [c.response["choices"][0]["message"]["content"] for c in done] == [
        f"n {i}" for i in range(200)
    ]


def test_https_upstream(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    cmd = [sys.executable, str(ECHO), "--port", "0", "--tls-cert", str(cert), "--tls-key", str(key)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split()[-1] + "/v1"
        assert url.startswith("https://")
        trusted = ssl.create_default_context(cafile=str(cert))

        async def go(engine: UpstreamEngine) -> tuple[Completion, Completion]:
            plain = await engine.complete(chat("over tls"))
            _, streamed = await collect(engine, chat("still tls"))
            return plain, streamed

        plain, streamed = run(with_engine(url, go, model=None, ssl_context=trusted))
        assert plain.response["choices"][0]["message"]["content"] == "over tls"
        assert streamed.response["choices"][0]["message"]["content"] == "still tls"
        # Without trusting the certificate the upstream is unreachable, not silently trusted.
        with pytest.raises(UpstreamError, match="CERTIFICATE_VERIFY_FAILED"):
            run(with_engine(url, lambda engine: engine.complete(chat())))
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# A second HTTP implementation: uvicorn (h11) + Starlette, closing idle connections after 1 s.


def _starlette_app() -> Starlette:
    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "star", "object": "model"}]})

    async def completions(request: Request) -> Response:
        body = await request.json()
        text = body["messages"][-1]["content"]
        if not body.get("stream"):
            message = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            return JSONResponse({"id": "c1", "object": "chat.completion", "choices": [choice]})

        async def events() -> Any:
            for word in text.split():
                chunk = {
                    "id": "c1",
                    "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}],
                }
                yield b"data: " + orjson.dumps(chunk) + b"\r\n\r\n"  # CRLF: allowed by SSE
                await asyncio.sleep(0)
            yield b": a comment line\n\ndata: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(
        routes=[
            Route("/v1/models", models),
            Route("/v1/chat/completions", completions, methods=["POST"]),
        ]
    )


@pytest.fixture(scope="module")
def uvicorn_url() -> Iterator[str]:
    config = uvicorn.Config(
        _starlette_app(),
        host="127.0.0.1",
        port=0,
        http="h11",
        timeout_keep_alive=1,
        log_level="warning",
        lifespan="off",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_another_server_implementation_and_idle_close(uvicorn_url: str) -> None:
    async def go(engine: UpstreamEngine) -> tuple[Completion, Completion, Completion]:
        first = await engine.complete(chat("hi there", model="star"))
        await asyncio.sleep(1.5)  # uvicorn closes the idle keep-alive connection meanwhile
        _, streamed = await collect(engine, chat("one two three", model="star"))
        again = await engine.complete(chat("still here", model="star"))
        return first, streamed, again

    first, streamed, again = run(with_engine(uvicorn_url, go, model=None, api_key=None))
    assert first.response["choices"][0]["message"]["content"] == "hi there"
    assert streamed.response["choices"][0]["message"]["content"] == "onetwothree"
    assert again.response["choices"][0]["message"]["content"] == "still here"


def test_decode_sse_however_the_bytes_are_split() -> None:
    stream = (
        b": keep-alive comment\r\n\r\n"
        b'data: {"n": 1}\r\n\r\n'
        b"event: message\nid: 7\n"
        b'data: {"n":\ndata: 2}\n\n'  # one event, its JSON on two data lines
        b'data:{"n": 3}\r\r'  # CR line ends, no space after the colon
        b"data: [DONE]\n\n"
        b'data: {"n": 4}\n\n'  # after [DONE]: ignored
    )

    async def decode(size: int) -> list[Any]:
        async def pieces() -> Any:
            for i in range(0, len(stream), size):
                yield stream[i : i + size]

        return [event async for event in decode_sse(pieces())]

    for size in (1, 2, 3, 7, len(stream)):
        assert run(decode(size)) == [{"n": 1}, {"n": 2}, {"n": 3}], size


# assemble(): pure function over chunk lists


def _chunk(*choices: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 7,
        "model": "m",
        "choices": list(choices),
        **top,
    }


def test_assemble_content_finish_usage_and_logprobs() -> None:
    def lp(token: str, value: float) -> dict[str, Any]:
        return {"content": [{"token": token, "logprob": value, "top_logprobs": []}]}

    chunks = [
        _chunk(
            {"index": 0, "delta": {"role": "assistant", "content": ""}}, prompt_token_ids=[1, 2]
        ),
        _chunk(
            {
                "index": 0,
                "delta": {"content": "Hel"},
                "logprobs": lp("Hel", -0.5),
                "token_ids": [10],
            }
        ),
        _chunk(
            {"index": 0, "delta": {"content": "lo"}, "logprobs": lp("lo", -0.25), "token_ids": [11]}
        ),
        _chunk({"index": 0, "delta": {}, "finish_reason": "length"}),
        _chunk(usage={"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}),
    ]
    out = assemble(chunks)
    assert out["id"] == "c" and out["object"] == "chat.completion" and out["model"] == "m"
    assert out["created"] == 7
    (choice,) = out["choices"]
    assert choice["message"] == {"role": "assistant", "content": "Hello"}
    assert choice["finish_reason"] == "length"
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == [-0.5, -0.25]
    assert choice["token_ids"] == [10, 11]
    assert out["usage"]["total_tokens"] == 4
    assert out["prompt_token_ids"] == [1, 2]


def test_assemble_merges_interleaved_tool_call_deltas_by_index() -> None:
    def call(index: int, **fields: Any) -> dict[str, Any]:
        return {"index": 0, "delta": {"tool_calls": [{"index": index, **fields}]}}

    chunks = [
        _chunk({"index": 0, "delta": {"role": "assistant", "content": None}}),
        _chunk(
            call(0, id="call_a", type="function", function={"name": "get_weather", "arguments": ""})
        ),
        _chunk(
            call(
                1, id="call_b", type="function", function={"name": "get_time", "arguments": '{"tz"'}
            )
        ),
        _chunk(call(0, function={"arguments": '{"city": '})),
        _chunk(call(1, function={"arguments": ': "UTC"}'})),
        _chunk(call(0, id="call_a", function={"arguments": '"Oslo"}'})),  # id repeated: kept once
        _chunk({"index": 0, "delta": {}, "finish_reason": "tool_calls"}),
    ]
    (choice,) = assemble(chunks)["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert choice["message"]["tool_calls"] == [
        {
            "id": "call_a",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
        },
        {
            "id": "call_b",
            "type": "function",
            "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'},
        },
    ]


def test_assemble_several_choices_reasoning_and_empty() -> None:
    chunks = [
        _chunk({"index": 1, "delta": {"role": "assistant", "content": "B"}}),
        _chunk({"index": 0, "delta": {"role": "assistant", "reasoning_content": "thinking"}}),
        _chunk({"index": 0, "delta": {"reasoning_content": " more", "content": "A"}}),
        _chunk(
            {"index": 1, "delta": {}, "finish_reason": "stop"},
            {"index": 0, "delta": {}, "finish_reason": "stop"},
        ),
    ]
    out = assemble(chunks)
    assert [c["index"] for c in out["choices"]] == [0, 1]
    assert out["choices"][0]["message"] == {
        "role": "assistant",
        "content": "A",
        "reasoning_content": "thinking more",
    }
    assert out["choices"][1]["message"]["content"] == "B"
    assert "usage" not in out
    empty = assemble([])
    assert empty["choices"] == [] and empty["object"] == "chat.completion"


def test_sampling_defaults_fill_a_request_that_names_none(echo_url: str) -> None:
    """engine.sampling_defaults: sent for a request naming no sampling parameter, and named on
    the Completion; a request naming one goes as it is. Unset, nothing is added."""

    async def go(engine: UpstreamEngine) -> list[Completion]:
        return [
            await engine.complete(chat(echo_upstream={"reflect": True})),
            await engine.complete(chat(temperature=0.7, echo_upstream={"reflect": True})),
        ]

    defaulted, named = run(with_engine(echo_url, go, sampling_defaults={"temperature": 0.2}))
    assert defaulted.response["echo_request"]["body"]["temperature"] == 0.2
    assert "top_p" not in defaulted.response["echo_request"]["body"]
    assert defaulted.sampling == {"temperature": 0.2, "top_p": None, "defaults": ["temperature"]}
    assert named.response["echo_request"]["body"]["temperature"] == 0.7
    assert named.sampling == {"temperature": 0.7, "top_p": None, "defaults": []}

    plain, _ = run(with_engine(echo_url, go))
    assert "temperature" not in plain.response["echo_request"]["body"]
    assert plain.sampling == {"temperature": None, "top_p": None, "defaults": []}


def test_a_scenario_s_sampling_defaults_replace_the_engine_s(echo_url: str) -> None:
    """A call's own sampling_defaults (a scenario's) stand for the engine's, streamed or not;
    {} sends none of them."""
    reflect = {"echo_upstream": {"reflect": True}}

    async def go(engine: UpstreamEngine) -> list[Completion]:
        streamed = [
            x async for x in engine.stream(chat(**reflect), sampling_defaults={"top_p": 0.8})
        ]
        assert isinstance(streamed[-1], Completion)
        return [
            await engine.complete(chat(**reflect), sampling_defaults={"top_p": 0.8}),
            await engine.complete(chat(**reflect), sampling_defaults={}),
            streamed[-1],
        ]

    own, off, streamed = run(with_engine(echo_url, go, sampling_defaults={"temperature": 0.2}))
    assert own.response["echo_request"]["body"]["top_p"] == 0.8
    assert "temperature" not in own.response["echo_request"]["body"]
    assert own.sampling == {"temperature": None, "top_p": 0.8, "defaults": ["top_p"]}
    assert streamed.sampling == own.sampling
    assert not {"temperature", "top_p"} & set(off.response["echo_request"]["body"])
    assert off.sampling == {"temperature": None, "top_p": None, "defaults": []}
