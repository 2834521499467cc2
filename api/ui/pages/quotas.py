"""The quotas page at /ui/quotas (linked from the overview): each token's limits and what
their current windows used."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from reef.api.services import services
from reef.api.ui.pages.common import call, page, render
from reef.api.ui.signin import viewer
from reef.api.ui.views.quotas import quota_rows

router = APIRouter(prefix="/ui", include_in_schema=False)


@router.get("/quotas")
@page
async def quotas(request: Request) -> Response:
    """Each token's quotas and what their current windows used (an admin sees every token,
    another token its own)."""
    svc = services(request)
    who = await viewer(request)
    usage = await call(svc.quotas.usage)
    rows = quota_rows(usage, who.principal.name, who.principal.admin)
    return render(request, "quotas.html", who, rows=rows)
