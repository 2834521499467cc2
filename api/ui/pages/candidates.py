"""Candidates: those waiting for review (admins approve or reject them) and those decided.
Approving and rejecting call the release chain exactly as the admin routes do
(ReleaseChain.promote / reject: stage, verify, compare-and-swap)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from reef.api.ui.pages.common import admin_form, back, call, links, page, release_id, render, scoped
from reef.api.ui.views.candidates import candidate_rows

router = APIRouter(prefix="/ui", include_in_schema=False)


@router.get("/s/{scenario}/candidates")
@page
async def candidates(request: Request, scenario: str) -> Response:
    svc, who, name = await scoped(request, scenario)
    await call(svc.store.get_scenario, name)
    found = await call(svc.store.list_candidates, name)
    chain = await call(svc.store.list_releases, name)
    rows = candidate_rows(found, chain, links(svc))
    return render(
        request,
        "candidates.html",
        who,
        scenario=name,
        tab="candidates",
        pending=[row for row in rows if row.pending],
        decided=[row for row in rows if not row.pending],
    )


@router.post("/s/{scenario}/promote")
@page
async def promote(request: Request, scenario: str) -> Response:
    svc, who, name, form = await admin_form(request, scenario, "promote")
    rid = release_id(form)
    release = await call(svc.chain.promote, name, rid, by=who.principal.name)
    return back(name, "releases", "promoted", release.id)


@router.post("/s/{scenario}/reject")
@page
async def reject(request: Request, scenario: str) -> Response:
    svc, who, name, form = await admin_form(request, scenario, "reject")
    rid = release_id(form)
    cand = await call(svc.store.get_candidate, name, rid)
    note = form.get("note") or f"rejected by {who.principal.name} in the dashboard"
    done = await call(svc.chain.reject, cand, note)
    key = "rejected" if done.status == "rejected" else "not_pending"
    return back(name, "candidates", key, done.id)
