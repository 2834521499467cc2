"""What every route needs, built once per app by the factory and reached via app.state."""

from __future__ import annotations

import re
from dataclasses import dataclass

from starlette.requests import Request

from api.auth import Authenticator, Principal
from api.evolver import Evolver
from api.metrics import Metrics
from reef.engines.base import Engine
from reef.errors import BadRequest
from reef.serving import Serving
from reef.settings import Settings
from reef.store.base import Store
from reef.store.commits import GroupCommitter
from reef.variants import Variants
from reef.wire import SCENARIO_PATTERN

_SCENARIO = re.compile(SCENARIO_PATTERN)


@dataclass
class Services:
    settings: Settings
    engine: Engine
    store: Store
    committer: GroupCommitter
    serving: Serving
    auth: Authenticator
    metrics: Metrics
    variants: Variants | None = None  # None: the engine cannot load releases
    evolver: Evolver | None = None  # the automatic trigger (reef serve with reef.auto)


def services(request: Request) -> Services:
    svc: Services = request.app.state.services
    return svc


def check_scenario_name(name: str) -> str:
    if not _SCENARIO.match(name):
        raise BadRequest(
            f"invalid scenario name '{name}': use 1-64 letters, digits, '.', '_' or '-'",
            code="invalid_scenario",
        )
    return name


def caller(request: Request, scenario: str | None = None) -> tuple[Services, Principal, str]:
    """The services, the authenticated principal, and the scenario the call is for (from the
    path when given, else the x-reef-scenario header, else the default), access checked."""
    svc = services(request)
    principal = svc.auth.principal(request)
    name = (
        scenario or request.headers.get("x-reef-scenario") or svc.settings.server.default_scenario
    )
    check_scenario_name(name)
    principal.require(name)
    return svc, principal, name
