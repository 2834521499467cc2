"""What every route needs: every shared part of a serving process, built once per app by
`Services.build`, started and stopped in order by the app's lifespan, reached via app.state."""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from reef import events
from reef.admission import Admission
from reef.api import registration
from reef.api.auth import Authenticator, Principal
from reef.api.dependencies import Dependencies
from reef.api.evolver import Evolver
from reef.api.metrics import AdmissionCollector, Metrics
from reef.api.quotas import QuotaCollector, QuotaGate
from reef.api.readiness_metrics import ReadinessCollector
from reef.api.rollouts import watcher as rollout_watcher
from reef.api.telemetry_metrics import TelemetryCollector
from reef.artifacts import ArtifactStore, artifacts_for
from reef.background import BackgroundTask
from reef.deletion import Cleaner
from reef.deploy.chain import ReleaseChain
from reef.deploy.engine import EngineTarget, Fleet, engines_for
from reef.engines.base import Deployable, Engine
from reef.errors import BadRequest, ServiceUnavailable
from reef.harness import HarnessCache
from reef.limits import Limits
from reef.registry.clients import bound_http_requests
from reef.rollouts import Rollouts
from reef.scenario_settings import sampling_defaults as scenario_sampling
from reef.serving import Serving
from reef.settings import Settings
from reef.shadow import Shadows
from reef.store.base import Store
from reef.store.browse import Browse
from reef.store.commits import GroupCommitter
from reef.store.deadline import for_store
from reef.store.sql import open_store
from reef.store.ui_sessions import UISessions
from reef.telemetry import OFF, Telemetry, telemetry_for
from reef.variants import Variants
from reef.wire import SCENARIO_PATTERN

log = logging.getLogger("reef.api")

if TYPE_CHECKING:
    from reef.retention import ArchiveFiles  # pyarrow: loaded when the archive is first read

_SCENARIO = re.compile(SCENARIO_PATTERN)

# How often the evolve worker is checked (and started again once it died).
WORKER_CHECK_S = 2.0


@dataclass
class Services:
    """One owner of every shared part of a serving process (one of each per process).

    Background work (reef.background) runs beside the requests: the engine registry's
    heartbeat (engine.fleet.registry), the rollout watcher, the readiness numbers behind /metrics,
    the shadow copies' writer, the webhook events' deliverer (events.webhooks), the OTLP span
    export (telemetry.otlp_endpoint), deleted scenarios' clean-up, and the evolve worker process (reef.auto)."""

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
    engines: EngineTarget  # every engine a deploy from here reaches (this one included)
    readiness: ReadinessCollector  # experience readiness in /metrics
    watcher: BackgroundTask  # checks the live canaries (api.rollouts)
    quotas: QuotaGate  # auth.tokens[].quota: admits calls, counts their tokens
    cleaner: Cleaner  # deleted scenarios' files and MLflow entries, off the request path
    dependencies: Dependencies  # what /readyz reports
    heartbeat: BackgroundTask | None = None  # the engine registry's entry (engine.fleet.registry)
    variants: Variants | None = None  # None: the engine cannot load releases
    evolver: Evolver | None = None  # the automatic trigger (reef serve with reef.auto)
    telemetry: Telemetry = OFF  # OTLP traces (telemetry.otlp_endpoint)
    deliverer: BackgroundTask | None = None  # webhook events (events.webhooks)
    # How long serving's store work may wait for the database (store.deadline_s on Postgres,
    # None on SQLite; reef.store.deadline): the report route and /readyz use it too.
    store_deadline_s: float | None = None
    _catch_up: asyncio.Task[list[str]] | None = field(default=None, init=False, repr=False)
    _supervisor: BackgroundTask | None = field(default=None, init=False, repr=False)
    _unbound: Callable[[], None] | None = field(default=None, init=False, repr=False)

    @classmethod
    def build(
        cls,
        settings: Settings,
        engine: Engine,
        store: Store | None = None,
        evolver: Evolver | None = None,
        engine_token: str | None = None,
    ) -> Services:
        """Every part, built and wired, none started. The engine is constructed (not started)
        by the caller."""
        store = store or open_store(settings.database_url)
        deadline = for_store(store, settings.store.deadline_s)
        artifacts = artifacts_for(settings)
        cache = settings.server.state_dir / "cache"
        variants = None
        if isinstance(engine, Deployable):
            variants = Variants(engine, store, artifacts, cache, store_deadline_s=deadline)
        telemetry = telemetry_for(settings.telemetry)
        committer, metrics = _committer_and_metrics(settings, store, telemetry, deadline)
        harnesses = HarnessCache(artifacts, cache)
        rollouts = Rollouts(store, settings.rollout, store_deadline_s=deadline)
        admission = _admission(settings, metrics)
        serving = Serving(
            engine,
            store,
            committer,
            max_tokens_cap=settings.server.max_tokens_cap,
            variants=variants,
            harnesses=harnesses,
            limits=Limits.from_settings(settings),
            rollouts=rollouts,
            shadows=_shadows(settings, store, metrics),
            admission=admission,
            sampling_of=functools.partial(scenario_sampling, settings, store),
            store_deadline_s=deadline,
        )
        local = LocalEngine(engine, serving, variants)
        # Rollbacks, promotes and harness releases through this process reach every engine
        # that serves the scenarios (engine.fleet.admin_urls, engine.fleet.registry): this one in
        # process, the others over HTTP.
        engines = engines_for(settings, (settings.server_url, local), store)
        chain = ReleaseChain(settings, store, artifacts, engines, harnesses)
        readiness = ReadinessCollector(
            store, settings, artifacts, scenario_labels=settings.server.scenario_labels
        )
        metrics.registry.register(readiness)
        quotas = QuotaGate(
            settings.auth.tokens, store.quotas, metrics.registry, store_deadline_s=deadline
        )
        metrics.registry.register(QuotaCollector(quotas))
        return cls(
            settings=settings,
            engine=engine,
            store=store,
            committer=committer,
            serving=serving,
            auth=Authenticator(settings.auth.tokens, engine_token),
            metrics=metrics,
            artifacts=artifacts,
            chain=chain,
            local=local,
            engines=engines,
            readiness=readiness,
            quotas=quotas,
            watcher=rollout_watcher(chain, rollouts, settings.rollout.check_interval_s),
            cleaner=Cleaner(store, settings, artifacts),
            dependencies=Dependencies(
                store, engine, artifacts, settings.tracking_uri, evolver, admission, deadline
            ),
            heartbeat=_heartbeat(settings, store),
            variants=variants,
            evolver=evolver,
            telemetry=telemetry,
            deliverer=events.deliverer(store, settings.events),
            store_deadline_s=deadline,
        )

    async def start(self) -> None:
        """Start every part, in order: the store's schema, the group committer, the engine,
        the heads deployed while this process was down, the registry entry, the evolve
        worker, then the background tasks."""
        await asyncio.to_thread(self.store.migrate)
        self.local.bind(asyncio.get_running_loop())
        self.telemetry.start()
        await self.committer.start()
        await self.engine.start()
        if self.variants is not None:  # loaded now, not by a first call
            self._catch_up = asyncio.create_task(self.variants.catch_up())
        if self.heartbeat is not None:  # deploys made anywhere reach this engine from now on
            await asyncio.to_thread(self.heartbeat.start)
        if self.evolver is not None:
            self.evolver.start()
            # a worker that died is started again (api.evolver): learning needs nobody
            self._supervisor = BackgroundTask(
                "worker-supervisor", self.evolver.revive, every_s=WORKER_CHECK_S
            )
            self._supervisor.start()
        # After the worker started (it inherits the environment): its training runs upload
        # to MLflow without this process's bounds.
        tracking = self.settings.tracking
        self._unbound = bound_http_requests(tracking.http_timeout_s, tracking.http_retries)
        if self.serving.shadows is not None:
            self.serving.shadows.start()
        self.watcher.start()
        self.cleaner.start()
        self.readiness.start()
        self.quotas.start()
        if self.deliverer is not None:
            self.deliverer.start()
        # Everything loaded so far (framework, engine, model) lives as long as the process:
        # move it out of the collector's sight. Measured: full collections scanning it were
        # the 75 ms p99 at 16 connections (10 ms frozen), and cost ~15% of throughput.
        gc.freeze()
        log.info(
            "reef ready: engine=%s models=%s", self.engine.kind, ", ".join(self.engine.models())
        )

    async def stop(self) -> None:
        """Stop every part, in order: the background tasks, the registry entry (deploys stop
        coming here), the shadow copies in flight (stored, not lost), the evolve worker, the
        group committer (what is pending is flushed before anything goes away), the engine,
        the other engines' clients, the store."""
        await asyncio.to_thread(self.readiness.stop)
        await asyncio.to_thread(self.watcher.stop)
        await asyncio.to_thread(self.quotas.stop)  # what it counted reaches the database
        if self.deliverer is not None:
            await asyncio.to_thread(self.deliverer.stop)
        await asyncio.to_thread(self.cleaner.stop)  # what is still queued is for `reef gc`
        if self._catch_up is not None:
            self._catch_up.cancel()
        if self.heartbeat is not None:
            await asyncio.to_thread(self.heartbeat.stop)
        if self.serving.shadows is not None:
            await self.serving.shadows.drain()
            await asyncio.to_thread(self.serving.shadows.stop)
        if self._supervisor is not None:
            await asyncio.to_thread(self._supervisor.stop)
        if self.evolver is not None:
            await asyncio.to_thread(self.evolver.stop)
        await self.committer.aclose()
        await asyncio.to_thread(self.telemetry.stop)  # what the last commits handed over too
        await self.engine.aclose()
        if isinstance(self.engines, Fleet):
            self.engines.close()  # its HTTP clients of the other engines
        self.store.close()
        if self._unbound is not None:
            self._unbound()
        log.info("reef stopped")

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


def _committer_and_metrics(
    settings: Settings, store: Store, telemetry: Telemetry, deadline_s: float | None
) -> tuple[GroupCommitter, Metrics]:
    """The group committer (handing committed records to the span export when it is on) and
    the metrics (with the export's counters then)."""
    committer = GroupCommitter(
        store,
        window_ms=settings.store.commit_window_ms,
        max_batch=settings.store.commit_max_batch,
        committed=telemetry.records if telemetry.enabled else None,
        deadline_s=deadline_s,
    )
    metrics = Metrics(scenario_labels=settings.server.scenario_labels)
    if telemetry.enabled:
        metrics.registry.register(TelemetryCollector(telemetry))
    return committer, metrics


def _shadows(settings: Settings, store: Store, metrics: Metrics) -> Shadows:
    """Shadow rollouts' copies of calls, each outcome counted in /metrics."""
    return Shadows(
        store,
        settings.rollout,
        gate_scorer=settings.gate.scorer,
        judging=settings.judge,
        on_outcome=lambda scenario, outcome: metrics.shadow.labels(scenario, outcome).inc(),
    )


def _admission(settings: Settings, metrics: Metrics) -> Admission:
    """The engine's running slots and bounded line (engine.max_running, max_queue,
    max_queue_wait_s), shown in /metrics."""
    engine = settings.engine
    admission = Admission(engine.running_limit(), engine.max_queue, engine.max_queue_wait_s)
    metrics.registry.register(AdmissionCollector(admission))
    return admission


def _heartbeat(settings: Settings, store: Store) -> BackgroundTask | None:
    """The engine registry's entry (engine.fleet.registry: deploys made anywhere reach this
    engine), or None."""
    if not settings.engine.fleet.registry:
        return None
    own = settings.engine_advertise_url
    return registration.heartbeat(store, own, settings.engine.fleet.heartbeat_s)


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
