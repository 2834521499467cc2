"""The sign-in form and sign-out (the sessions, cookie and CSRF tokens themselves:
api.ui.signin)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from reef.api.services import services
from reef.api.ui.pages.common import call, page, render
from reef.api.ui.signin import (
    COOKIE,
    TTL_S,
    checked_form,
    read_form,
    secure_cookie,
    sign_in,
    sign_out,
    viewer,
)
from reef.errors import ReefError

router = APIRouter(prefix="/ui", include_in_schema=False)


@router.get("/login")
async def login_form(request: Request, next: str = "/ui") -> Response:
    if not services(request).auth.enabled:
        return RedirectResponse(safe_next(next), status_code=303)
    return render(request, "login.html", None, next=safe_next(next), error=None)


@router.post("/login")
async def login(request: Request) -> Response:
    form = await read_form(request)
    target = safe_next(form.get("next", "/ui"))
    try:
        sid = await call(sign_in, request, form.get("token", ""))
    except ReefError as e:
        refused = render(request, "login.html", None, next=target, error=e.message)
        refused.status_code = e.status
        return refused
    resp = RedirectResponse(target, status_code=303)
    resp.set_cookie(
        COOKIE,
        sid,
        max_age=TTL_S,
        path="/ui",
        httponly=True,
        samesite="strict",
        secure=secure_cookie(services(request).settings, request.url.scheme),
    )
    return resp


@router.post("/logout")
@page
async def logout(request: Request) -> Response:
    who = await viewer(request)
    await checked_form(request, who)
    await call(sign_out, request)
    resp = RedirectResponse("/ui/login", status_code=303)
    resp.delete_cookie(COOKIE, path="/ui")
    return resp


def safe_next(target: str) -> str:
    """Only our own pages: an open redirect would hand a signed-in browser to anyone."""
    if not target.startswith("/ui") or target.startswith("//") or "\\" in target:
        return "/ui"
    return target
