"""The dashboard's pages under /ui, one module per noun:

  signin      the sign-in form and sign-out
  overview    the scenarios (/ui) and each one's readiness cell
  records     records and their filters, sessions' transcripts, the retention archive
  releases    the release chain, harness diffs, rolling back
  candidates  candidates to review (approve, reject) and those decided
  curves      learning curves and other figures per release
  jobs        instruction jobs, evolve runs, evolving now
  quotas      each token's limits and their use
    review,
    settings,

Pages are rendered on the server (Jinja2, templates/) from the rows api.ui.views builds; a
little vanilla JS refreshes the live parts and draws the charts (uPlot). Every page checks its
viewer server-side (common.scoped): a scoped token's pages show only its scenarios, and the
admin actions (promote, reject, rollback, evolve) refuse anyone but an admin whatever the page
showed (common.admin_form). Those actions call the release chain exactly as the admin routes
do (ReleaseChain.promote / reject / rollback: stage, verify, compare-and-swap). Reviewing a
turn needs an admin or a reviewer token (common.scoped, then Principal.require_reviewer) and
stores a report through the API's one report path.
"""

from __future__ import annotations

from fastapi import APIRouter

from reef.api.ui.pages import (
    candidates,
    curves,
    jobs,
    overview,
    quotas,
    records,
    releases,
    review,
    settings,
    signin,
)

router = APIRouter()
for noun in (
    signin,
    overview,
    records,
    review,
    releases,
    candidates,
    curves,
    jobs,
    quotas,
    settings,
):
    router.include_router(noun.router)
