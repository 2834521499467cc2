"""Which registered engines a deploy reaches (engine.registry): anyone who can write the
engines table could register a URL, and every deploy sends it the admin engine token. Only
loopback engines and the names in engine.fleet.registry_allow are reached, and off loopback only
over https."""

from __future__ import annotations

from pathlib import Path

import pytest

from reef.deploy.engine import Registered
from reef.errors import ConfigError
from reef.settings import load_settings
from reef.store.sql import open_store


@pytest.mark.parametrize(
    ("allow", "reached"),
    [
        ((), ["http://127.0.0.1:8901", "http://localhost:8902", "https://[::1]:8903"]),
        (
            ("reef-1.internal", "*.fleet.example"),
            [
                "http://127.0.0.1:8901",
                "http://localhost:8902",
                "https://[::1]:8903",
                "https://a.fleet.example",
                "https://reef-1.internal:8900",
            ],
        ),
    ],
)
def test_only_allowed_engines_get_the_token(
    tmp_path: Path, allow: tuple[str, ...], reached: list[str]
) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'reef.db'}")
    store.migrate()
    for url in [
        "http://127.0.0.1:8901",
        "http://localhost:8902",
        "https://[::1]:8903",
        "https://reef-1.internal:8900",
        "http://reef-1.internal:8900",  # allowed name, plain http: the token would travel bare
        "https://a.fleet.example",
        "https://fleet.example.evil.test",
        "https://attacker.example",
        "http://10.0.0.9:8900",
    ]:
        store.register_engine(url, started=True)
    settings = load_settings(
        None,
        engine={"fleet": {"registry": True, "registry_allow": list(allow)}},
        reef={"engine_token": "secret-admin-token"},
    )
    registered = Registered(settings, store)
    try:
        assert sorted(url for url, _ in registered()) == sorted(reached)
    finally:
        registered.close()
        store.close()


def test_allow_list_entries_are_host_names() -> None:
    with pytest.raises(ConfigError, match="not a host name"):
        load_settings(None, engine={"fleet": {"registry_allow": ["https://reef-1.internal"]}})
