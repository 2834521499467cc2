"""The headers every /ui answer carries: no framing by other sites, scripts and styles only
from the dashboard's own files, no MIME sniffing, no full URLs in Referer. The API docs (/docs,
/redoc) carry the same, with a policy that also lets Swagger UI and ReDoc run: styles they
inject, images as data: URIs, ReDoc's search worker from a blob: (their scripts are still this
server's files only, and nothing is fetched from anywhere else).

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
DOCS_CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)


def _headers(policy: str) -> tuple[tuple[bytes, bytes], ...]:
    return (
        (b"x-frame-options", b"DENY"),
        (b"content-security-policy", policy.encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"same-origin"),
    )


HEADERS = _headers(CONTENT_SECURITY_POLICY)
DOCS_HEADERS = _headers(DOCS_CONTENT_SECURITY_POLICY)
_NAMES = frozenset(name for name, _ in HEADERS)
DOCS_PATHS = frozenset({"/docs", "/redoc"})


def is_ui(path: str) -> bool:
    return path == "/ui" or path.startswith("/ui/")


class UiHeaders:
    """Adds HEADERS to every HTTP answer under /ui and DOCS_HEADERS to the docs pages
    (replacing any of the same name)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if is_ui(path):
            headers = HEADERS
        elif path in DOCS_PATHS:
            headers = DOCS_HEADERS
        else:
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", ()) if k.lower() not in _NAMES]
                message = {**message, "headers": [*kept, *headers]}
            await send(message)

        await self.app(scope, receive, send_with_headers)
