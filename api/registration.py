"""A serving process's entry in the engine registry (engine.fleet.registry): deploys made anywhere
(a worker's, another replica's rollback) reach every engine whose heartbeat is fresh
(deploy.engine.Registered), so replicas join a fleet by starting, and leave it by stopping
(a clean shutdown) or by going silent for engine.fleet.registry_ttl_s (a crash)."""

from __future__ import annotations

import asyncio
import logging

from reef.store.base import Store

log = logging.getLogger("reef.api")


async def register(store: Store, url: str) -> None:
    """Enter the registry as just started (before the process says it is ready)."""
    await asyncio.to_thread(store.register_engine, url, started=True)
    log.info("engine registered for deploys at %s", url)


async def heartbeat(store: Store, url: str, every_s: float) -> None:
    """Renew the entry every `every_s` until cancelled; then leave the registry. A renewal
    that fails is logged: the entry stays live until engine.fleet.registry_ttl_s."""
    try:
        while True:
            await asyncio.sleep(every_s)
            try:
                await asyncio.to_thread(store.register_engine, url)
            except Exception as e:
                log.warning("engine heartbeat for %s failed: %s", url, e)
    finally:
        try:
            await asyncio.to_thread(store.unregister_engine, url)
        except Exception as e:  # it drops out of deploys after the TTL anyway
            log.warning("unregistering engine %s failed: %s", url, e)
