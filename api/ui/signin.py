"""Dashboard sign-in: a Reef token exchanged for a session cookie, and the CSRF token of forms.

Why a server-side session rather than the token in a cookie: the cookie then carries nothing
that works anywhere else (the API takes bearer tokens only), and signing out ends it. Sessions
live in this process (a restart signs everyone out) and last `TTL`.

The cookie is HttpOnly (no script reads it) and SameSite=Strict (no other site's page makes
the browser send it). Every state-changing form carries the session's CSRF token as well,
compared in constant time, on top of the BrowserGuard's Origin/Sec-Fetch-Site check. Without
tokens (loopback only) nobody signs in: every caller is admin, as on the API, and the forms
carry a per-process CSRF token.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from urllib.parse import parse_qs

from starlette.requests import Request

from api.auth import Principal
from api.services import services
from reef.errors import (
    BadRequest,
    Forbidden,
    PayloadTooLarge,
    Unauthorized,
    UnsupportedMediaType,
)

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


@dataclass
class _Session:
    principal: Principal
    csrf: str
    expires: float


class Sessions:
    """The dashboard's sessions of one process: opaque id -> principal and CSRF token."""

    def __init__(self) -> None:
        self._by_id: dict[str, _Session] = {}
        self._lock = threading.Lock()
        # the CSRF token of no-token mode: per process, unknown to any other page
        self.anonymous_csrf = secrets.token_urlsafe(32)

    def open(self, principal: Principal) -> str:
        sid = secrets.token_urlsafe(32)
        now = time.monotonic()
        with self._lock:
            self._by_id = {k: v for k, v in self._by_id.items() if v.expires > now}
            self._by_id[sid] = _Session(principal, secrets.token_urlsafe(32), now + TTL_S)
        return sid

    def get(self, sid: str | None) -> _Session | None:
        if not sid:
            return None
        with self._lock:
            session = self._by_id.get(sid)
        if session is None or session.expires <= time.monotonic():
            return None
        return session

    def close(self, sid: str | None) -> None:
        if sid:
            with self._lock:
                self._by_id.pop(sid, None)


def sessions(request: Request) -> Sessions:
    found: Sessions = request.app.state.ui_sessions
    return found


def viewer(request: Request) -> Viewer:
    """The page's viewer: in no-token mode the anonymous admin; else the cookie's session, or
    SignInRequired."""
    svc = services(request)
    store = sessions(request)
    if not svc.auth.enabled:
        return Viewer(svc.auth.principal(request), store.anonymous_csrf, signed_in=False)
    session = store.get(request.cookies.get(COOKIE))
    if session is None:
        raise SignInRequired("sign in with a Reef token to see the dashboard")
    return Viewer(session.principal, session.csrf, signed_in=True)


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


def sign_in(request: Request, token: str) -> str:
    """A new session id for `token`'s principal; Unauthorized for an unknown token."""
    if not token.strip():
        raise BadRequest("enter a Reef token", param="token")
    principal = services(request).auth.check(token.strip())
    return sessions(request).open(principal)
