"""The release chain: its timeline, head first, a harness release's diff against its parent,
and (admins) rolling back to an earlier release. The rollback calls the release chain exactly
as the admin route does (ReleaseChain.rollback: stage, verify, compare-and-swap)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from reef.api.services import Services
from reef.api.ui.pages.common import (
    admin_form,
    back,
    call,
    figures,
    links,
    page,
    release_id,
    render,
    scoped,
)
from reef.api.ui.views.releases import diff, release_rows
from reef.errors import NotFound
from reef.records import Candidate, Release

router = APIRouter(prefix="/ui", include_in_schema=False)


@router.get("/s/{scenario}/releases")
@page
async def releases(request: Request, scenario: str) -> Response:
    svc, who, name = await scoped(request, scenario)
    scen = await call(svc.store.get_scenario, name)
    chain = await call(svc.store.list_releases, name)
    scores = await call(svc.browse.release_scores, name)
    found, problems = await call(figures, svc, name)
    return render(
        request,
        "releases.html",
        who,
        scenario=name,
        tab="releases",
        rows=release_rows(chain, scores, links(svc), found),
        head=scen.head_release_id,
        problems=problems,
    )


@router.get("/s/{scenario}/diff/{release_id}")
@page
async def harness_diff(request: Request, scenario: str, release_id: str) -> Response:
    """A harness release's (or candidate's) files against its parent's."""
    svc, who, name = await scoped(request, scenario)
    release, candidate = await call(_release_or_candidate, svc, name, release_id)
    parent = None
    if release.parent_id:
        parent = await call(svc.store.get_release, name, release.parent_id)
    new = await call(svc.chain.harnesses.get, release)
    old = await call(svc.chain.harnesses.get, parent) if parent is not None else None
    return render(
        request,
        "diff.html",
        who,
        scenario=name,
        tab="releases",
        release=release,
        candidate=candidate,
        parent=parent,
        files=diff(old.files if old else {}, new.files if new else {}),
    )


def _release_or_candidate(
    svc: Services, name: str, release_id: str
) -> tuple[Release, Candidate | None]:
    try:
        return svc.store.get_release(name, release_id), None
    except NotFound:
        cand = svc.store.get_candidate(name, release_id)
        return cand.release(), cand


@router.post("/s/{scenario}/rollback")
@page
async def rollback(request: Request, scenario: str) -> Response:
    svc, _, name, form = await admin_form(request, scenario, "rollback")
    release = await call(svc.chain.rollback, name, release_id(form))
    return back(name, "releases", "rolled_back", release.id)
