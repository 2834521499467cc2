"""The vLLM engine without vLLM: how Reef launches it (command line, environment) and that every
HTTP call it makes carries vLLM's API key. The real vLLM checks live in tests/vllm/.

The HTTP server here is a small Starlette app on loopback that answers vLLM's routes the way
vLLM does and records who called what: the client under test is Reef's, over real sockets.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from pydantic import SecretStr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from reef.engines.vllm import PLUGINS, VllmEngine
from reef.engines.vllm_plugins.reef_vllm_guard import Guard
from reef.engines.vllm_sync import auth_headers, keyed_session
from reef.settings import EngineSettings, VllmSettings, load_settings

KEY = "test-key-0123456789abcdefghijklmnopqrstuv"


def _launched(tiny_dir: Path, tmp_path: Path, **vllm: Any) -> VllmEngine:
    cfg = EngineSettings(kind="vllm", model=str(tiny_dir), vllm=VllmSettings(**vllm))
    return VllmEngine.from_config(cfg, tmp_path)


def test_launched_vllm_binds_loopback_with_a_random_key_off_its_command_line(
    tiny_dir: Path, tmp_path: Path
) -> None:
    server = _launched(tiny_dir, tmp_path).server
    assert server is not None
    command = server.command()
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert server.url.startswith("http://127.0.0.1:")
    key = server.api_key
    assert key is not None and len(key) >= 32
    assert not any(key in arg for arg in command)  # argv is readable by every user
    env = server.env()
    assert env["VLLM_API_KEY"] == key  # vLLM's own check reads it from there
    # ... and so does Reef's guard of the routes vLLM leaves open, loaded as middleware
    assert command[command.index("--middleware") + 1] == "reef_vllm_guard.Guard"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(PLUGINS)
    probe = "import reef_vllm_guard, sys; sys.exit(reef_vllm_guard.Guard is None)"
    subprocess.run([sys.executable, "-c", probe], env=env, check=True, cwd=tmp_path)
    # every launch its own key
    other = _launched(tiny_dir, tmp_path).server
    assert other is not None and other.api_key != key


def test_vllm_host_and_key_settings(tiny_dir: Path, tmp_path: Path) -> None:
    server = _launched(tiny_dir, tmp_path, host="0.0.0.0", api_key=SecretStr(KEY)).server
    assert server is not None
    command = server.command()
    assert command[command.index("--host") + 1] == "0.0.0.0"
    assert server.url.startswith("http://127.0.0.1:")  # reached on loopback
    assert server.api_key == KEY


def test_vllm_api_key_from_the_environment_stays_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REEF_ENGINE__VLLM__API_KEY", KEY)
    settings = load_settings()
    assert settings.engine.vllm.api_key is not None
    assert settings.engine.vllm.api_key.get_secret_value() == KEY
    assert KEY not in repr(settings) and KEY not in str(settings.model_dump())


def test_guard_asks_for_the_key_on_every_route_but_health(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def ok(request: Request) -> Response:
        return JSONResponse({"path": request.url.path})

    routes = [Route(p, ok, methods=["GET", "POST"]) for p in ("/health", "/collective_rpc")]
    app = Starlette(routes=routes)
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    app.add_middleware(Guard)  # as vLLM adds a --middleware class
    with TestClient(app) as client:
        assert client.get("/health").status_code == 200
        assert client.post("/collective_rpc").status_code == 401
        wrong = client.post("/collective_rpc", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        right = client.post("/collective_rpc", headers={"Authorization": f"Bearer {KEY}"})
        assert right.status_code == 200
        # CORS preflights pass, as vLLM's own check lets them
        assert client.options("/collective_rpc").status_code != 401

    monkeypatch.delenv("VLLM_API_KEY")
    closed = Starlette(routes=routes)
    closed.add_middleware(Guard)
    with TestClient(closed) as client:  # loaded without a key: it refuses, never opens
        assert (
            client.post("/collective_rpc", headers={"Authorization": "Bearer "}).status_code == 401
        )
        assert client.get("/health").status_code == 200


def test_nccl_sender_sessions_carry_the_key() -> None:
    import requests

    session = keyed_session(requests.Session, auth_headers(KEY))()
    assert session.headers["Authorization"] == f"Bearer {KEY}"
    assert auth_headers(None) == {}


# A stand-in for vLLM's HTTP surface (the routes Reef calls), recording each call.


class _Vllm:
    def __init__(self) -> None:
        self.served = "tiny"
        self.calls: list[tuple[str, str, str | None]] = []
        self.version = "default"
        self.bodies: list[dict[str, Any]] = []

    def app(self) -> Starlette:
        async def route(request: Request) -> Response:
            path = request.url.path
            self.calls.append((request.method, path, request.headers.get("authorization")))
            body = await request.json() if request.method == "POST" and await request.body() else {}
            if path == "/v1/models":
                return JSONResponse(
                    {"object": "list", "data": [{"id": self.served, "parent": None}]}
                )
            if path == "/weight_info":
                return JSONResponse({"weight_version": self.version})
            if path == "/update_weight_version":
                self.version = body["new_version"]
            if path == "/server_info":
                return JSONResponse({"vllm_config": {"lora_config": {"max_lora_rank": 64}}})
            if path == "/v1/chat/completions":
                self.bodies.append(body)
                choice = {
                    "index": 0,
                    "message": {"role": "assistant", "content": "hi"},
                    "finish_reason": "length",
                    "token_ids": [7],
                    "logprobs": {"content": [{"token": "hi", "logprob": -0.5}]},
                }
                return JSONResponse(
                    {
                        "id": "c1",
                        "object": "chat.completion",
                        "model": body.get("model"),
                        "choices": [choice],
                        "prompt_token_ids": [1, 2],
                    }
                )
            return JSONResponse({})

        paths = (
            "/health",
            "/v1/models",
            "/v1/chat/completions",
            "/v1/load_lora_adapter",
            "/weight_info",
            "/server_info",
            "/pause",
            "/resume",
            "/collective_rpc",
            "/update_weight_version",
            "/reset_prefix_cache",
        )
        return Starlette(routes=[Route(p, route, methods=["GET", "POST"]) for p in paths])


@pytest.fixture
def vllm() -> Iterator[tuple[_Vllm, str]]:
    stand_in = _Vllm()
    config = uvicorn.Config(
        stand_in.app(), host="127.0.0.1", port=0, log_level="warning", lifespan="off"
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
        yield stand_in, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _fake_sender(tmp_path: Path) -> Path:
    """Stands in for vLLM's python running vllm_sync.py: writes down what it was given."""
    script = tmp_path / "fake-python"
    script.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "key=$VLLM_API_KEY" "argv=$*" > {tmp_path / "sender.txt"}\n'
        "echo '{\"sync_s\": 0}'\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_every_call_to_vllm_carries_its_key(
    vllm: tuple[_Vllm, str],
    tiny_dir: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    stand_in, url = vllm
    cfg = EngineSettings(
        kind="vllm",
        model=str(tiny_dir),
        vllm=VllmSettings(url=url, api_key=SecretStr(KEY)),
        default_max_tokens=7,
    )
    engine = VllmEngine.from_config(cfg, tmp_path)
    engine.sync_python = _fake_sender(tmp_path)
    stand_in.served = tiny_dir.name  # the name Reef serves a model directory under

    async def go() -> None:
        await engine.start()
        try:
            await engine.complete({"model": "tiny", "messages": [{"role": "user", "content": "x"}]})
            assert await engine.ready()
            await engine.load_weights("s@r1", tiny_dir)  # pause, reload, version, resume
            await engine.verify("s@r1")
            engine.weight_sync = "nccl"
            await engine.load_weights("s@r2", tiny_dir)  # the NCCL sender
        finally:
            await engine.aclose()

    with caplog.at_level(logging.DEBUG):
        asyncio.run(go())
    paths = {path for _, path, _ in stand_in.calls}
    for route in ("/v1/models", "/v1/chat/completions", "/health", "/pause", "/collective_rpc"):
        assert route in paths, route
    assert all(auth == f"Bearer {KEY}" for _, _, auth in stand_in.calls), stand_in.calls
    # The sender got the key in its environment, not on its command line.
    sender = (tmp_path / "sender.txt").read_text()
    assert f"key={KEY}" in sender
    assert KEY not in sender.split("argv=", 1)[1]
    # A request naming no max_tokens is bounded on vLLM too.
    assert stand_in.bodies[0]["max_completion_tokens"] == 7
    assert KEY not in caplog.text


def test_a_wrong_key_stops_reef_at_start_saying_so(tiny_dir: Path) -> None:
    from reef.errors import BadRequest
    from tests.reefserver import EchoUpstream

    with EchoUpstream("--api-key", KEY, "--model", "echo") as upstream:
        root = upstream.base_url.removesuffix("/v1")
        engine = VllmEngine(root, "echo", tiny_dir, api_key="not-the-key")
        with pytest.raises(BadRequest, match=r"401.*engine\.vllm\.api_key"):
            asyncio.run(engine.start())
        right = VllmEngine(root, "echo", tiny_dir, api_key=KEY)

        async def go() -> None:
            await right.start()
            await right.aclose()

        asyncio.run(go())
