"""The learning page: the mean reported score per release with the gate's held-out means, and
the other figures per release (demo and bench figures, release metrics)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from reef.api.ui.pages.common import call, page, render, scoped
from reef.api.ui.views.curves import curve, curve_rows, figure_rows, figure_series
from reef.errors import ReefError
from reef.figures import load_figures

router = APIRouter(prefix="/ui", include_in_schema=False)


@router.get("/s/{scenario}/curves")
@page
async def curves(request: Request, scenario: str) -> Response:
    svc, who, name = await scoped(request, scenario)
    chain = await call(svc.store.list_releases, name)
    scores = await call(svc.browse.release_scores, name)
    try:
        figures, problems = await call(load_figures, svc.artifacts, name)
    except ReefError as e:  # the artifact store is down: the page still shows the chain's
        figures, problems = [], [f"demo figures unavailable: {e.message}"]
    series = curve(chain, scores)
    extra = figure_series(chain, figures)
    shown = [s for s in extra if s.figure]
    return render(
        request,
        "curves.html",
        who,
        scenario=name,
        tab="curves",
        series=series,
        extra={"seq": series["seq"], "series": [s.json() for s in extra]},
        figures=shown,
        figure_rows=figure_rows(chain, shown),
        problems=problems,
        rows=curve_rows(chain, scores),
    )
