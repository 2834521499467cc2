"""What the jobs page shows of webhook events: each delivery's kind, where it goes, its state
and its last error."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlsplit

from reef.api.ui.views.text import short
from reef.store.events import Delivery


@dataclass(frozen=True)
class EventRow:
    event_id: str
    kind: str
    target: str  # scheme and host only: a webhook's path may carry a token
    status: str
    attempts: int
    created_at: datetime
    next_at: datetime | None  # when a pending event is tried again
    error: str


def event_rows(deliveries: list[Delivery]) -> list[EventRow]:
    """The recent webhook deliveries, newest first, as the jobs page lists them."""
    rows = []
    for d in deliveries:
        where = urlsplit(d.url)
        rows.append(
            EventRow(
                event_id=d.event_id,
                kind=d.kind,
                target=f"{where.scheme}://{where.netloc}",
                status=d.status,
                attempts=d.attempts,
                created_at=d.created_at,
                next_at=d.next_attempt_at if d.status == "pending" else None,
                error=short(d.last_error or "", 200),
            )
        )
    return rows
