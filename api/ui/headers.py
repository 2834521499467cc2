"""The headers every /ui answer carries: no framing by other sites, scripts and styles only
from the dashboard's own files, no MIME sniffing, no full URLs in Referer.

Why on every answer under /ui (pages, redirects, errors, assets, the guard's refusals): in
no-token mode the approve, rollback and evolve buttons need no sign-in, so a page that could
frame them could have them clicked through a transparent frame (clickjacking). A pure ASGI
middleware, so that answers made before any route runs (421, 403) carry them too; it passes
every other path through untouched.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
)
_NAMES = frozenset(name for name, _ in HEADERS)


def is_ui(path: str) -> bool:
    return path == "/ui" or path.startswith("/ui/")


class UiHeaders:
    """Adds HEADERS to every HTTP answer under /ui (replacing any of the same name)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_ui(scope["path"]):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", ()) if k.lower() not in _NAMES]
                message = {**message, "headers": [*kept, *HEADERS]}
            await send(message)

        await self.app(scope, receive, send_with_headers)
