"""What the quotas page shows: each configured limit and what its current window used."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class QuotaRow:
    """One limit of one token, over all its scenarios or one."""

    token: str
    scope: str  # a scenario, or "all"
    limit: str  # the setting: requests_per_minute, tokens_per_minute, tokens_per_day
    used: int  # in the current window
    max: int
    window_s: int  # 60 (the minute) or 86400 (the UTC day)


def quota_rows(usage: list[dict[str, Any]], viewer: str, admin: bool) -> list[QuotaRow]:
    """The rows of `usage` (api.quotas.QuotaGate.usage) that `viewer` may see: an admin every
    token's, another token its own."""
    return [
        QuotaRow(u["token"], u["scope"], u["limit"], u["used"], u["max"], u["window_s"])
        for u in usage
        if admin or u["token"] == viewer
    ]
