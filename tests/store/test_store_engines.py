"""The engine registry (engine.fleet.registry): replicas' heartbeats, on both backends."""

from __future__ import annotations

import time

from reef.store.sql import SQLStore


def test_live_engines_are_those_heard_from_within_the_ttl(store: SQLStore) -> None:
    assert store.live_engines(30) == []
    store.register_engine("http://b:8900", started=True)
    store.register_engine("http://a:8900", started=True)
    store.register_engine("http://a:8900")  # a heartbeat renews, never duplicates
    assert store.live_engines(30) == ["http://a:8900", "http://b:8900"]
    time.sleep(0.3)
    store.register_engine("http://b:8900")
    assert store.live_engines(0.2) == ["http://b:8900"]  # a went silent
    store.unregister_engine("http://b:8900")
    store.unregister_engine("http://nobody:1")  # no-op
    assert store.live_engines(30) == ["http://a:8900"]
