"""The records a scenario served: the records table with its filters, a session's transcript
(a record opens on its turn), and the retention archive (read-only, through reef.retention's
reader)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from reef.api.services import Services
from reef.api.ui.pages.common import PAGE_SIZE, call, page, render, scoped
from reef.api.ui.pages.review import review_context
from reef.api.ui.signin import Viewer
from reef.api.ui.views.records import archived_feedback, record_rows, turns
from reef.errors import BadRequest, NotFound
from reef.records import Record, Report
from reef.store.browse import RecordFilter

router = APIRouter(prefix="/ui", include_in_schema=False)


@router.get("/s/{scenario}")
async def scenario_home(scenario: str) -> Response:
    return RedirectResponse(f"/ui/s/{quote(scenario)}/records", status_code=303)


@router.get("/s/{scenario}/records")
@page
async def records(request: Request, scenario: str) -> Response:
    svc, who, name = await scoped(request, scenario)
    q = request.query_params
    flt = _filter(q)
    await call(svc.store.get_scenario, name)  # 404 for an unknown scenario
    got = await call(svc.browse.records, name, flt, q.get("before") or None, PAGE_SIZE)
    chain = await call(svc.store.list_releases, name)
    # What retention moved out of the database (reef.retention): counted from its manifest,
    # shown on the last page, where the database's records end.
    archived = None
    if not got.next_before and svc.settings.store.retention_days is not None:
        from reef.retention import archived_counts

        archived = await call(archived_counts, svc.artifacts, name)
    keep = {k: v for k, v in q.items() if k != "before" and v}
    next_url = None
    if got.next_before:
        next_url = f"?{urlencode({**keep, 'before': got.next_before})}"
    return render(
        request,
        "records.html",
        who,
        scenario=name,
        tab="records",
        rows=record_rows(got.records, got.feedback),
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


def _filter(q: Any) -> RecordFilter:
    """The records page's filter form, as the store's filter."""
    return RecordFilter(
        release_id=q.get("release") or None,
        tag=q.get("tag") or None,
        min_score=_number(q.get("min_score"), "min_score"),
        max_score=_number(q.get("max_score"), "max_score"),
        feedback={"yes": True, "no": False}.get(q.get("feedback", "")),
        since=_time(q.get("since"), "since"),
        until=_time(q.get("until"), "until"),
        text=q.get("q") or None,
    )


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
    svc, who, name = await scoped(request, scenario)
    r = await call(svc.store.get_record, name, record_id)
    if r.session_id:
        url = f"/ui/s/{quote(name)}/sessions/{quote(r.session_id)}#{quote(r.id)}"
        return RedirectResponse(url, status_code=303)
    return await _transcript(request, svc, who, name, None, [r])


@router.get("/s/{scenario}/sessions/{session_id}")
@page
async def session(request: Request, scenario: str, session_id: str) -> Response:
    svc, who, name = await scoped(request, scenario)
    chain = await call(svc.store.session_records, name, session_id, 1000)
    if not chain:
        raise NotFound(f"no session '{session_id}' in scenario '{name}'")
    return await _transcript(request, svc, who, name, session_id, chain)


async def _transcript(
    request: Request,
    svc: Services,
    who: Viewer,
    name: str,
    session_id: str | None,
    chain: list[Record],
    reports: dict[str, list[Report]] | None = None,
    *,
    archived: bool = False,
) -> Response:
    """The turns of `chain` with their reports (the database's, unless given: an archived
    record's come from the archive too)."""
    if reports is None:
        reports = await call(svc.browse.reports_for, name, [r.id for r in chain])
    reviewing = {"may_review": False}
    if not archived:
        reviewing = await review_context(request, svc, who, name, len(chain))
    return render(
        request,
        "session.html",
        who,
        scenario=name,
        tab="records",
        session_id=session_id,
        archived=archived,
        turns=turns(chain, reports),
        **reviewing,
    )


# the retention archive: read-only, through reef.retention's reader -------------------
@router.get("/s/{scenario}/archive")
@page
async def archive(request: Request, scenario: str) -> Response:
    """Records retention moved to the artifact store, newest first, 50 a page: the same
    table as the records page, each row opening the archived exchange."""
    from reef.retention import archived_page

    svc, who, name = await scoped(request, scenario)
    await call(svc.store.get_scenario, name)  # 404 for an unknown scenario
    before = request.query_params.get("before") or None
    got = await call(
        archived_page, svc.store, svc.artifacts, name, before, PAGE_SIZE, svc.archive_files
    )
    reports = await call(_archive_reports, svc, name, [r.id for r in got.records])
    chain = await call(svc.store.list_releases, name)
    return render(
        request,
        "archive.html",
        who,
        scenario=name,
        tab="records",
        rows=record_rows(got.records, archived_feedback(reports)),
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

    svc, who, name = await scoped(request, scenario)
    if await call(svc.store.existing_record_ids, name, [record_id]):
        return RedirectResponse(f"/ui/s/{quote(name)}/records/{quote(record_id)}", status_code=303)
    r = await call(archived_record, svc.artifacts, name, record_id, svc.archive_files)
    reports = await call(_archive_reports, svc, name, [r.id])
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
