"""Deleting a scenario leaves a tombstone in the same transaction (the commit point of the
deletion); while it is there the name cannot be used again. On every backend."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from reef.errors import Conflict, NotFound
from reef.records import Record
from reef.store.sql import SQLStore

MakeRecord = Callable[..., Record]


def test_deleting_leaves_a_tombstone_that_holds_the_name(
    store: SQLStore, make_record: MakeRecord
) -> None:
    base = store.ensure_scenario("gone").head_release_id
    store.ensure_scenario("kept")
    store.add_records([make_record("gone", base)])
    assert store.pending_deletions() == []

    store.delete_scenario("gone")
    (tomb,) = store.pending_deletions()
    assert tomb.scenario == "gone" and tomb.deleted_at.tzinfo is not None
    with pytest.raises(NotFound):
        store.get_scenario("gone")
    with pytest.raises(NotFound):
        store.delete_scenario("gone")  # twice: not found, and the tombstone stays as it was
    assert store.pending_deletions() == [tomb]

    for create in (store.ensure_scenario, store.create_scenario):
        with pytest.raises(Conflict) as e:
            create("gone")
        assert e.value.code == "scenario_deleting"
    assert [s.name for s in store.list_scenarios()] == ["kept"]

    store.finish_deletion("gone")
    store.finish_deletion("gone")  # idempotent
    assert store.pending_deletions() == []
    again = store.ensure_scenario("gone")
    assert store.list_records("gone") == [] and len(store.list_releases("gone")) == 1
    assert again.head_release_id != base


def test_pending_deletions_oldest_first(store: SQLStore) -> None:
    for name in ("b", "a", "c"):
        store.ensure_scenario(name)
        store.delete_scenario(name)
    assert [d.scenario for d in store.pending_deletions()] == ["b", "a", "c"]
