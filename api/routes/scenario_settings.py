"""A scenario's learning settings at run time: read them (what applies now, and each change
with who made it and when), and change them without a restart (admins: every replica and the
worker read the newest version from the database at their next decision)."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from reef.api.bodies import read_json, validate
from reef.api.contract import ScenarioPath, errors, reads
from reef.api.services import caller
from reef.records import SettingsVersion
from reef.scenario_settings import change
from reef.settings import Settings

router = APIRouter(prefix="/reef", tags=["reef"])


class ScenarioSettingsIn(BaseModel):
    """The scenario's run-time keys, over the configuration's (`scenarios.<name>`); each PUT
    replaces the previous run-time keys as a whole."""

    model_config = ConfigDict(extra="forbid")

    reef: dict[str, Any] = Field(
        default_factory=dict, description="reef.* keys: recipe, batch_size, params, select, ..."
    )
    gate: dict[str, Any] = Field(default_factory=dict, description="gate.* keys")
    judge: dict[str, Any] = Field(default_factory=dict, description="judge.* keys")
    metrics: dict[str, Any] = Field(
        default_factory=dict,
        description="named metrics the scenario's reports may carry: "
        "{name: {type: boolean|float|categorical, range, values}}",
    )
    review: dict[str, Any] = Field(
        default_factory=dict,
        description="review.* keys: the policies that fill the scenario's annotation queue",
    )
    engine: dict[str, Any] = Field(
        default_factory=dict,
        description="engine.sampling_defaults: the temperature / top_p given to the "
        "scenario's requests that name neither ({}: none); every replica applies a change "
        "within a few seconds",
    )
    expected_version: int | None = Field(
        None,
        ge=0,
        description="the version read before this change (409 when another came since); "
        "unset: whatever is current",
    )


class SettingsChange(BaseModel):
    version: int
    settings: dict[str, Any] = Field(description="the run-time keys of this version")
    changed_by: str = Field(description="the name of the token that made the change")
    changed_at: datetime


class ScenarioSettingsOut(BaseModel):
    object: str = "scenario.settings"
    scenario: str
    version: int = Field(description="the newest run-time version (0: none set)")
    effective: dict[str, Any] = Field(
        description="reef, gate, judge, review, metrics and engine (its sampling_defaults) as "
        "they apply now (configuration, then run-time keys; secrets masked)"
    )
    history: list[SettingsChange] = Field(description="run-time versions, newest first (20)")


def settings_out(
    settings: Settings, scenario: str, versions: list[SettingsVersion]
) -> ScenarioSettingsOut:
    """What GET and PUT answer (and the dashboard's settings page shows)."""
    own = settings.for_scenario(scenario, versions[0].settings if versions else None)
    return ScenarioSettingsOut(
        scenario=scenario,
        version=versions[0].version if versions else 0,
        effective={
            **{
                section: getattr(own, section).model_dump(mode="json")
                for section in ("reef", "gate", "judge", "review")
            },
            "metrics": {k: v.model_dump(mode="json") for k, v in own.metrics.items()},
            "engine": {"sampling_defaults": own.engine.sampling_defaults},
        },
        history=[
            SettingsChange(
                version=v.version,
                settings=v.settings,
                changed_by=v.changed_by,
                changed_at=v.changed_at,
            )
            for v in versions
        ],
    )


@router.get(
    "/scenarios/{scenario}/settings",
    response_model=ScenarioSettingsOut,
    responses=errors(403, 404, 503),
    summary="A scenario's learning settings as they apply now, and who changed them when (admin)",
)
async def scenario_settings(request: Request, scenario: ScenarioPath) -> ScenarioSettingsOut:
    svc, principal, name = caller(request, scenario)
    principal.require_admin("reading a scenario's learning settings")  # paths, endpoints
    await asyncio.to_thread(svc.store.get_scenario, name)  # 404 for an unknown scenario
    versions = await asyncio.to_thread(svc.store.scenario_settings, name)
    return settings_out(svc.settings, name, versions)


@router.put(
    "/scenarios/{scenario}/settings",
    response_model=ScenarioSettingsOut,
    openapi_extra=reads(ScenarioSettingsIn),
    responses=errors(400, 403, 404, 409, 503, e409="another change came since expected_version"),
    summary="Change a scenario's settings (recipe, batch, gate, judge, review, metrics, "
    "sampling) without a restart (admin)",
)
async def put_scenario_settings(request: Request, scenario: ScenarioPath) -> ScenarioSettingsOut:
    svc, principal, name = caller(request, scenario)
    principal.require_admin("changing a scenario's learning settings")
    body = validate(
        ScenarioSettingsIn, await read_json(request, svc.settings.server.max_body_bytes)
    )
    keys = body.model_dump(exclude={"expected_version"}, exclude_defaults=True)
    await asyncio.to_thread(svc.store.get_scenario, name)  # 404 for an unknown scenario
    await asyncio.to_thread(
        change, svc.settings, svc.store, name, keys, principal.name, body.expected_version
    )
    svc.serving.forget(name)  # this replica serves with the change from the next call
    versions = await asyncio.to_thread(svc.store.scenario_settings, name)
    return settings_out(svc.settings, name, versions)
