"""`reef config`: the effective settings as plain data, with every secret masked.

Masked: the settings typed secret (tokens and API keys whole; a database or tracking URL keeps
everything but its password), the token hashes under `auth.tokens`, a password in any URL
(`scheme://user:PASSWORD@host`, `?password=...`), a value under a secret-sounding key (a
recipe's `params`), and the value after a secret-sounding flag in an argument list
(`engine.vllm.args: [--api-key, ...]`)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import SecretStr

from reef.settings import Settings, secret_keys

MASK = "**********"
# A key (or a flag in an argument list) whose value is a secret; `*_env` names the environment
# variable a secret is in, not the secret.
_SECRET_NAME = re.compile(
    r"(?:^|[._-])(?:password|passwd|secret|token|api[-_]?key|access[-_]?key|credentials?|sha256)$",
    re.IGNORECASE,
)
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-z][a-z0-9+.-]*://[^/@:\s]*:)[^@\s]*@", re.IGNORECASE)
_QUERY_SECRET = re.compile(
    r"(?P<head>[?&](?:password|passwd|secret|token|api[-_]?key|sslpassword)=)[^&#\s]*",
    re.IGNORECASE,
)


def mask_url(text: str) -> str:
    """`text` with the passwords of the URLs in it masked."""
    text = _URL_PASSWORD.sub(rf"\g<head>{MASK}@", text)
    return _QUERY_SECRET.sub(rf"\g<head>{MASK}", text)


def _secret_name(key: str) -> bool:
    key = key.lstrip("-")
    return bool(_SECRET_NAME.search(key)) and not key.endswith("_env")


def _masked_list(items: list[Any]) -> list[Any]:
    out: list[Any] = []
    for i, item in enumerate(items):
        before = items[i - 1] if i else None
        if isinstance(before, str) and before.startswith("-") and _secret_name(before):
            out.append(MASK)
        elif isinstance(item, str) and item.startswith("-") and "=" in item:
            flag = item.partition("=")[0]
            out.append(f"{flag}={MASK}" if _secret_name(flag) else mask_url(item))
        else:
            out.append(_masked(item))
    return out


def _masked(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: MASK if v is not None and _secret_name(str(k)) else _masked(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return _masked_list(value)
    if isinstance(value, str):
        return mask_url(value)
    return value


def _secret_shown(value: SecretStr | None) -> str | None:
    """A secret setting as shown: a URL without its password, anything else masked whole."""
    if value is None:
        return None
    plain = value.get_secret_value()
    return mask_url(plain) if "://" in plain else MASK


def masked(settings: Settings) -> dict[str, Any]:
    """`settings` as JSON-like data (what `reef config` prints), every secret masked."""
    data: dict[str, Any] = settings.model_dump(mode="json")
    for path in secret_keys():
        owner: Any = settings
        place = data
        for key in path[:-1]:
            owner = getattr(owner, key)
            place = place[key]
        place[path[-1]] = _secret_shown(getattr(owner, path[-1]))
    return {key: _masked(section) for key, section in data.items()}
