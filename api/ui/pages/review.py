"""Reviewing turns in the dashboard: the review form on each turn of a session (a score, each
declared metric, a correction, a comment) and each scenario's annotation queue (reef.review).

A review is stored as a report through the same path as `POST /reef/report`
(api.reporting.store_report), with `metadata.source: human` and the reviewer's token name: its
correction trains exactly as an API correction does. Reviewing needs an admin or a reviewer
token in the scenario's scope (Principal.require_reviewer), and the form's CSRF token; the
queue's claims are the store's (one reviewer per item at a time, with a lease)."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from reef.api.bodies import validate
from reef.api.reporting import store_report
from reef.api.services import Services
from reef.api.ui.pages.common import call, page, render, scoped
from reef.api.ui.signin import Viewer, checked_form
from reef.errors import BadRequest, NotFound
from reef.records import new_id
from reef.review import describe, fill
from reef.scenario_settings import learning_settings
from reef.settings import Settings
from reef.settings.metrics import MetricSettings
from reef.store.review import ReviewItem
from reef.wire import ReportIn

router = APIRouter(prefix="/ui", include_in_schema=False)

SOURCE = "human"  # Report.metadata["source"] of a review made in the dashboard
MAX_TEXT = 20_000


async def reviewer_form(
    request: Request, scenario: str
) -> tuple[Services, Viewer, str, dict[str, str]]:
    """The guard of every review action: the scenario in scope, the form's CSRF token, and a
    token that may review (admin or reviewer)."""
    svc, who, name = await scoped(request, scenario)
    form = await checked_form(request, who)
    who.principal.require_reviewer(name)
    return svc, who, name, form


def _metric_value(name: str, spec: MetricSettings, raw: str) -> bool | float | str:
    if spec.type == "boolean":
        if raw not in ("true", "false"):
            raise BadRequest(f"metric '{name}' is yes or no", param=f"m.{name}")
        return raw == "true"
    if spec.type == "float":
        try:
            return float(raw)
        except ValueError:
            raise BadRequest(f"metric '{name}' must be a number", param=f"m.{name}") from None
    return raw


def review_body(
    form: dict[str, str], metrics: dict[str, MetricSettings], reviewer: str
) -> ReportIn:
    """The review form as the report `POST /reef/report` would take: the score, the metrics
    given, the correction and the comment as feedback, and who reviewed."""
    record_id = form.get("record_id", "").strip()
    if not record_id:
        raise BadRequest("record_id is required", param="record_id")
    body: dict[str, Any] = {"references": [record_id]}
    if form.get("report_id"):
        body["report_id"] = form["report_id"]
    if form.get("score", "").strip():
        try:
            body["score"] = float(form["score"])
        except ValueError:
            raise BadRequest("score must be a number", param="score") from None
    given = {k[2:]: v.strip() for k, v in form.items() if k.startswith("m.") and v.strip()}
    unknown = sorted(set(given) - set(metrics))
    if unknown:
        raise BadRequest(f"unknown metric '{unknown[0]}'", param=f"m.{unknown[0]}")
    body["metrics"] = {k: _metric_value(k, metrics[k], v) for k, v in given.items()}
    feedback = {
        k: form[k].strip()[:MAX_TEXT] for k in ("correction", "comment") if form.get(k, "").strip()
    }
    if feedback:
        body["feedback"] = feedback
    if "score" not in body and not body["metrics"] and not feedback:
        raise BadRequest("the review is empty: give a score, a metric, a correction or a comment")
    body["metadata"] = {"source": SOURCE, "reviewer": reviewer, "via": "dashboard"}
    if form.get("item"):
        body["metadata"]["queue_item"] = form["item"]
    return validate(ReportIn, body)


async def review_context(
    request: Request, svc: Services, who: Viewer, name: str, turns: int
) -> dict[str, Any]:
    """What the transcript needs to show its review forms: whether the viewer may review,
    the scenario's declared metrics, a fresh report id per turn (a form sent twice stores one
    report), and the queue item the viewer holds on this page (?item=)."""
    if not (who.principal.may_review and who.principal.may_use(name)):
        return {"may_review": False}
    own = await call(learning_settings, svc.settings, svc.store, name)
    item = None
    wanted = request.query_params.get("item")
    if wanted:
        found = await call(svc.store.review_items_by_id, name, [wanted])
        held = [i for i in found if i.status == "open" and i.claimed_by == who.principal.name]
        item = held[0] if held else None
    return {
        "may_review": True,
        "metrics": sorted(own.metrics.items()),
        "report_ids": [new_id("rpt") for _ in range(turns)],
        "item": item,
    }


@router.post("/s/{scenario}/review")
@page
async def review(request: Request, scenario: str) -> Response:
    """Store one turn's review as a report; from the queue, finish its item and take the next."""
    svc, who, name, form = await reviewer_form(request, scenario)
    own = await call(learning_settings, svc.settings, svc.store, name)
    body = review_body(form, own.metrics, who.principal.name)
    stored, _ = await store_report(svc, name, body)
    item = form.get("item", "")
    if item:
        await call(svc.store.finish_review_item, name, item, who.principal.name, "done", stored.id)
        return await _next_item(svc, who, name, own, "reviewed", stored.id)
    record = await call(svc.store.get_record, name, body.references[0])
    return RedirectResponse(
        _turn_url(name, record.id, record.session_id, None, {"msg": "reviewed", "id": stored.id}),
        status_code=303,
    )


def _turn_url(
    name: str, record_id: str, session_id: str | None, item: str | None, extra: dict[str, str]
) -> str:
    """The page that shows the turn (its session's transcript, or the record alone), on it."""
    query = {**({"item": item} if item else {}), **extra}
    path = f"sessions/{quote(session_id)}" if session_id else f"records/{quote(record_id)}"
    qs = f"?{urlencode(query)}" if query else ""
    return f"/ui/s/{quote(name)}/{path}{qs}#{quote(record_id)}"


async def _next_item(
    svc: Services, who: Viewer, name: str, own: Settings, msg: str, rid: str | None = None
) -> Response:
    """Take the reviewer's next item and open its turn; back to the queue when none is left."""
    await call(fill, svc.store, svc.browse.reports_for, name, own.review)
    extra = {"msg": msg, **({"id": rid} if rid else {})}
    while True:
        item: ReviewItem | None = await call(
            svc.store.claim_review_item, name, who.principal.name, own.review.lease_s
        )
        if item is None:
            query = urlencode({**extra, "msg": "queue_empty" if msg == "taken" else msg})
            return RedirectResponse(f"/ui/s/{quote(name)}/queue?{query}", status_code=303)
        try:
            record = await call(svc.store.get_record, name, item.record_id)
        except NotFound:  # retention archived the turn since it was queued: nothing to show
            await call(
                svc.store.finish_review_item, name, item.id, item.claimed_by, "skipped", None
            )
            continue
        url = _turn_url(name, record.id, record.session_id, item.id, extra)
        return RedirectResponse(url, status_code=303)


@router.get("/s/{scenario}/queue")
@page
async def queue(request: Request, scenario: str) -> Response:
    """The scenario's annotation queue: its progress, the item the viewer holds, the open
    items, and (reviewers) taking the next one. Viewing it fills it from the recent turns."""
    svc, who, name = await scoped(request, scenario)
    await call(svc.store.get_scenario, name)
    own = await call(learning_settings, svc.settings, svc.store, name)
    await call(fill, svc.store, svc.browse.reports_for, name, own.review)
    progress = await call(svc.store.queue_progress, name)
    items = await call(svc.store.review_items, name, "open", 100)
    done = await call(svc.store.review_items, name, "done", 20, newest=True)
    return render(
        request,
        "queue.html",
        who,
        scenario=name,
        tab="queue",
        progress=progress,
        items=items,
        done=done,
        policies=describe(own.review),
        may_review=who.principal.may_review and who.principal.may_use(name),
        now_ts=time.time(),
    )


@router.post("/s/{scenario}/queue/take")
@page
async def take(request: Request, scenario: str) -> Response:
    svc, who, name, _ = await reviewer_form(request, scenario)
    own = await call(learning_settings, svc.settings, svc.store, name)
    return await _next_item(svc, who, name, own, "taken")


@router.post("/s/{scenario}/queue/skip")
@page
async def skip(request: Request, scenario: str) -> Response:
    svc, who, name, form = await reviewer_form(request, scenario)
    item = form.get("item", "").strip()
    if not item:
        raise BadRequest("item is required", param="item")
    own = await call(learning_settings, svc.settings, svc.store, name)
    await call(svc.store.finish_review_item, name, item, who.principal.name, "skipped", None)
    return await _next_item(svc, who, name, own, "skipped")
