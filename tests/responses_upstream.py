"""A small real HTTP server that serves the OpenAI Responses API itself (`POST /v1/responses`,
plain and streamed, with `previous_response_id`; `GET /v1/models`), standing in for an upstream
such as OpenAI or vLLM behind `engine.upstream.responses: true`. It answers `echo: <the last
input text>` (and the number of earlier turns it remembers), with its own response ids, so a
test can tell that a body and an answer went through Reef unchanged. Served by uvicorn in a
thread of the test process, over loopback HTTP."""

from __future__ import annotations

import itertools
import socket
import threading
from collections.abc import Iterator
from typing import Any

import orjson
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from reef.testing.process import wait_ready

MODEL = "upstream-responses"


def _text(given: Any) -> str:
    if isinstance(given, str):
        return given
    texts = []
    for item in given or []:
        content = item.get("content") if isinstance(item, dict) else item
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts += [p.get("text", "") for p in content if isinstance(p, dict)]
        elif isinstance(item, dict) and item.get("type") == "function_call_output":
            texts.append(str(item.get("output")))
    return texts[-1] if texts else ""


def app() -> FastAPI:
    api = FastAPI()
    stored: dict[str, dict[str, Any]] = {}
    ids = itertools.count(1)
    api.state.bodies = []  # every body it was sent, as it arrived

    @api.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": MODEL, "object": "model"}]}

    @api.post("/v1/responses")
    async def responses(request: Request) -> Response:
        body = await request.json()
        api.state.bodies.append(body)
        if body.get("model") != MODEL or body.get("input") == "refuse me":
            return JSONResponse(
                {"error": {"message": "refused by the upstream", "code": "refused"}},
                status_code=400,
            )
        turns, previous = 0, body.get("previous_response_id")
        while previous in stored:
            turns += 1
            previous = stored[previous].get("previous_response_id")
        text = f"echo: {_text(body.get('input'))} (turns before: {turns})"
        n = next(ids)
        resp = {
            "id": f"resp_up{n}",
            "object": "response",
            "created_at": 1700000000,
            "status": "completed",
            "model": MODEL,
            "output": [
                {
                    "id": f"msg_up{n}",
                    "type": "message",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            ],
            "usage": {"input_tokens": 3, "output_tokens": len(text.split()), "total_tokens": 9},
            "previous_response_id": body.get("previous_response_id"),
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        }
        stored[resp["id"]] = resp
        if not body.get("stream"):
            return JSONResponse(resp)
        return StreamingResponse(_events(resp, text), media_type="text/event-stream")

    return api


def _events(resp: dict[str, Any], text: str) -> Iterator[bytes]:
    shell = {**resp, "status": "in_progress", "output": []}
    item = resp["output"][0]
    words = text.split(" ")
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": shell},
        {"type": "response.output_item.added", "output_index": 0, "item": {**item, "content": []}},
    ]
    for i, word in enumerate(words):
        delta = word if i == 0 else " " + word
        events.append(
            {
                "type": "response.output_text.delta",
                "item_id": item["id"],
                "output_index": 0,
                "content_index": 0,
                "delta": delta,
                "logprobs": [],
            }
        )
    events += [
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": resp},
    ]
    for seq, event in enumerate(events):
        data = orjson.dumps({**event, "sequence_number": seq})
        yield b"event: " + event["type"].encode() + b"\ndata: " + data + b"\n\n"


class ResponsesUpstream:
    """The server above on a loopback port; `base_url` ends in /v1, `bodies` what it got."""

    def __init__(self) -> None:
        import uvicorn

        self.app = app()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.bind(("127.0.0.1", 0))
        port = self._sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        config = uvicorn.Config(self.app, log_config=None, access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return list(self.app.state.bodies)

    def __enter__(self) -> ResponsesUpstream:
        self._thread.start()
        wait_ready(f"{self.base_url}/models", 30.0, lambda: None)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()
