"""What every route needs, built once per app by the factory and reached via app.state."""

from __future__ import annotations

import asyncio
import functools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from api.auth import Authenticator, Principal
from api.evolver import Evolver
from api.metrics import Metrics
from deploy.chain import ReleaseChain
from reef.artifacts import ArtifactStore
from reef.engines.base import Engine
from reef.errors import BadRequest, ServiceUnavailable
from reef.serving import Serving
from reef.settings import Settings
from reef.store.base import Store
from reef.store.browse import Browse
from reef.store.commits import GroupCommitter
from reef.store.ui_sessions import UISessions
from reef.variants import Variants
from reef.wire import SCENARIO_PATTERN

if TYPE_CHECKING:
    from reef.retention import ArchiveFiles  # pyarrow: loaded when the archive is first read

_SCENARIO = re.compile(SCENARIO_PATTERN)


@dataclass
class Services:
    """One owner of every shared part of a serving process (one of each per process)."""

    settings: Settings
    engine: Engine
    store: Store
    committer: GroupCommitter
    serving: Serving
    auth: Authenticator
    metrics: Metrics
    artifacts: ArtifactStore
    chain: ReleaseChain  # rollback, promote and harness releases, into this process's engine
    local: LocalEngine
    variants: Variants | None = None  # None: the engine cannot load releases
    evolver: Evolver | None = None  # the automatic trigger (reef serve with reef.auto)

    @functools.cached_property
    def browse(self) -> Browse:
        """The dashboard's read-only, index-bounded queries over this store."""
        return Browse(self.store)

    @functools.cached_property
    def archive_files(self) -> ArchiveFiles:
        """Archive files the dashboard read and checked, kept for its next views."""
        from reef.retention import ArchiveFiles

        return ArchiveFiles(self.artifacts)

    @functools.cached_property
    def ui_sessions(self) -> UISessions:
        """The dashboard's sign-in sessions, in the database every replica shares."""
        return UISessions(self.store)


class LocalEngine:
    """deploy.engine.EngineTarget for this process's engine, called from a worker thread (the
    chain's steps block); the engine's coroutines run on the app's event loop."""

    def __init__(self, engine: Engine, serving: Serving, variants: Variants | None):
        # None: an engine that cannot load releases (upstream): it serves base releases only,
        # with or without a harness
        self._variants = variants
        self.kind = engine.kind
        self.loads_releases = variants is not None
        self.serving = serving
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the engine runs on (the app's, set when it starts)."""
        self._loop = loop

    def _run(self, coro: Any) -> Any:
        if self._loop is None:
            coro.close()
            raise ServiceUnavailable("the engine has not started", code="not_ready")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _deployable(self) -> Variants:
        if self._variants is None:
            raise BadRequest(f"the {self.kind} engine cannot load releases", code="not_deployable")
        return self._variants

    def load(self, name: str, kind: str, source: str) -> dict[str, Any]:
        return dict(self._run(self._deployable().load(name, kind, source)))

    def verify(self, name: str) -> dict[str, Any]:
        return dict(self._run(self._deployable().verify(name)))

    def unload(self, name: str) -> None:
        self._run(self._deployable().unload(name))

    def variants(self) -> list[str]:
        return self._variants.loaded() if self._variants is not None else []

    def refresh(self, scenario: str) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.serving.forget, scenario)


def services(request: Request) -> Services:
    svc: Services = request.app.state.services
    return svc


def check_scenario_name(name: str) -> str:
    # fullmatch: with match, `$` would let a trailing newline through
    if not _SCENARIO.fullmatch(name):
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
