"""What /readyz reports: each dependency of a serving process and its state.

Needed to serve, a failure makes the process not ready (503): the store (every call is
recorded) and the engine. An engine whose line is full or nearly (reef.admission: calls beyond
engine.max_queue are answered 429) is "busy": the process is degraded (200), still serving. Needed only to learn, a failure leaves it ready but degraded (200):
the artifact store, MLflow and the evolve worker; calls are served and recorded meanwhile, and
evolve runs, deploys and clean-ups fail with their own errors until it is back.

The learning checks run at most every LEARN_CACHE_S, concurrently, each bounded by
CHECK_TIMEOUT_S: probes and floods of /readyz never queue on a slow S3 or MLflow. An answer
names each state and a short reason; the full error goes to the log when a state changes (the
route is open: no URL or error text of an internal host in the answer).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from reef.admission import Admission
from reef.api.evolver import Evolver
from reef.artifacts import ArtifactStore
from reef.engines.base import Engine
from reef.errors import StoreTimeout
from reef.registry.clients import ping_tracking
from reef.store.base import Store
from reef.store.deadline import bounded

log = logging.getLogger("reef.api")

CHECK_TIMEOUT_S = 2.0
LEARN_CACHE_S = 5.0


@dataclass(frozen=True)
class State:
    # ok | busy (serving, its line full or nearly) | unavailable | off (not configured) |
    # unchecked (a kind not checked)
    state: str
    needed: str  # serve | learn
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state, "needed_to": self.needed}
        if self.reason is not None:
            out["reason"] = self.reason
        return out


class Dependencies:
    """The states /readyz reports, and its status: not_ready (503) when the store or the engine
    is down, degraded (200) when the engine is busy or something needed only to learn is down,
    else ready (200)."""

    def __init__(
        self,
        store: Store,
        engine: Engine,
        artifacts: ArtifactStore,
        tracking_uri: str,
        evolver: Evolver | None,
        admission: Admission | None = None,
        store_deadline_s: float | None = None,
    ):
        self.admission = admission
        # The store's check waits this long at most (store.deadline_s; reef.store.deadline),
        # and concurrent probes share the one in flight: a flood of /readyz on a database
        # that never answers holds one thread, not one each.
        self.store_deadline_s = store_deadline_s
        self._store_check: asyncio.Task[State] | None = None
        self.store = store
        self.engine = engine
        self.artifacts = artifacts
        self.tracking_uri = tracking_uri
        self.evolver = evolver
        self._learn: dict[str, State] = {}
        self._learn_at = -LEARN_CACHE_S
        self._learn_check: asyncio.Task[dict[str, State]] | None = None
        self._logged: dict[str, str] = {}

    async def report(self) -> tuple[int, dict[str, Any]]:
        store, engine_ok, learn = await asyncio.gather(
            self._store(), self.engine.ready(), self._learning()
        )
        store_ok = store.state == "ok"
        engine = self._engine(engine_ok)
        states = {"store": store, "engine": engine, **learn}
        if not (store_ok and engine_ok):
            status = "not_ready"
        elif engine.state == "busy" or any(s.state == "unavailable" for s in learn.values()):
            status = "degraded"
        else:
            status = "ready"
        body = {"status": status, "dependencies": {k: s.as_dict() for k, s in states.items()}}
        return (503 if status == "not_ready" else 200), body

    async def _store(self) -> State:
        if self._store_check is None or self._store_check.done():
            self._store_check = asyncio.ensure_future(self._check_store())
        return await asyncio.shield(self._store_check)

    async def _check_store(self) -> State:
        started = time.monotonic()
        try:
            ok = await bounded(self.store_deadline_s, self.store.ping)
        except StoreTimeout:
            ok = False
        if ok:
            return State("ok", "serve")
        limit = self.store_deadline_s
        if limit is not None and time.monotonic() - started >= limit:
            return State("unavailable", "serve", f"no answer within {limit:g} s")
        return State("unavailable", "serve")

    def _engine(self, up: bool) -> State:
        """The engine's state: unavailable, busy (its line full or nearly), or ok."""
        if not up:
            return State("unavailable", "serve")
        load = self.admission.load() if self.admission is not None else None
        if load is None or not load.busy:
            return self._noted("engine", "ok", needed="serve")
        reason = (
            f"{load.running} calls running, {load.waiting} of {load.max_queue} waiting: "
            "calls beyond are answered 429"
        )
        return self._noted("engine", "busy", reason, needed="serve")

    async def _learning(self) -> dict[str, State]:
        if time.monotonic() - self._learn_at < LEARN_CACHE_S:
            return self._learn
        if self._learn_check is None:  # concurrent callers share one check
            self._learn_check = asyncio.ensure_future(self._check_learning())
        try:
            return await asyncio.shield(self._learn_check)
        finally:
            if self._learn_check is not None and self._learn_check.done():
                self._learn_check = None

    async def _check_learning(self) -> dict[str, State]:
        artifacts, mlflow = await asyncio.gather(
            self._bounded("artifact_store", self.artifacts.ping),
            self._bounded("mlflow", lambda: ping_tracking(self.tracking_uri, CHECK_TIMEOUT_S)),
        )
        self._learn = {"artifact_store": artifacts, "mlflow": mlflow, "worker": self._worker()}
        self._learn_at = time.monotonic()
        return self._learn

    async def _bounded(self, name: str, check: Callable[[], object]) -> State:
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                checked = await asyncio.to_thread(check)
        except TimeoutError:
            return self._noted(name, "unavailable", f"no answer within {CHECK_TIMEOUT_S:g} s")
        except Exception as e:
            return self._noted(name, "unavailable", "unreachable", f"{type(e).__name__}: {e}")
        return self._noted(name, "unchecked" if checked is False else "ok")

    def _worker(self) -> State:
        if self.evolver is None:
            return State("off", "learn")
        code = self.evolver.exit_code()
        if code is None:
            return self._noted("worker", "ok")
        return self._noted("worker", "unavailable", f"exited with code {code}")

    def _noted(
        self,
        name: str,
        state: str,
        reason: str | None = None,
        error: str = "",
        needed: str = "learn",
    ) -> State:
        """The state, logged when it turns unavailable or busy, or back."""
        was = self._logged.get(name, "ok")
        if state in ("unavailable", "busy") and was != state:
            log.warning("readiness: %s is %s: %s", name, state, error or reason)
        elif was in ("unavailable", "busy") and state not in ("unavailable", "busy"):
            log.info("readiness: %s is back", name)
        self._logged[name] = state
        return State(state, needed, reason)
