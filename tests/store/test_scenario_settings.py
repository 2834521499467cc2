"""ScenarioStore's run-time settings versions on every backend: appended with a
compare-and-swap on the version, read newest first, gone with the scenario."""

from __future__ import annotations

import pytest

from reef.errors import Conflict, NotFound
from reef.store.sql import SQLStore


def test_versions_append_with_a_compare_and_swap(store: SQLStore) -> None:
    store.ensure_scenario("s")
    assert store.scenario_settings("s") == []
    first = store.set_scenario_settings("s", {"reef": {"batch_size": 4}}, "ops", 0)
    assert (first.version, first.changed_by) == (1, "ops")
    second = store.set_scenario_settings("s", {"gate": {"policy": "manual"}}, "alice", 1)
    with pytest.raises(Conflict, match="changed since version 1"):
        store.set_scenario_settings("s", {"reef": {"batch_size": 9}}, "bob", 1)  # stale read
    got = store.scenario_settings("s")
    assert [v.version for v in got] == [2, 1]
    assert got[0].settings == {"gate": {"policy": "manual"}} and got[0] == second
    assert store.scenario_settings("s", limit=1) == [second]
    with pytest.raises(NotFound):
        store.set_scenario_settings("nope", {}, "ops", 0)

    store.delete_scenario("s")
    store.finish_deletion("s")
    store.ensure_scenario("s")
    assert store.scenario_settings("s") == []  # a new scenario of the name starts clean
