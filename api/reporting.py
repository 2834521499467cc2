"""Storing a report: the one write path of feedback, for `POST /reef/report` and the
dashboard's review form alike. Refuses what only Reef may write (a judge's source or report
id), checks the named metrics against the scenario's, checks that
every receipt exists, stores the report (idempotent on its id), and tells the counters, the
telemetry and the evolve worker."""

from __future__ import annotations

from reef.api.services import Services
from reef.errors import BadRequest
from reef.metrics import check_metrics
from reef.records import Report, new_id, utcnow
from reef.scenario_settings import learning_settings
from reef.store.deadline import bounded
from reef.wire import RESERVED_REPORT_ID_PREFIXES, RESERVED_SOURCES, ReportIn


async def store_report(svc: Services, name: str, body: ReportIn) -> tuple[Report, bool]:
    """Store `body` as a report of scenario `name`: (the stored report, whether it is new; a
    retry of a stored report with the same id and content gives it back unchanged)."""
    check_reserved(body)
    if body.metrics:  # against the scenario's own metrics, those set at run time included
        own = await bounded(svc.store_deadline_s, learning_settings, svc.settings, svc.store, name)
        check_metrics(name, body.metrics, own.metrics)
    found = await bounded(
        svc.store_deadline_s, svc.store.existing_record_ids, name, body.references
    )
    missing = [r for r in body.references if r not in found]
    if missing:
        shown = ", ".join(missing[:5]) + (" …" if len(missing) > 5 else "")
        raise BadRequest(
            f"unknown receipts for scenario '{name}': {shown}",
            code="unknown_reference",
            param="references",
        )
    report = Report(
        id=body.report_id or new_id("rpt"),
        scenario=name,
        created_at=utcnow(),
        references=tuple(body.references),
        score=body.score,
        feedback=body.feedback,
        metadata=body.metadata,
        metrics=body.metrics,
    )
    # Past the deadline the caller is answered 503 and the report may still land once the
    # database answers: a retry with the same report_id is then answered 200 with it.
    stored, created = await bounded(svc.store_deadline_s, svc.store.add_report, report)
    if created:
        svc.metrics.reports.labels(name).inc()
        svc.telemetry.report(stored)
        if svc.evolver is not None:
            svc.evolver.notify(name)
    return stored, created


def check_reserved(body: ReportIn) -> None:
    """A client's report never passes for one Reef writes: a judgment counts as the judge's
    verdict (experience, readiness), and its id is the one the judging worker will take."""
    source = body.metadata.get("source")
    if isinstance(source, str) and source.strip().lower() in RESERVED_SOURCES:
        raise BadRequest(
            f"metadata.source '{source}' is reserved for reports Reef writes itself",
            code="reserved_source",
            param="metadata.source",
        )
    rid = (body.report_id or "").lower()
    if rid.startswith(RESERVED_REPORT_ID_PREFIXES):
        raise BadRequest(
            f"report ids starting with {', '.join(RESERVED_REPORT_ID_PREFIXES)} are reserved "
            "for Reef's own reports",
            code="reserved_report_id",
            param="report_id",
        )
