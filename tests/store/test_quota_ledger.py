"""The quota ledger: calls far from their limits are counted in process and synced to the
database in batches; near a limit (or before the first sync) the database admits each call
itself, so refusals stay exact. Real stores on SQLite and Postgres."""

from __future__ import annotations

import threading

from sqlalchemy import text

from reef.quota_ledger import QuotaLedger
from reef.store.quotas import DAY, MINUTE, Counter, Delta, counter_key, quota_counters
from reef.store.sql import SQLStore, open_store

NOW = 1_800_000_030.0  # 30 s into a minute


def _rpm(limit: int | None = None, tokens: int | None = None) -> Counter:
    return Counter(counter_key("token/app", MINUTE), MINUTE, limit, tokens)


def _used(store: SQLStore, c: Counter, now: float = NOW) -> tuple[int, int]:
    rows = store.quotas.usage([c.key], now)
    return (rows[0].requests, rows[0].tokens) if rows else (0, 0)


def test_add_counts_unconditionally_and_returns_the_totals(store: SQLStore) -> None:
    c = _rpm(1)
    start = c.window(NOW)
    [first] = store.quotas.add([Delta(c.key, start, 3, 40)])
    assert (first.requests, first.tokens) == (3, 40)  # over the limit: add never refuses
    [second] = store.quotas.add([Delta(c.key, start, 0, 2)])
    assert (second.key, second.window_start, second.requests, second.tokens) == (
        c.key,
        start,
        3,
        42,
    )
    assert store.quotas.add([]) == []


def test_a_counter_far_from_its_limit_is_counted_here_until_the_sync(store: SQLStore) -> None:
    c = _rpm(1000, 1_000_000)
    ledger = QuotaLedger(store.quotas)
    assert not ledger.admit([c], NOW)  # never read: the exact path first
    store.quotas.admit([c], NOW)
    ledger.admitted([c], NOW)
    ledger.sync(NOW)
    for _ in range(5):
        assert ledger.admit([c], NOW + 0.01)
    assert ledger.spend([c], 70, NOW + 0.01)
    assert _used(store, c) == (1, 0)  # nothing written on the calls' way
    assert ledger.pending() == 5 + 70
    ledger.sync(NOW + 0.02)
    assert _used(store, c) == (6, 70) and ledger.pending() == 0


def test_at_most_a_share_of_what_remains_is_pending_here(store: SQLStore) -> None:
    c = _rpm(80)  # 1/8 of 80 remaining: 10 calls at most between two syncs
    ledger = QuotaLedger(store.quotas)
    ledger.admit([c], NOW)
    ledger.sync(NOW)
    assert [ledger.admit([c], NOW) for _ in range(11)] == [True] * 10 + [False]
    ledger.sync(NOW)  # 10 of 80 counted: 70 remain, 8 more may be pending
    assert [ledger.admit([c], NOW) for _ in range(9)] == [True] * 8 + [False]


def test_small_limits_are_always_the_databases_word(store: SQLStore) -> None:
    c = _rpm(3)
    ledger = QuotaLedger(store.quotas)
    ledger.admit([c], NOW)
    ledger.sync(NOW)
    assert not ledger.admit([c], NOW)  # 3 / 8 < 1: no call is counted here
    budget = Counter(counter_key("token/app", DAY), DAY, None, 5)
    ledger.admit([budget], NOW)
    ledger.sync(NOW)
    assert not ledger.spend([budget], 1, NOW)


def test_a_stale_view_or_a_new_window_takes_the_exact_path(store: SQLStore) -> None:
    c = _rpm(1000)
    ledger = QuotaLedger(store.quotas, stale_s=1.0)
    ledger.admit([c], NOW)
    ledger.sync(NOW)
    assert ledger.admit([c], NOW + 0.5)
    assert not ledger.admit([c], NOW + 1.5)  # no sync for 1.5 s
    ledger.sync(NOW + 31)  # the next minute: its row is new
    assert not ledger.admit([c], NOW + 31)
    ledger.sync(NOW + 31.1)  # the ended window's pending call reached the database
    assert _used(store, c, NOW) == (1, 0) and ledger.admit([c], NOW + 31.2)


def test_a_failed_sync_keeps_what_is_pending(store: SQLStore) -> None:
    c = _rpm(1000)
    ledger = QuotaLedger(store.quotas)
    ledger.admit([c], NOW)
    ledger.sync(NOW)
    assert ledger.admit([c], NOW) and ledger.spend([c], 9, NOW)
    with store.engine.begin() as conn:
        conn.execute(text("DROP TABLE quota_counters"))
    ledger.sync(NOW)  # logged, not raised
    assert ledger.pending() == 1 + 9
    quota_counters.create(store.engine)
    ledger.sync(NOW)
    assert ledger.pending() == 0 and _used(store, c) == (1, 9)


def test_replicas_overshoot_a_limit_by_at_most_their_shares(
    store: SQLStore, database_url: str
) -> None:
    """Two replicas, each 600 calls as fast as they go against one limit of 400 with syncs
    every 5 ms: the database refuses once it counts 400, and what both held pending then is
    the most it is overshot by (2 x 1/8 of what remained at their last syncs)."""
    c = _rpm(400)
    replicas = [open_store(database_url) for _ in range(2)]
    admitted = [0, 0]
    done = threading.Event()

    def calls(i: int, s: SQLStore, ledger: QuotaLedger) -> None:
        for _ in range(600):
            if ledger.admit([c], NOW) or s.quotas.admit([c], NOW) is None:
                admitted[i] += 1

    def syncs(ledger: QuotaLedger) -> None:
        while not done.wait(0.005):
            ledger.sync(NOW)

    ledgers = [QuotaLedger(s.quotas) for s in replicas]
    callers = [
        threading.Thread(target=calls, args=(i, s, ledgers[i])) for i, s in enumerate(replicas)
    ]
    syncers = [threading.Thread(target=syncs, args=(ledger,)) for ledger in ledgers]
    for t in syncers + callers:
        t.start()
    for t in callers:
        t.join()
    done.set()
    for t in syncers:
        t.join()
    for ledger in ledgers:
        ledger.sync(NOW)
    for s in replicas:
        s.close()
    total = sum(admitted)
    assert _used(store, c)[0] == total  # every admitted call is counted, once
    assert 400 <= total <= 400 + 2 * 400 // 8
