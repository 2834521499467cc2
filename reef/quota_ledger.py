"""A replica's share of the database's quota counters, so that a call far from its limits
writes nothing to the database on its way.

Every call of a token with a quota is counted in the database (reef.store.quotas), so every
replica enforces one limit. Writing each call's admission and token count there on the
answer's path cost two write transactions a call, and on SQLite each one also voids the
other connections' page caches; on Postgres each is a network round trip. The ledger keeps,
per counter row (a key in one window), what the database said at the last sync (`known`) and
what this process counted since (`pending`), and a background task (`sync`, every 50 ms by
default) adds the pending counts to the database in one transaction and reads back the
totals every replica counted.

A call is counted here, without the database, only while each of its counters has room to
spare: at most `share` (1/8) of what remained under the limit at the last sync may be pending
in this process, and the last sync must be recent (`stale_s`). Otherwise (the first call of a
window, a counter near its limit, a sync that failed) the call takes the exact path: an
all-or-nothing admission in the database, as before. So a refusal is always the database's
word, limits of a few calls are exact, and the most a limit can be overshot by is what the
replicas held pending at once: with R replicas, R × share of what remained, and only while
calls arrive faster than the syncs (a limit of 60 a minute from one replica is never
overshot). A process killed before its sync loses at most one interval's counts, which errs
towards admitting, as the counters' unsynced commits already do.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from reef.errors import ReefError
from reef.store.quotas import Counter, Delta, Quotas

log = logging.getLogger(__name__)

SHARE = 1 / 8  # of what remained under a limit at the last sync, pending here at most
STALE_S = 1.0  # a row synced longer ago than this is not counted here
SYNC_EVERY_S = 0.05


@dataclass
class _Row:
    """One counter's row as this process sees it."""

    known_requests: int = 0
    known_tokens: int = 0
    pending_requests: int = 0
    pending_tokens: int = 0
    synced_at: float | None = None  # None: never read; counted here only once it is
    window_end: float = 0.0
    used: bool = True  # by a call since the last sync: read back at the next one


class QuotaLedger:
    """Counts calls in process while their counters have room, and syncs with the database."""

    def __init__(self, quotas: Quotas, share: float = SHARE, stale_s: float = STALE_S):
        if not 0 < share < 1:
            raise ValueError(f"share must be in (0, 1), not {share}")
        self.quotas = quotas
        self.share = share
        self.stale_s = stale_s
        self._rows: dict[tuple[str, int], _Row] = {}
        self._lock = threading.Lock()

    def _row(self, c: Counter, now: float) -> _Row:
        start = c.window(now)
        row = self._rows.get((c.key, start))
        if row is None:  # read at the next sync
            row = self._rows[(c.key, start)] = _Row(window_end=start + c.window_s)
        row.used = True
        return row

    def _fresh(self, row: _Row, now: float) -> bool:
        return row.synced_at is not None and now - row.synced_at <= self.stale_s

    def _room(self, c: Counter, row: _Row, requests: int, tokens: int) -> bool:
        """Whether `requests` more requests and `tokens` more tokens may be pending here."""
        if c.max_requests is not None:
            spare = c.max_requests - row.known_requests
            if row.pending_requests + requests > self.share * spare:
                return False
        if c.max_tokens is not None:
            spare = c.max_tokens - row.known_tokens
            # a call is admitted while its tokens are unknown: the tokens already pending
            # must leave room, as the database's `tokens < max` does
            if row.pending_tokens + tokens > self.share * spare or spare <= 0:
                return False
        return True

    def admit(self, counters: Sequence[Counter], now: float | None = None) -> bool:
        """Count one request on every counter here (True), or on none (False: the call takes
        the exact path through the database)."""
        now = time.time() if now is None else now
        with self._lock:
            rows = [self._row(c, now) for c in counters]
            if not all(
                self._fresh(r, now) and self._room(c, r, 1, 0)
                for c, r in zip(counters, rows, strict=True)
            ):
                return False
            for r in rows:
                r.pending_requests += 1
        return True

    def admitted(self, counters: Sequence[Counter], now: float | None = None) -> None:
        """The database admitted a call on the exact path: count it in what is known here."""
        now = time.time() if now is None else now
        with self._lock:
            for c in counters:
                self._row(c, now).known_requests += 1

    def spend(self, counters: Sequence[Counter], tokens: int, now: float | None = None) -> bool:
        """Count a call's tokens here (True), or nowhere (False: count them in the database)."""
        now = time.time() if now is None else now
        with self._lock:
            rows = [self._row(c, now) for c in counters]
            if not all(
                self._fresh(r, now) and self._room(c, r, 0, tokens)
                for c, r in zip(counters, rows, strict=True)
            ):
                return False
            for r in rows:
                r.pending_tokens += tokens
        return True

    def spent(self, counters: Sequence[Counter], tokens: int, now: float | None = None) -> None:
        """A call's tokens were counted in the database: count them in what is known here."""
        now = time.time() if now is None else now
        with self._lock:
            for c in counters:
                self._row(c, now).known_tokens += tokens

    def pending(self) -> int:
        """Requests and tokens counted here and not yet in the database."""
        with self._lock:
            return sum(r.pending_requests + r.pending_tokens for r in self._rows.values())

    def sync(self, now: float | None = None) -> None:
        """Add what is pending here to the database and read back the rows calls used since
        the last sync (a row nobody used goes stale, and its next call takes the exact path)."""
        now = time.time() if now is None else now
        with self._lock:
            self._forget_ended(now)
            taken = {
                key: (r.pending_requests, r.pending_tokens)
                for key, r in self._rows.items()
                if r.used or r.pending_requests or r.pending_tokens
            }
            for key in taken:
                self._rows[key].used = False
        if not taken:
            return
        deltas = [Delta(k, start, n, t) for (k, start), (n, t) in taken.items()]
        try:
            totals = self.quotas.add(deltas)
        except ReefError as e:  # kept pending: the next sync adds them
            log.warning("syncing quota counters failed (calls take the exact path): %s", e)
            with self._lock:
                for key in taken:
                    self._rows[key].used = True
            return
        with self._lock:
            for key, (n, t) in taken.items():
                row = self._rows[key]
                row.pending_requests -= n
                row.pending_tokens -= t
            for u in totals:
                row = self._rows[(u.key, u.window_start)]
                # what calls counted here since the sync began is in `pending` still
                row.known_requests, row.known_tokens = u.requests, u.tokens
                row.synced_at = now

    def _forget_ended(self, now: float) -> None:
        ended = [k for k, r in self._rows.items() if r.window_end <= now]
        for key in ended:
            row = self._rows[key]
            if not (row.pending_requests or row.pending_tokens):
                del self._rows[key]
