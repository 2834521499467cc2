"""What every page of the dashboard shares: its templates, the `page` wrapper (sign-in
redirect, errors as pages), rendering with the status line, the viewer's scope check and the
one guard of every admin action."""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from reef.api.services import Services, check_scenario_name, services
from reef.api.ui.signin import SignInRequired, Viewer, checked_form, viewer
from reef.api.ui.views.releases import Links
from reef.api.ui.views.text import age, num, short
from reef.errors import BadRequest, ReefError
from reef.figures import Figure, load_figures

templates = Jinja2Templates(directory=str(Path(__file__).parents[1] / "templates"))
templates.env.globals.update(age=age, short=short)
templates.env.filters["num"] = num

PAGE_SIZE = 50

Page = Callable[..., Awaitable[Response]]


def page(fn: Page) -> Page:
    """A page: no session sends the browser to sign in; a ReefError renders as an error page
    with its status (the JSON API's message, in HTML)."""

    @functools.wraps(fn)
    async def wrapped(request: Request, *args: Any, **kwargs: Any) -> Response:
        try:
            return await fn(request, *args, **kwargs)
        except SignInRequired:
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(f"/ui/login?next={quote(target)}", status_code=303)
        except ReefError as e:
            return templates.TemplateResponse(
                request,
                "error.html",
                {"who": None, "error": e, "scenario": None},
                status_code=e.status,
            )

    return wrapped


# Pages show what a token may see: never cached by the browser or a proxy.
NO_STORE = {"cache-control": "no-store"}


def render(request: Request, name: str, who: Viewer | None, **ctx: Any) -> HTMLResponse:
    ctx.setdefault("scenario", None)
    ctx.update(who=who, flash=flash(request.query_params.get("msg"), request.query_params))
    return templates.TemplateResponse(request, name, ctx, headers=NO_STORE)


# The status line after an action: the redirect names one of these keys (and the id it acted
# on), never text, so a link cannot make the dashboard say anything it did not write.
MESSAGES = {
    "promoted": ("{id} is the head", "promoted: the head moved"),
    "rejected": ("{id} is rejected", "the candidate is rejected"),
    "not_pending": ("{id} was not pending: left as it was", "the candidate was not pending"),
    "rolled_back": ("rolled back: {id} is the head", "rolled back"),
    "evolve_requested": ("evolve requested", "evolve requested"),
    "settings_saved": ("settings saved", "settings saved: they apply from the next decision"),
    "reviewed": ("review saved as {id}", "review saved"),
    "taken": ("your next turn to review", "your next turn to review"),
    "skipped": ("skipped: your next turn to review", "skipped"),
    "queue_empty": ("the queue is empty: nothing left to review", "the queue is empty"),
}
_MESSAGE_ID = re.compile(r"[a-z]{2,8}_[0-9a-z]{26}")


def flash(key: str | None, params: Any) -> str | None:
    """The status line's text for message `key` (None for no key or an unknown one); the id
    is shown only when it has the shape of Reef's ids."""
    if key not in MESSAGES:
        return None
    with_id, plain = MESSAGES[key]
    rid = params.get("id") or ""
    return with_id.format(id=rid) if _MESSAGE_ID.fullmatch(rid) else plain


def back(name: str, tab: str, message: str, rid: str | None = None) -> Response:
    """Back to a tab, its status line saying MESSAGES[message] (about `rid`)."""
    query = {"msg": message, **({"id": rid} if rid else {})}
    return RedirectResponse(f"/ui/s/{quote(name)}/{tab}?{urlencode(query)}", status_code=303)


async def scoped(request: Request, scenario: str) -> tuple[Services, Viewer, str]:
    """A scenario's page: the services, the viewer, and the scenario's name once the viewer
    may see it."""
    svc = services(request)
    who = await viewer(request)
    check_scenario_name(scenario)
    who.principal.require(scenario)
    return svc, who, scenario


async def admin_form(
    request: Request, scenario: str, action: str
) -> tuple[Services, Viewer, str, dict[str, str]]:
    """The one guard of every admin action: the scenario in scope, the form's CSRF token, an
    admin principal. Returns (services, viewer, scenario, form)."""
    svc, who, name = await scoped(request, scenario)
    form = await checked_form(request, who)
    who.principal.require_admin(action)
    return svc, who, name, form


def release_id(form: dict[str, str]) -> str:
    """The release (or candidate) an admin form acts on."""
    rid = form.get("release_id", "").strip()
    if not rid:
        raise BadRequest("release_id is required", param="release_id")
    return rid


def links(svc: Services) -> Links:
    """Where the releases' outside pages are, as the settings say now."""
    return Links(svc.settings.tracking_uri, svc.settings.prefect_ui_url)


async def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn` in a worker thread: the store and the artifact store block."""
    return await asyncio.to_thread(functools.partial(fn, *args, **kwargs))


def figures(svc: Services, scenario: str) -> tuple[list[Figure], list[str]]:
    """The scenario's figures (reef.figures) and what could not be read of them: an artifact
    store that is down is one more problem to show, never a broken page. Blocking: `call` it."""
    try:
        return load_figures(svc.artifacts, scenario)
    except ReefError as e:
        return [], [f"demo figures unavailable: {e.message}"]
