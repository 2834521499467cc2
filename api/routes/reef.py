"""Reef's own routes: scenarios, reports (feedback on receipts), and record read-back."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse

from reef.api.bodies import read_json, validate
from reef.api.contract import SCENARIO, ScenarioPath, errors, reads
from reef.api.reporting import store_report
from reef.api.services import caller, check_scenario_name, services
from reef.errors import ReefError
from reef.records import Record, Report, Scenario
from reef.wire import (
    RecordList,
    RecordOut,
    ReportIn,
    ReportList,
    ReportOut,
    ScenarioDeletion,
    ScenarioIn,
    ScenarioList,
    ScenarioOut,
)

log = logging.getLogger("reef.api")
router = APIRouter(prefix="/reef", tags=["reef"])
Limit = Annotated[int, Query(ge=1, le=1000)]


def _scenario_out(s: Scenario) -> ScenarioOut:
    return ScenarioOut(**dataclasses.asdict(s))


MAX_SESSION_TURNS = 1000


def _record_out(r: Record) -> RecordOut:
    return RecordOut(**dataclasses.asdict(r))


def _report_out(r: Report, created: bool = True) -> ReportOut:
    return ReportOut(**{**dataclasses.asdict(r), "references": list(r.references)}, created=created)


@router.post(
    "/scenarios",
    status_code=201,
    response_model=ScenarioOut,
    openapi_extra=reads(ScenarioIn),
    responses=errors(409, 503, e409="a scenario of that name exists"),
    summary="Create a scenario (it is also created on first use by x-reef-scenario)",
)
async def create_scenario(request: Request) -> ScenarioOut:
    svc = services(request)
    principal = svc.auth.principal(request)
    body = validate(ScenarioIn, await read_json(request, svc.settings.server.max_body_bytes))
    principal.require(body.name)
    scenario = await asyncio.to_thread(svc.store.create_scenario, body.name, body.description)
    return _scenario_out(scenario)


@router.get(
    "/scenarios",
    response_model=ScenarioList,
    responses=errors(503),
    summary="Scenarios the caller may use",
)
async def list_scenarios(request: Request) -> dict[str, object]:
    svc = services(request)
    principal = svc.auth.principal(request)
    scenarios = await asyncio.to_thread(svc.store.list_scenarios)
    data = [_scenario_out(s) for s in scenarios if principal.may_use(s.name)]
    return {"object": "list", "data": data}


@router.get("/scenarios/{scenario}", response_model=ScenarioOut, responses=errors(403, 404, 503))
async def get_scenario(request: Request, scenario: ScenarioPath) -> ScenarioOut:
    svc, _, name = caller(request, scenario)
    return _scenario_out(await asyncio.to_thread(svc.store.get_scenario, name))


@router.delete(
    "/scenarios/{scenario}",
    status_code=202,
    summary="Delete a scenario with its records, reports, releases, files and MLflow entries "
    "(admin): the rows at once, the files and MLflow entries in the background",
    responses={
        202: {
            "model": ScenarioDeletion,
            "description": "deleted from the database; its files and MLflow entries are removed in "
            "the background (`reef gc` finishes what is left)",
        },
        **errors(404, 503),
    },
)
async def delete_scenario(request: Request, scenario: ScenarioPath) -> Response:
    svc, principal, name = caller(request, scenario)
    principal.require_admin(f"deleting scenario '{name}'")
    # The commit point: rows gone, tombstone written (404 when there is no such scenario).
    await asyncio.to_thread(svc.store.delete_scenario, name)
    svc.serving.forget(name)
    if svc.variants is not None:
        for variant in svc.variants.loaded():
            if variant.startswith(f"{name}@"):
                try:
                    await svc.variants.unload(variant)
                except ReefError as e:  # the deletion stands; the engine keeps a dead variant
                    log.warning("unloading %s failed: %s", variant, e.message)
    # Files and MLflow entries off the request path: an unreachable S3 or MLflow never holds
    # the answer (reef.deletion.Cleaner; what it cannot finish, `reef gc` does).
    svc.cleaner.add(name)
    return JSONResponse(
        {
            "object": "scenario.deletion",
            "scenario": name,
            "status": "pending",
            "message": f"scenario '{name}' is deleted; its files and MLflow entries are being "
            "removed in the background (until then the name cannot be used again; `reef gc` "
            "finishes what a failed or interrupted clean-up leaves)",
        },
        status_code=202,
    )


@router.get(
    "/scenarios/{scenario}/records", response_model=RecordList, responses=errors(403, 404, 503)
)
async def list_records(
    request: Request, scenario: ScenarioPath, after: str | None = None, limit: Limit = 100
) -> RecordList:
    svc, _, name = caller(request, scenario)
    await asyncio.to_thread(svc.store.get_scenario, name)  # 404 for an unknown scenario
    rows = await asyncio.to_thread(svc.store.list_records, name, after, limit + 1)
    page = rows[:limit]
    return RecordList(
        data=[_record_out(r) for r in page],
        has_more=len(rows) > limit,
        last_id=page[-1].id if page else None,
    )


@router.get(
    "/scenarios/{scenario}/records/{record_id}",
    response_model=RecordOut,
    responses=errors(403, 404, 503),
)
async def get_record(request: Request, scenario: ScenarioPath, record_id: str) -> RecordOut:
    svc, _, name = caller(request, scenario)
    return _record_out(await asyncio.to_thread(svc.store.get_record, name, record_id))


@router.get(
    "/scenarios/{scenario}/sessions/{session_id}",
    response_model=RecordList,
    responses=errors(403, 404, 503),
    summary="A session's records, first turn first (the chain of turns ending at its last)",
)
async def get_session(request: Request, scenario: ScenarioPath, session_id: str) -> RecordList:
    svc, _, name = caller(request, scenario)
    await asyncio.to_thread(svc.store.get_scenario, name)  # 404 for an unknown scenario
    records = await asyncio.to_thread(
        svc.store.session_records, name, session_id, MAX_SESSION_TURNS
    )
    return RecordList(
        data=[_record_out(r) for r in records],
        has_more=False,
        last_id=records[-1].id if records else None,
    )


@router.get(
    "/scenarios/{scenario}/reports", response_model=ReportList, responses=errors(403, 404, 503)
)
async def list_reports(
    request: Request, scenario: ScenarioPath, after: str | None = None, limit: Limit = 100
) -> ReportList:
    svc, _, name = caller(request, scenario)
    await asyncio.to_thread(svc.store.get_scenario, name)
    rows = await asyncio.to_thread(svc.store.list_reports, name, after, limit + 1)
    page = rows[:limit]
    return ReportList(
        data=[_report_out(r) for r in page],
        has_more=len(rows) > limit,
        last_id=page[-1].id if page else None,
    )


@router.post(
    "/report",
    response_model=ReportOut,
    status_code=201,
    openapi_extra=reads(ReportIn, headers=(SCENARIO,)),
    summary="Report feedback on receipts of the caller's scenario (x-reef-scenario)",
    responses={
        200: {
            "model": ReportOut,
            "description": "a retry of a stored report (same report_id and content)",
        },
        **errors(404, 409, 503, e409="report_id names a stored report with other content"),
    },
)
async def report(request: Request, response: Response) -> ReportOut:
    svc, _, name = caller(request)
    body = validate(ReportIn, await read_json(request, svc.settings.server.max_body_bytes))
    check_scenario_name(name)
    stored, created = await store_report(svc, name, body)
    if not created:
        response.status_code = 200
    return _report_out(stored, created)
