"""What every settings section shares: a frozen model that refuses unknown keys, the check of
dotted paths and server URLs, and how a validation error reads in a message."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, ValidationError

# pkg.module:name, as recipes, scorers and judges are named.
DOTTED = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def server_root(url: str) -> str:
    """An engine's admin URL: a server's http(s) root, without a trailing slash."""
    if not re.match(r"^https?://[^/]", url):
        raise ValueError(f"'{url}' is not an http(s) URL (a server's root)")
    return url.rstrip("/")


def describe(err: ValidationError) -> str:
    """`err` as one line naming each key by its dotted path."""
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            lines.append(f"unknown key '{key}'")
        else:
            lines.append(f"{key}: {msg}" if key else msg)
    return "; ".join(lines)
