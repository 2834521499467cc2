"""How the dashboard writes numbers, times and text: the templates' `num` filter and `age` and
`short` globals, and the rows' previews."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from reef.records import utcnow


def text_of(content: Any) -> str:
    """The text of a message's content: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


def num(value: Any) -> str:
    """A number as people read it: integers whole, others to three decimals at most."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.3f}".rstrip("0").rstrip(".")


def short(text: str, n: int = 140) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def age(when: datetime, now: datetime | None = None) -> str:
    """'3 min', '5 h', '2 d': how long ago."""
    s = max(0.0, ((now or utcnow()) - when).total_seconds())
    if s < 90:
        return f"{int(s)} s"
    if s < 5400:
        return f"{int(s // 60)} min"
    if s < 172800:
        return f"{int(s // 3600)} h"
    return f"{int(s // 86400)} d"
