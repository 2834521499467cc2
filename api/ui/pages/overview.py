"""The overview at /ui: one row per scenario the viewer may see, and the readiness cell each
row loads after the page renders."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import Response

from reef.api.services import Services, services
from reef.api.ui.pages.common import call, figures, page, render, scoped
from reef.api.ui.signin import viewer
from reef.api.ui.views.overview import OverviewRow, overview_row
from reef.readiness import Readiness, scenario_readiness

router = APIRouter(prefix="/ui", include_in_schema=False)

READINESS_TTL_S = 30.0


@router.get("")
@router.get("/")
@page
async def overview(request: Request) -> Response:
    svc = services(request)
    who = await viewer(request)
    scenarios = await call(svc.store.list_scenarios)
    rows = [await call(_row, svc, s.name) for s in scenarios if who.principal.may_use(s.name)]
    queues = {row.name: await call(svc.store.queue_progress, row.name) for row in rows}
    return render(
        request,
        "overview.html",
        who,
        rows=rows,
        loop=svc.settings.reef,
        queues={name: q for name, q in queues.items() if q.total},
    )


def _row(svc: Services, name: str) -> OverviewRow:
    """One scenario's row of the overview, read in one worker thread."""
    found, _ = figures(svc, name)  # the artifact store down: the row leads with the store's
    return overview_row(
        name,
        head=svc.store.head_release(name),
        traffic=svc.browse.traffic(name),
        candidates=svc.store.list_candidates(name),
        chain=svc.store.list_releases(name),
        scores=svc.browse.release_scores(name),
        figures=found,
        metrics=svc.browse.release_metrics(name),
    )


@router.get("/s/{scenario}/readiness")
@page
async def readiness(request: Request, scenario: str) -> Response:
    """Eligible samples vs the batch size: a fragment the overview loads after it renders.
    Collecting experience reads every reported record (seconds at 10k reports), so the page
    never waits on it, and an answer is reused for READINESS_TTL_S across viewers."""
    svc, who, name = await scoped(request, scenario)
    recent: dict[str, tuple[float, Readiness]] = request.app.state.ui_readiness
    cached = recent.get(name)
    if cached is not None and time.monotonic() - cached[0] < READINESS_TTL_S:
        r = cached[1]
    else:
        r = await call(scenario_readiness, svc.store, name, svc.settings)
        recent[name] = (time.monotonic(), r)
    return render(request, "readiness.html", who, r=r)
