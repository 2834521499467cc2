"""The learning page: the mean reported score per release with the gate's held-out means, and
the other figures per release (demo and bench figures, release metrics)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from reef.api.ui.pages.common import call, figures, page, render, scoped
from reef.api.ui.views.curves import (
    change,
    curve,
    curve_rows,
    figure_rows,
    figure_series,
    headline,
    on_unit_scale,
)

router = APIRouter(prefix="/ui", include_in_schema=False)


@router.get("/s/{scenario}/curves")
@page
async def curves(request: Request, scenario: str) -> Response:
    svc, who, name = await scoped(request, scenario)
    chain = await call(svc.store.list_releases, name)
    scores = await call(svc.browse.release_scores, name)
    found, problems = await call(figures, svc, name)
    extra = figure_series(chain, found)
    shown = [s for s in extra if s.figure]
    metrics = await call(svc.browse.release_metrics, name)
    lead = headline(chain, scores, extra, metrics)
    # the score itself is drawn with its band; figures and guards on its axis when they are
    # rates (a figure on another scale stays in the chart of other figures below)
    lines = [s for s in lead if s.key != "score" and on_unit_scale(s)]
    series = curve(chain, scores, lines)
    changes = [c for c in (change(chain, s) for s in lead) if c is not None]
    return render(
        request,
        "curves.html",
        who,
        scenario=name,
        tab="curves",
        series=series,
        changes=changes,
        extra={"seq": series["seq"], "series": [s.json() for s in extra]},
        figures=shown,
        figure_rows=figure_rows(chain, shown),
        problems=problems,
        rows=curve_rows(chain, scores),
    )
