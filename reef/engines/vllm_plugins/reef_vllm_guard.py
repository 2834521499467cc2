"""ASGI middleware loaded into vLLM (`--middleware reef_vllm_guard.Guard`): its API key on every
route but /health.

vLLM's own key check (`--api-key` / VLLM_API_KEY) guards only paths under /v1, /v2, /inference
and /cohere (vllm/entrypoints/serve/middleware/authenticate.py). Everything else answers
anyone who reaches the port, and with VLLM_SERVER_DEV_MODE=1 (which Reef's deploys need) that
includes /collective_rpc (calls a method on every worker), /pause, /sleep, the weight-transfer
and reload routes, /server_info; without it still /tokenize, /metrics, /invocations and more.
This guard asks for the same bearer key there too. It leaves open /health (readiness probes,
Reef's and a load balancer's) and CORS preflights (OPTIONS), as vLLM's check does.

vLLM hands middleware nothing but the app, so the key is read from VLLM_API_KEY, where vLLM
reads it too. Without a key it refuses everything but /health: it is only ever loaded to guard.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = frozenset({"/health"})
_UNAUTHORIZED = b'{"error": "Unauthorized"}'
_NO_KEY = b'{"error": "Unauthorized: VLLM_API_KEY is not set in this server\'s environment"}'


class Guard:
    def __init__(self, app: ASGIApp, *args: Any, **kwargs: Any) -> None:
        self.app = app
        key = os.environ.get("VLLM_API_KEY") or ""
        self._digest = hashlib.sha256(key.encode()).digest() if key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get("method") == "OPTIONS":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", "")).removeprefix(str(scope.get("root_path", "")))
        if path in OPEN_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = _UNAUTHORIZED if self._digest is not None else _NO_KEY
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _authorized(self, scope: Scope) -> bool:
        if self._digest is None:
            return False
        for name, value in scope.get("headers") or ():
            if name.lower() == b"authorization":
                scheme, _, token = bytes(value).partition(b" ")
                if scheme.lower() == b"bearer":
                    return hmac.compare_digest(hashlib.sha256(token).digest(), self._digest)
        return False
