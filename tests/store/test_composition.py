"""The store is its nouns' composition: each noun's Protocol stays small, `Store` is exactly
their union, and `SQLStore` implements every method of it once, from the noun's own class."""

from __future__ import annotations

import inspect

import pytest

from reef.store.base import (
    ChainStore,
    EngineStore,
    EventStore,
    JobStore,
    Lifecycle,
    RecordStore,
    ReportStore,
    ScenarioStore,
    SessionStore,
    ShadowStore,
    Store,
)
from reef.store.chain import SQLChain
from reef.store.database import Database
from reef.store.engines import SQLEngines
from reef.store.events import SQLEvents
from reef.store.jobs import SQLJobs
from reef.store.records import SQLRecords
from reef.store.reports import SQLReports
from reef.store.scenarios import SQLScenarios
from reef.store.sessions import SQLSessions
from reef.store.shadows import SQLShadows
from reef.store.sql import SQLStore

NOUNS: list[tuple[type, type]] = [
    (Lifecycle, Database),
    (ScenarioStore, SQLScenarios),
    (RecordStore, SQLRecords),
    (SessionStore, SQLSessions),
    (ReportStore, SQLReports),
    (ChainStore, SQLChain),
    (JobStore, SQLJobs),
    (ShadowStore, SQLShadows),
    (EngineStore, SQLEngines),
    (EventStore, SQLEvents),
]


def _methods(protocol: type) -> set[str]:
    return {n for n, v in vars(protocol).items() if inspect.isfunction(v) and not n.startswith("_")}


@pytest.mark.parametrize(("protocol", "implementation"), NOUNS, ids=lambda c: c.__name__)
def test_each_noun_is_small_and_implemented_by_its_own_class(
    protocol: type, implementation: type
) -> None:
    methods = _methods(protocol)
    assert 3 <= len(methods) <= 12, sorted(methods)
    for name in methods:
        # defined by the noun's class itself, not left to the Protocol's empty body
        assert name in vars(implementation), f"{implementation.__name__}.{name}"
        assert inspect.signature(getattr(implementation, name)) == inspect.signature(
            getattr(protocol, name)
        ), name


def test_store_is_the_union_of_the_nouns_and_sql_store_has_it_all() -> None:
    nouns = [_methods(protocol) for protocol, _ in NOUNS]
    assert sum(len(m) for m in nouns) == len(set().union(*nouns))  # no method in two nouns
    assert _methods(Store) == set()  # nothing of its own
    everything = set().union(*nouns)
    assert len(everything) == 56
    for name in everything:
        owner = next(c for c in SQLStore.__mro__ if name in vars(c))
        assert not getattr(owner, "_is_protocol", False), f"SQLStore.{name} is a Protocol stub"
