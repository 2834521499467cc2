"""The store's contract: one small Protocol per noun, and `Store`, all of them on one database.

Each noun's Protocol lives in its module with its SQL implementation: scenarios
(reef.store.scenarios), records with their Idempotency-Keys (.records), sessions (.sessions), reports with
their references, consumption receipts and score sums (.reports), the release chain and its
candidates (.chain), jobs (.jobs), shadow records (.shadows), the engine registry (.engines),
the outbox of webhook events (.events), the annotation queue (.review), and the database's own life (.database). A caller types against the Protocols it uses;
`Store` is for the few that need most of them. Every backend (SQLite, Postgres) implements
them identically: reef.store.sql.SQLStore.
"""

from __future__ import annotations

from typing import Protocol

from reef.store.chain import ChainStore
from reef.store.database import Lifecycle
from reef.store.engines import EngineStore
from reef.store.events import EventStore
from reef.store.jobs import JobStore
from reef.store.quotas import Quotas
from reef.store.records import RecordStore
from reef.store.reports import ReportStore
from reef.store.review import ReviewStore
from reef.store.scenarios import ScenarioStore
from reef.store.sessions import SessionStore
from reef.store.shadows import ShadowStore

__all__ = [
    "ChainStore",
    "EngineStore",
    "EventStore",
    "JobStore",
    "Lifecycle",
    "RecordStore",
    "ReportStore",
    "ReviewStore",
    "ScenarioStore",
    "SessionStore",
    "ShadowStore",
    "Store",
]


class Store(
    Lifecycle,
    ScenarioStore,
    RecordStore,
    SessionStore,
    ReportStore,
    ChainStore,
    JobStore,
    ShadowStore,
    EngineStore,
    EventStore,
    ReviewStore,
    Protocol,
):
    """Durable home of scenarios, records, reports, release chains and candidates.

    Methods are synchronous and thread-safe; the API calls them from worker threads.
    Every write is committed (durable) before the method returns. Errors are ReefErrors:
    NotFound for a missing scenario/record, Conflict for a clashing id, StoreError when the
    database itself fails.
    """

    @property
    def quotas(self) -> Quotas:
        """Request and token counters per token and scenario, shared by every replica
        (reef.store.quotas: its own connections, outside the nouns' transactions)."""
        ...
