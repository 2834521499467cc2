"""A serving process's entry in the engine registry (engine.fleet.registry): deploys made anywhere
(a worker's, another replica's rollback) reach every engine whose heartbeat is fresh
(deploy.engine.Registered), so replicas join a fleet by starting, and leave it by stopping
(a clean shutdown) or by going silent for engine.fleet.registry_ttl_s (a crash)."""

from __future__ import annotations

import logging

from reef.background import BackgroundTask
from reef.store.engines import EngineStore

log = logging.getLogger("reef.api")


def heartbeat(store: EngineStore, url: str, every_s: float) -> BackgroundTask:
    """The registry entry of the engine at `url` as a background task: `start()` enters the
    registry as just started (before the process says it is ready; an error there fails the
    start), the task renews the entry every `every_s`, and `stop()` leaves the registry. A
    renewal that fails is logged: the entry stays live until engine.fleet.registry_ttl_s."""

    def enter() -> None:
        store.register_engine(url, started=True)
        log.info("engine registered for deploys at %s", url)

    def renew() -> None:
        try:
            store.register_engine(url)
        except Exception as e:
            log.warning("engine heartbeat for %s failed: %s", url, e)

    def leave() -> None:
        try:
            store.unregister_engine(url)
        except Exception as e:  # it drops out of deploys after the TTL anyway
            log.warning("unregistering engine %s failed: %s", url, e)

    return BackgroundTask("engine-heartbeat", renew, every_s=every_s, first=enter, last=leave)
