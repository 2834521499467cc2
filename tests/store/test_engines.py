"""EngineStore's contract on both backends: the engine.fleet.registry (engine.registry), replicas'
heartbeats."""

from __future__ import annotations

import time

from reef.store.engines import EngineStore
from reef.store.sql import SQLStore


def test_live_engines_are_those_heard_from_within_the_ttl(
    engine_store: EngineStore, store: SQLStore
) -> None:
    assert engine_store.live_engines(30) == []
    engine_store.register_engine("http://b:8900", started=True)
    engine_store.register_engine("http://a:8900", started=True)
    engine_store.register_engine("http://a:8900")  # a heartbeat renews, never duplicates
    assert engine_store.live_engines(30) == ["http://a:8900", "http://b:8900"]
    time.sleep(0.3)
    engine_store.register_engine("http://b:8900")
    assert engine_store.live_engines(0.2) == ["http://b:8900"]  # a went silent
    engine_store.unregister_engine("http://b:8900")
    engine_store.unregister_engine("http://nobody:1")  # no-op
    assert engine_store.live_engines(30) == ["http://a:8900"]
