"""The dashboard's pages under /ui: scenarios, records and sessions, the release chain,
candidates and approvals, learning curves, jobs; and the sign-in form.

Pages are rendered on the server (Jinja2); a little vanilla JS refreshes the live parts and
draws the charts (uPlot). Every page checks its viewer server-side: a scoped token's pages
show only its scenarios, and the admin actions (promote, reject, rollback, evolve) refuse
anyone but an admin whatever the page showed. Those actions call the release chain exactly as
the admin routes do (ReleaseChain.promote / reject / rollback: stage, verify, compare-and-swap).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from api.services import Services, check_scenario_name, services
from api.ui import views
from api.ui.signin import (
    COOKIE,
    TTL_S,
    SignInRequired,
    Viewer,
    checked_form,
    read_form,
    secure_cookie,
    sign_in,
    sign_out,
    viewer,
)
from reef import evaluation_pool
from reef.errors import BadRequest, NotFound, ReefError, ServiceUnavailable
from reef.figures import load_figures
from reef.readiness import Readiness
from reef.readiness import readiness as compute_readiness
from reef.records import Candidate, Record, Release, Report
from reef.store.browse import Feedback, RecordFilter

log = logging.getLogger("reef.api")
router = APIRouter(prefix="/ui", include_in_schema=False)
templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
templates.env.globals.update(age=views.age, short=views.short)
templates.env.filters["num"] = views.num

PAGE_SIZE = 50
READINESS_TTL_S = 30.0

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


def _render(request: Request, name: str, who: Viewer | None, **ctx: Any) -> HTMLResponse:
    ctx.setdefault("scenario", None)
    ctx.update(who=who, flash=_flash(request.query_params.get("msg"), request.query_params))
    return templates.TemplateResponse(request, name, ctx, headers=_NO_STORE)


# The status line after an action: the redirect names one of these keys (and the id it acted
# on), never text, so a link cannot make the dashboard say anything it did not write.
MESSAGES = {
    "promoted": ("{id} is the head", "promoted: the head moved"),
    "rejected": ("{id} is rejected", "the candidate is rejected"),
    "not_pending": ("{id} was not pending: left as it was", "the candidate was not pending"),
    "rolled_back": ("rolled back: {id} is the head", "rolled back"),
    "evolve_requested": ("evolve requested", "evolve requested"),
}
_MESSAGE_ID = re.compile(r"[a-z]{2,8}_[0-9a-z]{26}")


def _flash(key: str | None, params: Any) -> str | None:
    """The status line's text for message `key` (None for no key or an unknown one); the id
    is shown only when it has the shape of Reef's ids."""
    if key not in MESSAGES:
        return None
    with_id, plain = MESSAGES[key]
    rid = params.get("id") or ""
    return with_id.format(id=rid) if _MESSAGE_ID.fullmatch(rid) else plain


# Pages show what a token may see: never cached by the browser or a proxy.
_NO_STORE = {"cache-control": "no-store"}


async def _scoped(request: Request, scenario: str) -> tuple[Services, Viewer, str]:
    svc = services(request)
    who = await viewer(request)
    check_scenario_name(scenario)
    who.principal.require(scenario)
    return svc, who, scenario


async def _admin_form(
    request: Request, scenario: str, action: str
) -> tuple[Services, Viewer, str, dict[str, str]]:
    """The one guard of every admin action: the scenario in scope, the form's CSRF token, an
    admin principal. Returns (services, viewer, scenario, form)."""
    svc, who, name = await _scoped(request, scenario)
    form = await checked_form(request, who)
    who.principal.require_admin(action)
    return svc, who, name, form


async def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(functools.partial(fn, *args, **kwargs))


# sign-in -------------------------------------------------------------------------------
@router.get("/login")
async def login_form(request: Request, next: str = "/ui") -> Response:
    if not services(request).auth.enabled:
        return RedirectResponse(_safe_next(next), status_code=303)
    return _render(request, "login.html", None, next=_safe_next(next), error=None)


@router.post("/login")
async def login(request: Request) -> Response:
    form = await read_form(request)
    target = _safe_next(form.get("next", "/ui"))
    try:
        sid = await _call(sign_in, request, form.get("token", ""))
    except ReefError as e:
        refused = _render(request, "login.html", None, next=target, error=e.message)
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
    await _call(sign_out, request)
    resp = RedirectResponse("/ui/login", status_code=303)
    resp.delete_cookie(COOKIE, path="/ui")
    return resp


def _safe_next(target: str) -> str:
    """Only our own pages: an open redirect would hand a signed-in browser to anyone."""
    if not target.startswith("/ui") or target.startswith("//") or "\\" in target:
        return "/ui"
    return target


# overview ------------------------------------------------------------------------------
@router.get("")
@router.get("/")
@page
async def overview(request: Request) -> Response:
    svc = services(request)
    who = await viewer(request)
    scenarios = await _call(svc.store.list_scenarios)
    rows = [await _call(_summary, svc, s.name) for s in scenarios if who.principal.may_use(s.name)]
    return _render(request, "overview.html", who, rows=rows, loop=svc.settings.reef)


def _summary(svc: Services, name: str) -> dict[str, Any]:
    """One scenario's row of the overview."""
    head = svc.store.head_release(name)
    traffic = svc.browse.traffic(name)
    candidates = svc.store.list_candidates(name)
    chain = svc.store.list_releases(name)
    scores = svc.browse.release_scores(name)
    means = [scores[r.id].mean if r.id in scores else None for r in chain]
    return {
        "name": name,
        "head": head,
        "traffic": traffic,
        "bars": views.bars(traffic.hourly),
        "last": candidates[0] if candidates else None,
        "pending": sum(1 for c in candidates if c.status == "pending"),
        "curve": views.sparkline(means),
        "releases": len(chain),
    }


@router.get("/s/{scenario}/readiness")
@page
async def readiness(request: Request, scenario: str) -> Response:
    """Eligible samples vs the batch size: a fragment the overview loads after it renders.
    Collecting experience reads every reported record (seconds at 10k reports), so the page
    never waits on it, and an answer is reused for READINESS_TTL_S across viewers."""
    svc, who, name = await _scoped(request, scenario)
    recent: dict[str, tuple[float, Readiness]] = request.app.state.ui_readiness
    cached = recent.get(name)
    if cached is not None and time.monotonic() - cached[0] < READINESS_TTL_S:
        r = cached[1]
    else:
        holdout = evaluation_pool.fraction(svc.settings)
        r = await _call(compute_readiness, svc.store, name, svc.settings.reef, holdout=holdout)
        recent[name] = (time.monotonic(), r)
    return _render(request, "readiness.html", who, r=r)


@router.get("/s/{scenario}")
async def scenario_home(scenario: str) -> Response:
    return RedirectResponse(f"/ui/s/{quote(scenario)}/records", status_code=303)


# records and sessions ------------------------------------------------------------------
@router.get("/s/{scenario}/records")
@page
async def records(request: Request, scenario: str) -> Response:
    svc, who, name = await _scoped(request, scenario)
    q = request.query_params
    flt = RecordFilter(
        release_id=q.get("release") or None,
        tag=q.get("tag") or None,
        min_score=_number(q.get("min_score"), "min_score"),
        max_score=_number(q.get("max_score"), "max_score"),
        feedback={"yes": True, "no": False}.get(q.get("feedback", "")),
        since=_time(q.get("since"), "since"),
        until=_time(q.get("until"), "until"),
        text=q.get("q") or None,
    )
    await _call(svc.store.get_scenario, name)  # 404 for an unknown scenario
    got = await _call(svc.browse.records, name, flt, q.get("before") or None, PAGE_SIZE)
    chain = await _call(svc.store.list_releases, name)
    # What retention moved out of the database (reef.retention): counted from its manifest,
    # shown on the last page, where the database's records end.
    archived = None
    if not got.next_before and svc.settings.store.retention_days is not None:
        from reef.retention import archived_counts

        archived = await _call(archived_counts, svc.artifacts, name)
    keep = {k: v for k, v in q.items() if k != "before" and v}
    next_url = None
    if got.next_before:
        next_url = f"?{urlencode({**keep, 'before': got.next_before})}"
    rows = _record_rows(got.records, got.feedback)
    return _render(
        request,
        "records.html",
        who,
        scenario=name,
        tab="records",
        rows=rows,
        q=q,
        chain=list(reversed(chain)),
        seqs={r.id: f"#{r.seq} {r.operation}" for r in chain},
        next_url=next_url,
        window_end=got.window_end,
        window=min(svc.browse.window, svc.browse.text_window) if flt.text else svc.browse.window,
        first_url="?" + urlencode(keep) if q.get("before") else None,
        archived=archived,
        retention_days=svc.settings.store.retention_days,
    )


def _record_rows(records: list[Record], feedback: dict[str, Feedback]) -> list[dict[str, Any]]:
    """The records table's rows (records.html's macro), live or archived alike."""
    return [
        {
            "r": r,
            "prompt": views.prompt_preview(r),
            "answer": views.short(views.answer_of(r)),
            "fb": feedback.get(r.id),
        }
        for r in records
    ]


# the retention archive: read-only, through reef.retention's reader -------------------
@router.get("/s/{scenario}/archive")
@page
async def archive(request: Request, scenario: str) -> Response:
    """Records retention moved to the artifact store, newest first, 50 a page: the same
    table as the records page, each row opening the archived exchange."""
    from reef.retention import archived_page

    svc, who, name = await _scoped(request, scenario)
    await _call(svc.store.get_scenario, name)  # 404 for an unknown scenario
    before = request.query_params.get("before") or None
    got = await _call(
        archived_page, svc.store, svc.artifacts, name, before, PAGE_SIZE, svc.archive_files
    )
    reports = await _call(_archive_reports, svc, name, [r.id for r in got.records])
    feedback = {
        rid: Feedback(len(reps), _mean([p.score for p in reps if p.score is not None]))
        for rid, reps in reports.items()
        if reps
    }
    chain = await _call(svc.store.list_releases, name)
    return _render(
        request,
        "archive.html",
        who,
        scenario=name,
        tab="records",
        rows=_record_rows(got.records, feedback),
        seqs={r.id: f"#{r.seq} {r.operation}" for r in chain},
        next_url=f"?{urlencode({'before': got.next_before})}" if got.next_before else None,
        first_url="?" if before else None,
        retention_days=svc.settings.store.retention_days,
    )


@router.get("/s/{scenario}/archive/{record_id}")
@page
async def archive_record(request: Request, scenario: str, record_id: str) -> Response:
    """One archived exchange, request and response, with the reports on it (archived or
    still in the database). A record also still in the database (an archiving run that
    stopped between its file and its delete) opens from there, as every reader prefers it."""
    from reef.retention import archived_record

    svc, who, name = await _scoped(request, scenario)
    if await _call(svc.store.existing_record_ids, name, [record_id]):
        return RedirectResponse(f"/ui/s/{quote(name)}/records/{quote(record_id)}", status_code=303)
    r = await _call(archived_record, svc.artifacts, name, record_id, svc.archive_files)
    reports = await _call(_archive_reports, svc, name, [r.id])
    return await _transcript(request, svc, who, name, None, [r], reports, archived=True)


def _archive_reports(svc: Services, name: str, ids: list[str]) -> dict[str, list[Report]]:
    """Reports quoting archived records: those retention archived with them and those still
    in the database (a report stays while any record it quotes does), each id once."""
    from reef.retention import archived_reports_for

    live = svc.browse.reports_for(name, ids)
    old = archived_reports_for(svc.artifacts, name, ids, svc.archive_files) if ids else {}
    out: dict[str, list[Report]] = {}
    for rid in ids:
        seen = {p.id for p in live.get(rid, [])}
        both = live.get(rid, []) + [p for p in old.get(rid, []) if p.id not in seen]
        out[rid] = sorted(both, key=lambda p: (p.created_at, p.id))
    return out


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _number(value: str | None, param: str) -> float | None:
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        raise BadRequest(f"{param} must be a number", param=param) from None


def _time(value: str | None, param: str) -> datetime | None:
    """A datetime-local field's value (taken as UTC) or an ISO 8601 time."""
    if not value:
        return None
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        raise BadRequest(f"{param} must be a time like 2026-12-01T19:30", param=param) from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


@router.get("/s/{scenario}/records/{record_id}")
@page
async def record(request: Request, scenario: str, record_id: str) -> Response:
    svc, who, name = await _scoped(request, scenario)
    r = await _call(svc.store.get_record, name, record_id)
    if r.session_id:
        url = f"/ui/s/{quote(name)}/sessions/{quote(r.session_id)}#{quote(r.id)}"
        return RedirectResponse(url, status_code=303)
    return await _transcript(request, svc, who, name, None, [r])


@router.get("/s/{scenario}/sessions/{session_id}")
@page
async def session(request: Request, scenario: str, session_id: str) -> Response:
    svc, who, name = await _scoped(request, scenario)
    chain = await _call(svc.store.session_records, name, session_id, 1000)
    if not chain:
        raise NotFound(f"no session '{session_id}' in scenario '{name}'")
    return await _transcript(request, svc, who, name, session_id, chain)


async def _transcript(
    request: Request,
    svc: Services,
    who: Viewer,
    name: str,
    session_id: str | None,
    chain: list[Any],
    reports: dict[str, list[Report]] | None = None,
    *,
    archived: bool = False,
) -> Response:
    """The turns of `chain` with their reports (the database's, unless given: an archived
    record's come from the archive too)."""
    if reports is None:
        reports = await _call(svc.browse.reports_for, name, [r.id for r in chain])
    return _render(
        request,
        "session.html",
        who,
        scenario=name,
        tab="records",
        session_id=session_id,
        archived=archived,
        turns=views.turns(chain, reports),
    )


# release chain -------------------------------------------------------------------------
@router.get("/s/{scenario}/releases")
@page
async def releases(request: Request, scenario: str) -> Response:
    svc, who, name = await _scoped(request, scenario)
    scen = await _call(svc.store.get_scenario, name)
    chain = await _call(svc.store.list_releases, name)
    scores = await _call(svc.browse.release_scores, name)
    rows = [
        {
            "r": r,
            "gate": views.gate_numbers(r.gate),
            "score": scores.get(r.id),
            "mlflow": _mlflow_link(svc, r.model_uri),
            "flow_run": _flow_run_link(svc, r.metadata.get("flow_run_id")),
            "approval": r.metadata.get("approval"),
            "source": r.metadata.get("source_release_id"),
            "harness": isinstance(r.metadata.get("harness"), dict),
        }
        for r in reversed(chain)
    ]
    return _render(
        request,
        "releases.html",
        who,
        scenario=name,
        tab="releases",
        rows=rows,
        head=scen.head_release_id,
    )


def _mlflow_link(svc: Services, model_uri: str | None) -> str | None:
    """The MLflow UI page of a model version, when the tracking server is one we can link."""
    tracking = svc.settings.tracking_uri
    if not model_uri or not model_uri.startswith("models:/"):
        return None
    if not tracking.startswith(("http://", "https://")):
        return None
    model, _, version = model_uri.removeprefix("models:/").rpartition("/")
    return f"{tracking.rstrip('/')}/#/models/{quote(model)}/versions/{quote(version)}"


def _flow_run_link(svc: Services, run_id: Any) -> str | None:
    """The Prefect UI page of the flow run that made a release, when the UI's address is
    known (Settings.prefect_ui_url)."""
    ui = svc.settings.prefect_ui_url
    if not ui or not isinstance(run_id, str) or not run_id:
        return None
    return f"{ui}/runs/flow-run/{quote(run_id)}"


@router.get("/s/{scenario}/diff/{release_id}")
@page
async def harness_diff(request: Request, scenario: str, release_id: str) -> Response:
    """A harness release's (or candidate's) files against its parent's."""
    svc, who, name = await _scoped(request, scenario)
    release, candidate = await _call(_release_or_candidate, svc, name, release_id)
    parent = None
    if release.parent_id:
        parent = await _call(svc.store.get_release, name, release.parent_id)
    new = await _call(svc.chain.harnesses.get, release)
    old = await _call(svc.chain.harnesses.get, parent) if parent is not None else None
    files = views.diff(old.files if old else {}, new.files if new else {})
    return _render(
        request,
        "diff.html",
        who,
        scenario=name,
        tab="releases",
        release=release,
        candidate=candidate,
        parent=parent,
        files=files,
    )


def _release_or_candidate(
    svc: Services, name: str, release_id: str
) -> tuple[Release, Candidate | None]:
    try:
        return svc.store.get_release(name, release_id), None
    except NotFound:
        cand = svc.store.get_candidate(name, release_id)
        return cand.release(), cand


# candidates and approvals --------------------------------------------------------------
@router.get("/s/{scenario}/candidates")
@page
async def candidates(request: Request, scenario: str) -> Response:
    svc, who, name = await _scoped(request, scenario)
    await _call(svc.store.get_scenario, name)
    rows = await _call(svc.store.list_candidates, name)
    chain = {r.id: r for r in await _call(svc.store.list_releases, name)}
    items = [
        {
            "c": c,
            "gate": views.gate_numbers(c.gate),
            "approval": chain[c.id].metadata.get("approval") if c.id in chain else None,
            "mlflow": _mlflow_link(svc, c.model_uri),
            "flow_run": _flow_run_link(svc, c.metadata.get("flow_run_id")),
        }
        for c in rows
    ]
    pending = [i for i in items if i["c"].status == "pending"]
    decided = [i for i in items if i["c"].status != "pending"]
    return _render(
        request,
        "candidates.html",
        who,
        scenario=name,
        tab="candidates",
        pending=pending,
        decided=decided,
    )


@router.post("/s/{scenario}/promote")
@page
async def promote(request: Request, scenario: str) -> Response:
    svc, who, name, form = await _admin_form(request, scenario, "promote")
    rid = _release_id(form)
    release = await _call(svc.chain.promote, name, rid, by=who.principal.name)
    return _back(name, "releases", "promoted", release.id)


@router.post("/s/{scenario}/reject")
@page
async def reject(request: Request, scenario: str) -> Response:
    svc, who, name, form = await _admin_form(request, scenario, "reject")
    rid = _release_id(form)
    cand = await _call(svc.store.get_candidate, name, rid)
    note = form.get("note") or f"rejected by {who.principal.name} in the dashboard"
    done = await _call(svc.chain.reject, cand, note)
    key = "rejected" if done.status == "rejected" else "not_pending"
    return _back(name, "candidates", key, done.id)


@router.post("/s/{scenario}/rollback")
@page
async def rollback(request: Request, scenario: str) -> Response:
    svc, _, name, form = await _admin_form(request, scenario, "rollback")
    release = await _call(svc.chain.rollback, name, _release_id(form))
    return _back(name, "releases", "rolled_back", release.id)


@router.post("/s/{scenario}/evolve")
@page
async def evolve(request: Request, scenario: str) -> Response:
    """Ask the evolve worker to look at the scenario now (it trains when a batch is ready)."""
    svc, _, name, _ = await _admin_form(request, scenario, "evolve")
    if svc.evolver is None or not svc.evolver.notify(name):
        raise ServiceUnavailable(
            "no evolve worker runs on this server: start reef serve with reef.auto on",
            code="no_worker",
        )
    return _back(name, "jobs", "evolve_requested")


def _release_id(form: dict[str, str]) -> str:
    rid = form.get("release_id", "").strip()
    if not rid:
        raise BadRequest("release_id is required", param="release_id")
    return rid


def _back(name: str, tab: str, message: str, rid: str | None = None) -> Response:
    """Back to a tab, its status line saying MESSAGES[message] (about `rid`)."""
    query = {"msg": message, **({"id": rid} if rid else {})}
    return RedirectResponse(f"/ui/s/{quote(name)}/{tab}?{urlencode(query)}", status_code=303)


# learning curves -----------------------------------------------------------------------
@router.get("/s/{scenario}/curves")
@page
async def curves(request: Request, scenario: str) -> Response:
    svc, who, name = await _scoped(request, scenario)
    chain = await _call(svc.store.list_releases, name)
    scores = await _call(svc.browse.release_scores, name)
    try:
        figures, problems = await _call(load_figures, svc.artifacts, name)
    except ReefError as e:  # the artifact store is down: the page still shows the chain's
        figures, problems = [], [f"demo figures unavailable: {e.message}"]
    series = views.curve(chain, scores)
    extra = views.figure_series(chain, figures)
    figures_shown = [x for x in extra if x["key"].startswith("figure:")]
    return _render(
        request,
        "curves.html",
        who,
        scenario=name,
        tab="curves",
        series=series,
        extra={"seq": series["seq"], "series": extra},
        figures=figures_shown,
        figure_rows=[
            (r, values)
            for r, values in reversed(
                [(r, [f["values"][i] for f in figures_shown]) for i, r in enumerate(chain)]
            )
            if any(v is not None for v in values)
        ],
        problems=problems,
        rows=list(zip(chain, [scores.get(r.id) for r in chain], strict=True)),
    )


# jobs ------------------------------------------------------------------------------------
@router.get("/s/{scenario}/jobs")
@page
async def jobs(request: Request, scenario: str) -> Response:
    svc, who, name = await _scoped(request, scenario)
    await _call(svc.store.get_scenario, name)
    found = await _call(svc.browse.jobs, name)
    runs = await _call(svc.store.list_candidates, name)
    told = await _call(svc.store.recent_deliveries, name, 20)
    live = any(j.status in ("queued", "running") for j in found)
    return _render(
        request,
        "jobs.html",
        who,
        scenario=name,
        tab="jobs",
        jobs=found,
        runs=runs[:50],
        live=live,
        worker=svc.evolver is not None,
        events=views.webhook_events(told),
    )


# quotas --------------------------------------------------------------------------------
@router.get("/quotas")
@page
async def quotas(request: Request) -> Response:
    """Each token's quotas and what their current windows used (an admin sees every token,
    another token its own)."""
    svc = services(request)
    who = await viewer(request)
    rows = await _call(svc.quotas.usage)
    if not who.principal.admin:
        rows = [r for r in rows if r["token"] == who.principal.name]
    return _render(request, "quotas.html", who, rows=rows)
