"""Secret settings: which keys are secret, and how they travel apart from the rest.

The settings typed SecretStr (a database URL may carry a password; tokens and API keys are
secret outright) never travel as command-line arguments, Prefect parameters or logged values:
a child process gets them in its environment, a flow called in-process gets them as SecretStr
(which Prefect's parameter serialization writes as '**********'), and a deployment run finds
them where it runs (its settings file or REEF_* environment)."""

from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel, SecretStr

from reef.settings.engine import nest_flat_keys
from reef.settings.service import Settings

KeyPath = tuple[str, ...]  # a setting's dotted name, split


def _secret_paths(model: type[BaseModel], path: KeyPath) -> set[KeyPath]:
    out: set[KeyPath] = set()
    for key, field in model.model_fields.items():
        sub = field.annotation
        if SecretStr in (sub, *get_args(sub)):
            out.add((*path, key))
        elif isinstance(sub, type) and issubclass(sub, BaseModel):
            out |= _secret_paths(sub, (*path, key))
    return out


def secret_keys() -> frozenset[KeyPath]:
    """The dotted path of every secret setting as a tuple, e.g. ("store", "database_url") or
    ("engine", "upstream", "api_key")."""
    return frozenset(_secret_paths(Settings, ()))


def _split(
    values: dict[str, Any], path: KeyPath, keys: frozenset[KeyPath]
) -> tuple[dict[str, Any], dict[str, Any]]:
    public: dict[str, Any] = {}
    secret: dict[str, Any] = {}
    for key, value in values.items():
        here = (*path, key)
        if here in keys:
            secret[key] = value
        elif isinstance(value, dict) and any(k[: len(here)] == here for k in keys):
            public_part, secret_part = _split(value, here, keys)
            if public_part:
                public[key] = public_part
            if secret_part:
                secret[key] = secret_part
        else:
            public[key] = value
    return public, secret


def split_secrets(overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Nested overrides (`load_settings`' shape) as (the rest, the secret settings); the
    engine's flat keys count as their nested places."""
    engine = overrides.get("engine")
    if isinstance(engine, dict):
        overrides = {**overrides, "engine": nest_flat_keys(engine)[0]}
    return _split(overrides, (), secret_keys())


def _plain(value: Any) -> str:
    return value.get_secret_value() if isinstance(value, SecretStr) else str(value)


def _leaves(values: dict[str, Any], path: KeyPath) -> list[tuple[KeyPath, Any]]:
    out: list[tuple[KeyPath, Any]] = []
    for key, value in values.items():
        if isinstance(value, dict):
            out += _leaves(value, (*path, key))
        else:
            out.append(((*path, key), value))
    return out


def secret_names(secret: dict[str, Any]) -> list[str]:
    """The dotted names of the settings in `secret` (split_secrets' second half), for a log."""
    return [".".join(path) for path, _ in _leaves(secret, ())]


def secret_environment(secret: dict[str, Any]) -> dict[str, str]:
    """The REEF_* environment variables that carry `secret` (split_secrets' second half) to a
    child process: what its settings read at the environment's precedence."""
    return {
        "REEF_" + "__".join(path).upper(): _plain(v)
        for path, v in _leaves(secret, ())
        if v is not None
    }


def _wrapped(values: dict[str, Any]) -> dict[str, Any]:
    return {
        k: _wrapped(v)
        if isinstance(v, dict)
        else v
        if v is None or isinstance(v, SecretStr)
        else SecretStr(str(v))
        for k, v in values.items()
    }


def _merged(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def conceal(overrides: dict[str, Any]) -> dict[str, Any]:
    """`overrides` with every secret value wrapped in SecretStr: for a flow called in this
    process, which gets the values, while the run's parameters Prefect stores show
    '**********'."""
    public, secret = split_secrets(overrides)
    return _merged(public, _wrapped(secret))
