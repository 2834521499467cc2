"""Quotas per token (auth.tokens[].quota and .scenario_quotas): requests and tokens a minute
and tokens a UTC day, over all the token's scenarios and per scenario, counted in the database
so that every replica enforces the same numbers (reef.store.quotas).

An inference call is admitted before it is served (one statement counts the request on every
counter that applies, or on none and the call gets a 429 with Retry-After); its prompt and
completion tokens are added once its record is written. Tokens are known only after the
answer, so a call admitted just under a token limit may overshoot it by its own size; the next
call is refused until the window ends, as with OpenAI's and LiteLLM's token limits.

A call whose counters are far from their limits is counted in process and reaches the
database with the next sync, 50 ms later (reef.quota_ledger: what that costs in exactness,
and why); near a limit, every call is admitted by the database itself.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import anyio
from prometheus_client import Counter as PromCounter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from reef.background import BackgroundTask
from reef.errors import RateLimited, ReefError
from reef.quota_ledger import SYNC_EVERY_S, QuotaLedger
from reef.settings import QuotaSettings, TokenSettings
from reef.store.deadline import bounded, within
from reef.store.quotas import DAY, MINUTE, WAIT, Counter, Quotas, Refusal, counter_key

log = logging.getLogger("reef.api")

_HELD = 10_000  # calls in flight whose tokens are still to count, per process
# (setting, window, which count) for each limit a QuotaSettings holds
_LIMITS = (
    ("requests_per_minute", MINUTE, "requests"),
    ("tokens_per_minute", MINUTE, "tokens"),
    ("tokens_per_day", DAY, "tokens"),
)


def _counters(subject: str, quota: QuotaSettings | None) -> list[Counter]:
    if quota is None or not quota.limited:
        return []
    out = []
    if quota.requests_per_minute or quota.tokens_per_minute:
        minute = counter_key(subject, MINUTE)
        out.append(Counter(minute, MINUTE, quota.requests_per_minute, quota.tokens_per_minute))
    if quota.tokens_per_day:
        out.append(Counter(counter_key(subject, DAY), DAY, None, quota.tokens_per_day))
    return out


def _spent(usage: dict[str, Any] | None) -> int:
    if not usage:
        return 0
    prompt = usage.get("prompt_tokens") or usage.get("input_tokens") or 0
    completion = usage.get("completion_tokens") or usage.get("output_tokens") or 0
    return int(prompt) + int(completion)


class QuotaGate:
    """Admits calls against their token's quotas and counts what they spent."""

    def __init__(
        self,
        tokens: tuple[TokenSettings, ...],
        quotas: Quotas,
        registry: CollectorRegistry,
        *,
        store_deadline_s: float | None = None,
    ):
        # How long a count in the database may wait for it (store.deadline_s; reef.store.deadline)
        self.store_deadline_s = store_deadline_s
        self.tokens = {
            t.name: t
            for t in tokens
            if t.quota.limited or any(q.limited for q in t.scenario_quotas.values())
        }
        self.quotas = quotas
        self.refusals = PromCounter(
            "reef_quota_refusals_total",
            "Calls refused with 429 because a token's quota was spent, by token and limit",
            ["token", "limit"],
            registry=registry,
        )
        admissions = PromCounter(
            "reef_quota_admissions_total",
            "Calls admitted against a token's quotas, by where they were counted: in process "
            "(far from every limit; synced to the database in batches) or in the database",
            ["counted"],
            registry=registry,
        )
        self._in_process = admissions.labels("process")
        self._in_database = admissions.labels("database")
        self._counters: dict[tuple[str, str], list[Counter]] = {}
        self._held: OrderedDict[str, list[Counter]] = OrderedDict()
        self._spending: set[asyncio.Future[None]] = set()
        self.ledger = QuotaLedger(quotas)
        self._sync = BackgroundTask(
            "quota-sync", self.ledger.sync, every_s=SYNC_EVERY_S, last=self.ledger.sync
        )

    def start(self) -> None:
        """Sync the ledger with the database in the background (only tokens with quotas
        need it)."""
        if self.tokens:
            self._sync.start()

    def stop(self) -> None:
        """Stop syncing, after a last sync of what is counted here."""
        self._sync.stop()

    def counters(self, token: str, scenario: str) -> list[Counter]:
        """The counters a call of `token` in `scenario` counts on ([] when it has no quota)."""
        t = self.tokens.get(token)
        if t is None:
            return []
        found = self._counters.get((token, scenario))
        if found is None:
            found = _counters(f"token/{token}", t.quota) + _counters(
                f"token/{token}/scenario/{scenario}", t.scenario_quotas.get(scenario)
            )
            if len(self._counters) >= _HELD:  # scenarios are named by callers: keep it bounded
                self._counters.clear()
            self._counters[(token, scenario)] = found
        return found

    async def admit(self, token: str, scenario: str) -> list[Counter]:
        """Count the call, or raise RateLimited (429) when a quota of it is spent. On the event
        loop where the database answers at once, else in a worker thread."""
        counters = self.counters(token, scenario)
        if not counters:
            return counters
        if self.ledger.admit(counters):
            self._in_process.inc()
            return counters
        now = self.quotas.admit_now(counters)  # SQLite, its lock free: ~12 us, no hop
        refusal = (
            await bounded(
                self.store_deadline_s, self.quotas.admit, counters, run=anyio.to_thread.run_sync
            )
            if now == WAIT
            else now
        )
        if not isinstance(refusal, Refusal):
            self.ledger.admitted(counters)
            self._in_database.inc()
            return counters
        c = refusal.counter
        limit = "tokens_per_day" if c.window_s == DAY else f"{refusal.count}_per_minute"
        value = c.max_requests if refusal.count == "requests" else c.max_tokens
        where = f" in scenario '{scenario}'" if "/scenario/" in c.key else ""
        self.refusals.labels(token, limit).inc()
        raise RateLimited(
            f"quota of token '{token}'{where} reached: {limit} {value}; "
            f"try again in {refusal.retry_after_s}s",
            retry_after_s=refusal.retry_after_s,
            type=refusal.count,
            code="insufficient_quota" if c.window_s == DAY else None,
        )

    def hold(self, record_id: str, counters: list[Counter]) -> None:
        """Keep the call's counters until its record is written (then `spend`)."""
        if counters:
            self._held[record_id] = counters
            while len(self._held) > _HELD:  # calls that failed before their record
                self._held.popitem(last=False)

    def spend(self, record_id: str, usage: dict[str, Any] | None) -> None:
        """Count the call's tokens: at once where the database answers at once, else in the
        background (the answer does not wait for it)."""
        counters = self._held.pop(record_id, None)
        tokens = _spent(usage)
        if not counters or not tokens or self.ledger.spend(counters, tokens):
            return
        try:
            if self.quotas.spend_now(counters, tokens) != WAIT:
                self.ledger.spent(counters, tokens)
                return
        except ReefError as e:
            log.error("counting %d tokens against quotas failed: %s", tokens, e.message)
            return
        future = asyncio.get_running_loop().run_in_executor(None, self._spend, counters, tokens)
        self._spending.add(future)
        future.add_done_callback(self._spending.discard)

    def _spend(self, counters: list[Counter], tokens: int) -> None:
        try:
            within(self.store_deadline_s, self.quotas.spend, counters, tokens)
            self.ledger.spent(counters, tokens)
        except Exception as e:  # a lost count must not fail an answer already sent
            log.error("counting %d tokens against quotas failed: %s", tokens, e)

    def usage(self, now: float | None = None) -> list[dict[str, Any]]:
        """Every configured limit with what its current window used: rows of token, scope
        (a scenario, or "all"), limit, used, max, window_s."""
        now = time.time() if now is None else now
        rows = []
        for name, t in self.tokens.items():
            scopes = [("all", f"token/{name}", t.quota)] + [
                (s, f"token/{name}/scenario/{s}", q) for s, q in t.scenario_quotas.items()
            ]
            for scope, subject, quota in scopes:
                for setting, window, count in _LIMITS:
                    limit = getattr(quota, setting)
                    if limit is not None:
                        key = counter_key(subject, window)
                        rows.append(
                            {
                                "token": name,
                                "scope": scope,
                                "limit": setting,
                                "max": limit,
                                "key": key,
                                "count": count,
                                "window_s": window,
                            }
                        )
        used = {(u.key): u for u in self.quotas.usage(sorted({r["key"] for r in rows}), now)}
        for r in rows:
            u = used.get(r["key"])
            r["used"] = 0 if u is None else (u.requests if r["count"] == "requests" else u.tokens)
        return rows


class QuotaCollector(Collector):
    """Each limit's use in its current window, as gauges in /metrics. A scrape never waits
    for the database (the event loop renders /metrics): it serves the last numbers read and,
    when they are older than `interval_s`, starts one background read."""

    def __init__(self, gate: QuotaGate, interval_s: float = 5.0):
        self.gate = gate
        self.interval_s = interval_s
        self._rows: list[dict[str, Any]] = []
        self._read_at = 0.0
        self._lock = threading.Lock()
        self._reading = False

    def _refresh(self) -> None:
        try:
            rows = self.gate.usage()
        except Exception as e:
            log.warning("reading quota counters for /metrics failed: %s", e)
            rows = self._rows
        with self._lock:
            self._rows, self._read_at, self._reading = rows, time.monotonic(), False

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if not self.gate.tokens:
            return
        with self._lock:
            stale = time.monotonic() - self._read_at > self.interval_s and not self._reading
            if stale:
                self._reading = True
            rows = self._rows
        if stale:
            threading.Thread(target=self._refresh, daemon=True, name="reef-quota-metrics").start()
        labels = ["token", "scope", "limit"]
        used = GaugeMetricFamily(
            "reef_quota_used", "Use of a token's quota in its current window", labels=labels
        )
        limit = GaugeMetricFamily("reef_quota_limit", "A token's quota (the limit)", labels=labels)
        for r in rows:
            used.add_metric([r["token"], r["scope"], r["limit"]], r["used"])
            limit.add_metric([r["token"], r["scope"], r["limit"]], r["max"])
        yield used
        yield limit
