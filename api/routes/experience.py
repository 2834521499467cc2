"""Experience routes: whether a scenario has a training batch waiting (read-only), and
experience imported from outside (reef.imports)."""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from reef.api.bodies import capped_body
from reef.api.contract import ScenarioPath, errors
from reef.api.services import caller
from reef.errors import UnsupportedMediaType
from reef.imports import import_file
from reef.readiness import own_readiness
from reef.samples import KINDS
from reef.scenario_settings import learning_settings

router = APIRouter(prefix="/reef", tags=["reef"])


class StatusOut(BaseModel):
    object: str = "scenario.status"
    scenario: str
    recipe: str = Field(description="the loop's recipe (reef.recipe)")
    kind: str = Field(description="the experience kind counted: " + ", ".join(KINDS))
    eligible: int = Field(description="samples that would go into the next batch")
    batch_size: int = Field(description="reef.batch_size")
    ready: bool = Field(description="eligible >= batch_size")
    dropped: dict[str, int] = Field(description="samples left out, by reason")
    awaiting_feedback: int = Field(description="records no report quotes yet")
    last_materialization: dict[str, Any] | None = Field(
        description="the scenario's latest dataset snapshot (uri: admins only, content_hash, "
        "kind, rows, created_at)"
    )
    waiting: str | None = Field(
        None, description="why a full batch is not ready yet (e.g. the gate has no evidence)"
    )
    judge: dict[str, Any] | None = Field(
        None,
        description="the judge's record on this scenario (null before its first judgment): "
        "turns judged, dropped by reason, void verdicts and their rate, verdicts under "
        "judge.min_confidence (unsure), mean confidence, and agreement with people's scores "
        "on the same turns (all of them, and the last judge.agreement_window with its 90% "
        "Wilson interval)",
    )
    metrics: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="each metric the scenario declares, over its reports: n (how many give "
        "it), share_true (boolean), mean/min/max (float) or counts per value (categorical)",
    )
    judge_refused: str | None = Field(
        None,
        description="why the judge's verdicts do not train now: judge.min_agreement is not "
        "shown by its agreement with people (null: they train, or the check is off)",
    )


@router.get(
    "/scenarios/{scenario}/status",
    response_model=StatusOut,
    responses=errors(403, 404, 503),
    summary="Experience readiness: eligible samples vs batch size, drops by reason (no side effects)",
)
async def scenario_status(
    request: Request,
    scenario: ScenarioPath,
    # reef.samples checks it (400 naming the kinds); declared here for the spec
    kind: str | None = Query(
        None,
        description="experience kind; default: the recipe's",
        json_schema_extra={"enum": list(KINDS)},
    ),
) -> StatusOut:
    svc, principal, name = caller(request, scenario)
    own = await asyncio.to_thread(learning_settings, svc.settings, svc.store, name)
    loop = own.reef
    r = await asyncio.to_thread(own_readiness, svc.store, name, own, kind, artifacts=svc.artifacts)
    last = r.last_materialization
    if last is not None and not principal.admin:  # where the server keeps files: admins only
        last = {k: v for k, v in last.items() if k != "uri"}
    return StatusOut(
        scenario=name,
        recipe=loop.recipe,
        kind=r.kind,
        eligible=r.eligible,
        batch_size=r.batch_size,
        ready=r.ready,
        dropped=dict(sorted(r.dropped.items())),
        awaiting_feedback=r.awaiting_feedback,
        last_materialization=last,
        waiting=r.waiting,
        judge=r.judge.as_dict() if r.judge is not None else None,
        judge_refused=r.judge_refused,
        metrics=r.metrics,
    )


class ImportOut(BaseModel):
    object: str = "scenario.import"
    scenario: str
    records: int = Field(description="records added")
    reports: int = Field(description="reports added")
    skipped: int = Field(description="lines imported before (their id is taken): nothing added")
    dangling_reports: list[str] = Field(
        description="ids of reports that quote records the file does not have (not added)"
    )


NDJSON = ("application/x-ndjson", "application/jsonl", "application/json-lines")


@router.post(
    "/scenarios/{scenario}/records:import",
    response_model=ImportOut,
    responses=errors(400, 403, 413, 415, 503, e415="The body is not sent as JSONL"),
    openapi_extra={
        "requestBody": {
            "required": True,
            # JSONL: the array's items, one JSON object per line
            "content": {NDJSON[0]: {"schema": {"type": "array", "items": {"type": "object"}}}},
        }
    },
    summary="Import experience: OpenAI chat JSONL or reef export's rows (reef import)",
    description='One JSON object per line: `{"messages": [...], "completion": "..."}` (or '
    "the fine-tuning shape whose last message is the answer), with optional `id`, `score`, "
    "`feedback`, `model`, `tags`; or a row of `reef export --format jsonl`. The whole body is "
    "checked before anything is written (a bad line: 400 naming it); a line whose `id` was "
    "imported before adds nothing. Imported records are tagged `reef.imported` and are not "
    "served traffic.",
)
async def import_records(request: Request, scenario: ScenarioPath) -> ImportOut:
    svc, _, name = caller(request, scenario)
    content_type = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
    if content_type not in NDJSON:
        raise UnsupportedMediaType(
            f"send the body as JSONL with 'Content-Type: {NDJSON[0]}' (got "
            f"{repr(content_type[:100]) if content_type else 'none'})"
        )
    limit = svc.settings.server.max_import_bytes
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as spool:
        async for chunk in capped_body(request, limit):
            spool.write(chunk)
        spool.flush()
        result = await asyncio.to_thread(import_file, svc.store, name, Path(spool.name))
    return ImportOut(scenario=name, **dataclasses.asdict(result))
