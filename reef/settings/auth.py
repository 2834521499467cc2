"""auth: the bearer tokens Reef accepts, each stored as its sha256."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from reef.settings.section import Section


class TokenSettings(Section):
    name: str
    sha256: str = Field(description="hex sha256 of the token; `reef token` makes one")
    admin: bool = False
    scenarios: tuple[str, ...] = ()

    @field_validator("sha256")
    @classmethod
    def _hex(cls, v: str) -> str:
        v = v.removeprefix("sha256:").lower()
        if not re.fullmatch(r"[0-9a-f]{64}", v):
            raise ValueError("sha256 must be 64 hex digits (the token's hash, not the token)")
        return v


class AuthSettings(Section):
    tokens: tuple[TokenSettings, ...] = ()
