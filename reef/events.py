"""Events: operators' webhooks told when a candidate, a release or a rollout changes.

Each kind (`events.webhooks[].events` subscribes to some, by default all):

| kind | when |
|---|---|
| candidate.rejected | the gate rejected a candidate, or a held one was declined |
| candidate.pending_approval | a candidate waits for a person (manual gate, a harness held for review) |
| release.published | the head moved: a candidate published or promoted, a rollback |
| guard.failed | a gate guard was not shown safe (its candidate is rejected too) |
| rollout.promoted | a canary became the head (its test, or an admin) |
| rollout.rolled_back | a canary was retired (its test or guardrail, or an admin) |
| evolve.failed | an evolve run raised |

An event is stored in the outbox (reef.store.events) for each webhook that takes its kind, in
the transaction of the change it tells of (`ReleaseChain` passes it to the store's write), so
it exists exactly when the change is durable; nothing is stored without webhooks. The
`Deliverer` (a background task of `reef serve`) sends what is due and marks it delivered, or
retries it with exponential backoff, up to `events.max_attempts` tries: at least once, with the
same body, event id and signature on every try.

A POST's body is `{"id": "evt_…", "type": kind, "created_at": ISO time, "scenario": name or
null, "data": {…}}`; its headers: `x-reef-event-id` (de-duplicate on it), `x-reef-event` (the
kind), `x-reef-delivery-attempt` (1, 2, …) and `x-reef-signature: sha256=<hex>`, the
HMAC-SHA256 of the raw body under the webhook's secret (`verify` checks one). A 2xx answer is
a delivery; anything else (a redirect too) is retried."""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import httpx
import orjson

from reef.background import BackgroundTask
from reef.records import Candidate, Release, new_id, utcnow
from reef.settings.events import EventSettings
from reef.store.events import Delivery, EventStore

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "x-reef-signature"
EVENT_ID_HEADER = "x-reef-event-id"
CLAIM_BATCH = 20  # deliveries claimed at a time
PRUNE_EVERY_S = 3600.0


def signature(secret: str, body: bytes) -> str:
    """The `x-reef-signature` value of `body` under `secret`: sha256=<hex HMAC-SHA256>."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, header: str | None) -> bool:
    """Whether `header` (x-reef-signature) signs `body` under `secret`; what a receiver checks
    before it trusts an event (constant-time)."""
    return header is not None and hmac.compare_digest(signature(secret, body), header)


def deliveries(
    settings: EventSettings, kind: str, scenario: str | None, data: dict[str, Any]
) -> list[Delivery]:
    """The event `kind` about `scenario` as one pending delivery per webhook that takes it
    (none without webhooks), sharing one event id and one body."""
    hooks = [h for h in settings.webhooks if kind in h.events]
    if not hooks:
        return []
    event_id, now = new_id("evt"), utcnow()
    body = orjson.dumps(
        {
            "id": event_id,
            "type": kind,
            "created_at": now.isoformat(),
            "scenario": scenario,
            "data": data,
        },
        default=str,
    ).decode()
    return [
        Delivery(new_id("evd"), event_id, kind, scenario, h.url, body, now, next_attempt_at=now)
        for h in hooks
    ]


def candidate_data(candidate: Candidate, **more: Any) -> dict[str, Any]:
    """What an event says about a candidate: its ids, status, recipe and the gate's verdict."""
    gate = candidate.gate or {}
    verdict = {
        k: gate.get(k)
        for k in ("status", "policy", "test", "n", "mean_candidate", "mean_head", "broken_guard")
        if k in gate
    }
    return {
        "candidate_id": candidate.id,
        "parent_id": candidate.parent_id,
        "status": candidate.status,
        "operation": candidate.operation,
        "recipe": candidate.recipe,
        "model_uri": candidate.model_uri,
        "reason": candidate.message or gate.get("reason"),
        "gate": verdict,
        **more,
    }


def registered(settings: EventSettings, candidate: Candidate) -> list[Delivery]:
    """The events of a candidate as it is registered: rejected (and guard.failed when a guard
    broke), or pending approval when the gate holds it for a person."""
    gate = candidate.gate or {}
    out = []
    if candidate.status == "rejected":
        out += deliveries(
            settings, "candidate.rejected", candidate.scenario, candidate_data(candidate)
        )
    elif gate.get("status") == "pending":
        data = candidate_data(candidate)
        out += deliveries(settings, "candidate.pending_approval", candidate.scenario, data)
    if gate.get("broken_guard"):
        checks: list[dict[str, Any]] = list(gate.get("guards") or [])
        guard = next((g for g in checks if g.get("name") == gate["broken_guard"]), {})
        data = candidate_data(candidate, guard=guard or {"name": gate["broken_guard"]})
        out += deliveries(settings, "guard.failed", candidate.scenario, data)
    return out


def published(settings: EventSettings, release: Release, **more: Any) -> list[Delivery]:
    """release.published for `release` about to become the head."""
    data = {
        "release_id": release.id,
        "parent_id": release.parent_id,
        "operation": release.operation,
        "kind": release.kind,
        "recipe": release.recipe,
        "model_uri": release.model_uri,
        **more,
    }
    return deliveries(settings, "release.published", release.scenario, data)


class Deliverer:
    """Sends due deliveries and marks them: delivered on a 2xx, else retried after
    `backoff_s` doubled per failed try (at most `backoff_max_s`), and failed after
    `max_attempts` tries. Delivered and failed ones older than `keep_days` are pruned."""

    def __init__(self, store: EventStore, settings: EventSettings):
        self.store = store
        self.settings = settings
        self._client = httpx.Client(timeout=settings.timeout_s, follow_redirects=False)
        self._pruned_at = 0.0

    def close(self) -> None:
        self._client.close()

    def step(self) -> int:
        """Send everything due now; returns how many were delivered."""
        if time.monotonic() - self._pruned_at > PRUNE_EVERY_S:
            self._pruned_at = time.monotonic()
            self.store.prune_deliveries(utcnow() - timedelta(days=self.settings.keep_days))
        lease_s = 2 * self.settings.timeout_s + 5
        delivered = 0
        while True:
            due = self.store.claim_deliveries(CLAIM_BATCH, lease_s)
            for delivery in due:
                delivered += self.send(delivery)
            if len(due) < CLAIM_BATCH:
                return delivered

    def send(self, delivery: Delivery) -> bool:
        """One try of a claimed delivery, recorded in the store; whether it was delivered."""
        attempt = delivery.attempts + 1
        secret = self.settings.secret_for(delivery.url)
        if secret is None:
            error: str | None = "the webhook is no longer configured"
            self.store.finish_delivery(delivery.id, error=error)
            return False
        body = delivery.body.encode()
        headers = {
            "content-type": "application/json",
            EVENT_ID_HEADER: delivery.event_id,
            "x-reef-event": delivery.kind,
            "x-reef-delivery-attempt": str(attempt),
            SIGNATURE_HEADER: signature(secret, body),
        }
        try:
            answer = self._client.post(delivery.url, content=body, headers=headers)
            ok = 200 <= answer.status_code < 300
            error = None if ok else f"HTTP {answer.status_code}: {answer.text[:200]}"
        except httpx.HTTPError as e:
            error = f"{type(e).__name__}: {e}"
        if error is None:
            self.store.finish_delivery(delivery.id)
            return True
        retry_at = None
        if attempt < self.settings.max_attempts:
            wait = min(self.settings.backoff_s * 2 ** (attempt - 1), self.settings.backoff_max_s)
            retry_at = utcnow() + timedelta(seconds=wait)
        log.warning(
            "event %s (%s) to %s, try %d: %s%s",
            delivery.event_id,
            delivery.kind,
            delivery.url,
            attempt,
            error,
            "" if retry_at else "; given up",
        )
        self.store.finish_delivery(delivery.id, error=error, retry_at=retry_at)
        return False


def deliverer(store: EventStore, settings: EventSettings) -> BackgroundTask | None:
    """The deliverer as a periodic background task (every `poll_s`, and when triggered);
    None when no webhook is configured."""
    if not settings.webhooks:
        return None
    sender = Deliverer(store, settings)
    return BackgroundTask(
        "event-deliverer", sender.step, every_s=settings.poll_s, now=True, last=sender.close
    )


def add(store: EventStore, found: Sequence[Delivery]) -> None:
    """Store events whose change is durable already (a failed run): nothing without any."""
    if found:
        store.add_deliveries(found)
