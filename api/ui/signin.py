"""Dashboard sign-in: a Reef token exchanged for a session cookie, and the CSRF token of forms.

Why a server-side session rather than the token in a cookie: the cookie then carries nothing
that works anywhere else (the API takes bearer tokens only), and signing out ends it. Sessions
live in the database (reef.store.ui_sessions: why there and not in a signed cookie), so every
replica on it knows them and a sign-out on one ends the session on all; they last `TTL_S`.

The cookie is HttpOnly (no script reads it) and SameSite=Strict (no other site's page makes
the browser send it). Every state-changing form carries the session's CSRF token as well,
compared in constant time, on top of the BrowserGuard's Origin/Sec-Fetch-Site check. Without
tokens (loopback only) nobody signs in: every caller is admin, as on the API, and the forms
carry a per-process CSRF token.
"""

from __future__ import annotations

import asyncio
import hmac
from dataclasses import dataclass
from urllib.parse import parse_qs

from starlette.requests import Request

from reef.api.auth import Principal, hash_token
from reef.api.services import services
from reef.errors import (
    BadRequest,
    Forbidden,
    PayloadTooLarge,
    Unauthorized,
    UnsupportedMediaType,
)
from reef.settings import Settings

COOKIE = "reef_ui"
TTL_S = 12 * 3600
MAX_FORM_BYTES = 64 * 1024


class SignInRequired(Unauthorized):
    """No valid dashboard session: the page sends the browser to the sign-in form."""

    code = "sign_in_required"


@dataclass(frozen=True)
class Viewer:
    """Who looks at a page: the principal, and the CSRF token their forms must carry."""

    principal: Principal
    csrf: str
    signed_in: bool  # False in no-token mode (nothing to sign out of)


def anonymous_csrf(request: Request) -> str:
    """The CSRF token of no-token mode: per process, unknown to any other page."""
    found: str = request.app.state.ui_anonymous_csrf
    return found


async def viewer(request: Request) -> Viewer:
    """The page's viewer: in no-token mode the anonymous admin; else the cookie's session (a
    database lookup, in a worker thread), or SignInRequired."""
    svc = services(request)
    if not svc.auth.enabled:
        return Viewer(svc.auth.principal(request), anonymous_csrf(request), signed_in=False)
    session = await asyncio.to_thread(svc.ui_sessions.get, request.cookies.get(COOKIE))
    # a session whose token is no longer configured (here) signs nobody in
    principal = svc.auth.known(session.token_sha256) if session is not None else None
    if session is None or principal is None:
        raise SignInRequired("sign in with a Reef token to see the dashboard")
    return Viewer(principal, session.csrf, signed_in=True)


async def read_form(request: Request) -> dict[str, str]:
    """A urlencoded form body (one value per field), size-capped."""
    kind = (request.headers.get("content-type") or "").partition(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise UnsupportedMediaType("send the form as application/x-www-form-urlencoded")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise PayloadTooLarge(f"form exceeds {MAX_FORM_BYTES} bytes")
    fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[0] for k, v in fields.items()}


async def checked_form(request: Request, who: Viewer) -> dict[str, str]:
    """The form of a state-changing request, after its CSRF token checked out."""
    form = await read_form(request)
    if not hmac.compare_digest(form.get("csrf", ""), who.csrf):
        raise Forbidden(
            "the form's CSRF token is missing or stale: reload the page and try again",
            code="csrf_token",
        )
    return form


def secure_cookie(settings: Settings, scheme: str) -> bool:
    """Whether the session cookie is Secure: auth.secure_cookie when set; else on for a
    server bound off loopback with tokens (reached through a TLS proxy that may speak plain
    http to it), or a request that came over https."""
    if settings.auth.secure_cookie is not None:
        return settings.auth.secure_cookie
    exposed = bool(settings.auth.tokens) and not settings.server.is_loopback
    return exposed or scheme == "https"


def sign_in(request: Request, token: str) -> str:
    """A new session id for `token`'s principal; Unauthorized for an unknown token."""
    if not token.strip():
        raise BadRequest("enter a Reef token", param="token")
    svc = services(request)
    svc.auth.check(token.strip())  # Unauthorized unless configured
    return svc.ui_sessions.open(hash_token(token.strip()), TTL_S)


def sign_out(request: Request) -> None:
    """End the request's session, on every replica."""
    services(request).ui_sessions.close(request.cookies.get(COOKIE))
