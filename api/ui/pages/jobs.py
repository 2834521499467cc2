"""Jobs: the users' /reef/train instructions with their steps, the evolve runs by the
candidate each left, the webhook events told, and (admins) asking the evolve worker to look at the scenario now."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from reef.api.ui.pages.common import admin_form, back, call, page, render, scoped
from reef.api.ui.views.events import event_rows
from reef.errors import ServiceUnavailable

router = APIRouter(prefix="/ui", include_in_schema=False)


@router.get("/s/{scenario}/jobs")
@page
async def jobs(request: Request, scenario: str) -> Response:
    svc, who, name = await scoped(request, scenario)
    await call(svc.store.get_scenario, name)
    found = await call(svc.browse.jobs, name)
    runs = await call(svc.store.list_candidates, name)
    told = await call(svc.store.recent_deliveries, name, 20)
    live = any(j.status in ("queued", "running") for j in found)
    return render(
        request,
        "jobs.html",
        who,
        scenario=name,
        tab="jobs",
        jobs=found,
        runs=runs[:50],
        live=live,
        worker=svc.evolver is not None,
        events=event_rows(told),
    )


@router.post("/s/{scenario}/evolve")
@page
async def evolve(request: Request, scenario: str) -> Response:
    """Ask the evolve worker to look at the scenario now (it trains when a batch is ready)."""
    svc, _, name, _ = await admin_form(request, scenario, "evolve")
    if svc.evolver is None or not svc.evolver.notify(name):
        raise ServiceUnavailable(
            "no evolve worker runs on this server: start reef serve with reef.auto on",
            code="no_worker",
        )
    return back(name, "jobs", "evolve_requested")
