"""auth: the bearer tokens Reef accepts, each stored as its sha256."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from reef.settings.section import Section


class QuotaSettings(Section):
    """auth.tokens[].quota: limits on one token's calls, counted in the database (every replica shares them) in
    fixed windows: the minute and the UTC day. None: no limit."""

    requests_per_minute: int | None = Field(None, ge=1, description="inference calls a minute")
    tokens_per_minute: int | None = Field(
        None, ge=1, description="prompt + completion tokens a minute"
    )
    tokens_per_day: int | None = Field(
        None, ge=1, description="prompt + completion tokens a UTC day (a daily budget)"
    )

    @property
    def limited(self) -> bool:
        return any(
            v is not None
            for v in (self.requests_per_minute, self.tokens_per_minute, self.tokens_per_day)
        )


class TokenSettings(Section):
    """auth.tokens[]: one bearer token, stored as its sha256 (`reef token` prints the entry)."""

    name: str = Field(description="who holds the token (shown in logs and on approvals)")
    sha256: str = Field(description="hex sha256 of the token; `reef token` makes one")
    admin: bool = Field(
        False, description="may use every scenario and the admin routes (releases, rollouts)"
    )
    scenarios: tuple[str, ...] = Field(
        (), description="the scenarios a non-admin token may use (any other: 403)"
    )
    reviewer: bool = Field(
        False,
        description="may review turns of its scenarios in the dashboard (scores, metrics, "
        "corrections, the annotation queue) but not approve, reject or roll back releases; "
        "admin tokens review too",
    )
    quota: QuotaSettings = Field(
        QuotaSettings(), description="limits over all the token's scenarios together"
    )
    scenario_quotas: dict[str, QuotaSettings] = Field(
        default_factory=dict,
        description="limits per scenario (scenario name -> limits), besides `quota`",
    )

    @field_validator("sha256")
    @classmethod
    def _hex(cls, v: str) -> str:
        v = v.removeprefix("sha256:").lower()
        if not re.fullmatch(r"[0-9a-f]{64}", v):
            raise ValueError("sha256 must be 64 hex digits (the token's hash, not the token)")
        return v


class AuthSettings(Section):
    """auth: the bearer tokens Reef accepts (Authorization: Bearer or x-api-key); none:
    loopback only, without auth."""

    tokens: tuple[TokenSettings, ...] = Field(
        (),
        description="[{name, sha256, admin | scenarios, reviewer, quota, scenario_quotas}]; empty: no "
        "auth, and only a loopback server.host starts",
    )
    secure_cookie: bool | None = Field(
        None,
        description="the dashboard's session cookie is Secure (browsers send it over https "
        "only); null: on when tokens are configured and server.host is not loopback (a TLS "
        "proxy in front), else only for requests that came over https",
    )
