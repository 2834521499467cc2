"""Quota counters on SQLite and Postgres: fixed windows, all-or-nothing admission, counts that
several stores (replicas) on one database share."""

from __future__ import annotations

import threading
import time

from reef.store.quotas import DAY, MINUTE, WAIT, Counter, counter_key
from reef.store.sql import SQLStore, open_store

NOW = 1_800_000_030.0  # 30 s into a minute


def test_requests_per_minute_refuse_until_the_window_ends(store: SQLStore) -> None:
    rpm = Counter(counter_key("token/app", MINUTE), MINUTE, max_requests=2)
    quotas = store.quotas
    assert quotas.admit([rpm], NOW) is None
    assert quotas.admit([rpm], NOW + 1) is None
    refusal = quotas.admit([rpm], NOW + 2)
    assert refusal is not None and refusal.count == "requests"
    assert refusal.retry_after_s == 28 and refusal.counter == rpm
    assert quotas.admit([rpm], NOW + 30) is None  # the next minute
    [usage] = quotas.usage([rpm.key], NOW + 30)
    assert usage.requests == 1


def test_a_refused_call_counts_on_no_counter(store: SQLStore) -> None:
    loose = Counter(counter_key("token/app", MINUTE), MINUTE, max_requests=100)
    tight = Counter(counter_key("token/app/scenario/s", MINUTE), MINUTE, max_requests=1)
    assert store.quotas.admit([loose, tight], NOW) is None
    assert store.quotas.admit([loose, tight], NOW) is not None
    usage = {u.key: u.requests for u in store.quotas.usage([loose.key, tight.key], NOW)}
    assert usage == {loose.key: 1, tight.key: 1}


def test_tokens_count_after_the_answer_against_minute_and_day(store: SQLStore) -> None:
    tpm = Counter(counter_key("token/app", MINUTE), MINUTE, max_tokens=100)
    budget = Counter(counter_key("token/app", DAY), DAY, max_tokens=150)
    both = [tpm, budget]
    assert store.quotas.admit(both, NOW) is None
    store.quotas.spend(both, 100, NOW)
    refusal = store.quotas.admit(both, NOW + 1)
    assert refusal is not None and refusal.counter == tpm and refusal.count == "tokens"
    assert store.quotas.admit(both, NOW + 60) is None  # a new minute, same day
    store.quotas.spend(both, 60, NOW + 60)
    refusal = store.quotas.admit(both, NOW + 120)
    assert refusal is not None and refusal.counter == budget
    assert refusal.retry_after_s == DAY - int((NOW + 120) % DAY)


def test_replicas_on_one_database_share_the_limit(store: SQLStore, database_url: str) -> None:
    rpm = Counter(counter_key("token/app", MINUTE), MINUTE, max_requests=10)
    replicas = [open_store(database_url) for _ in range(2)]
    admitted: list[bool] = []

    def calls(s: SQLStore) -> None:
        for _ in range(10):
            admitted.append(s.quotas.admit([rpm], NOW) is None)

    threads = [threading.Thread(target=calls, args=(s,)) for s in replicas]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in replicas:
        s.close()
    assert admitted.count(True) == 10 and len(admitted) == 20


def test_admit_now_answers_without_waiting_or_says_wait(store: SQLStore) -> None:
    rpm = Counter(counter_key("token/app", MINUTE), MINUTE, max_requests=1)
    quotas = store.quotas
    if store.engine.dialect.name != "sqlite":  # a network round trip is always a wait
        assert quotas.admit_now([rpm], NOW) == WAIT
        assert quotas.spend_now([rpm], 5, NOW) == WAIT
        return
    assert quotas.admit_now([rpm], NOW) is None
    assert quotas.spend_now([rpm], 5, NOW) is None
    refusal = quotas.admit_now([rpm], NOW)
    assert refusal is not None and refusal != WAIT
    with store.engine.connect() as conn:  # another writer holds the file's lock
        conn.execution_options(reef_write=True)  # BEGIN IMMEDIATE
        tx = conn.begin()
        started = time.monotonic()
        assert quotas.admit_now([rpm], NOW + 60) == WAIT
        assert quotas.spend_now([rpm], 5, NOW + 60) == WAIT
        assert time.monotonic() - started < 0.5
        tx.rollback()
    [usage] = quotas.usage([rpm.key], NOW)
    assert (usage.requests, usage.tokens) == (1, 5)
