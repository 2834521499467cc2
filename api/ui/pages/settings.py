"""A scenario's learning settings (admins): what applies now, each run-time version with who
made it and when, and a form that saves the next version. Saving calls what the admin route
PUT /reef/scenarios/{s}/settings calls (reef.scenario_settings.change: validated over the
configuration, versioned, refused when another change came since the one the form was read at);
the worker and every replica read the newest version at their next decision."""

from __future__ import annotations

from typing import Any

import yaml
from fastapi import APIRouter, Request
from fastapi.responses import Response

from reef.api.bodies import validate
from reef.api.routes.scenario_settings import ScenarioSettingsIn, settings_out
from reef.api.services import Services
from reef.api.ui.pages.common import admin_form, back, call, page, render, scoped
from reef.api.ui.signin import Viewer
from reef.errors import BadRequest, Conflict
from reef.scenario_settings import change

router = APIRouter(prefix="/ui", include_in_schema=False)

READ = "reading a scenario's learning settings"
WRITE = "changing a scenario's learning settings"


def as_yaml(value: Any) -> str:
    return yaml.safe_dump(value, sort_keys=False, default_flow_style=False) if value else ""


def parse(text: str) -> dict[str, Any]:
    """The form's YAML as run-time keys ({reef, gate, judge, metrics, review, engine}), checked as the admin
    route checks its body (400 naming what is wrong)."""
    try:
        data = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as e:
        raise BadRequest(f"not YAML: {e}", code="invalid_settings", param="settings") from None
    if not isinstance(data, dict):
        raise BadRequest(
            "the settings are a mapping of reef, gate, judge, metrics, review and engine",
            code="invalid_settings",
            param="settings",
        )
    if "expected_version" in data:
        raise BadRequest("expected_version is not a setting", param="expected_version")
    body = validate(ScenarioSettingsIn, data)
    return body.model_dump(exclude={"expected_version"}, exclude_defaults=True)


async def _page(
    request: Request,
    svc: Services,
    who: Viewer,
    name: str,
    text: str | None = None,
    error: str | None = None,
    status: int = 200,
) -> Response:
    await call(svc.store.get_scenario, name)  # 404 for an unknown scenario
    versions = await call(svc.store.scenario_settings, name)
    view = settings_out(svc.settings, name, versions)
    response = render(
        request,
        "settings.html",
        who,
        scenario=name,
        tab="settings",
        view=view,
        effective=as_yaml(view.effective),
        text=as_yaml(versions[0].settings if versions else {}) if text is None else text,
        history=[(c, as_yaml(c.settings)) for c in view.history],
        error=error,
    )
    response.status_code = status
    return response


@router.get("/s/{scenario}/settings")
@page
async def settings(request: Request, scenario: str) -> Response:
    svc, who, name = await scoped(request, scenario)
    who.principal.require_admin(READ)  # they name paths and endpoints, as the admin route's
    return await _page(request, svc, who, name)


@router.post("/s/{scenario}/settings")
@page
async def save(request: Request, scenario: str) -> Response:
    svc, who, name, form = await admin_form(request, scenario, WRITE)
    text = form.get("keys", "")
    try:
        expected = int(form.get("expected_version", ""))
    except ValueError:
        raise BadRequest(
            "expected_version must be a whole number", param="expected_version"
        ) from None
    try:
        keys = parse(text)
        await call(change, svc.settings, svc.store, name, keys, who.principal.name, expected)
        svc.serving.forget(name)  # this replica samples with the change from the next call
    except (BadRequest, Conflict) as e:  # the page again, the edit kept, saying why
        return await _page(request, svc, who, name, text, e.message, e.status)
    return back(name, "settings", "settings_saved")
