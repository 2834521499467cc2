"""open_store: which URLs it takes, and what it makes of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from reef.errors import ConfigError
from reef.store.sql import open_store


def test_sqlite_creates_the_state_directory(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "state" / "reef.db"
    store = open_store(f"sqlite:///{path}")
    try:
        store.migrate()
        assert path.exists()
        with store.engine.connect() as conn:
            pragmas = {
                name: conn.exec_driver_sql(f"PRAGMA {name}").scalar()
                for name in ("journal_mode", "synchronous", "foreign_keys")
            }
        assert pragmas == {"journal_mode": "wal", "synchronous": 2, "foreign_keys": 1}
    finally:
        store.close()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite://", "SQLite needs a file"),
        ("sqlite:///:memory:", "SQLite needs a file"),
        ("mysql://root@localhost/reef", "unsupported database 'mysql'"),
        ("not a url", "is not a URL"),
    ],
)
def test_unusable_urls_are_config_errors(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        open_store(url)


def test_plain_postgres_urls_mean_psycopg() -> None:
    for url in ("postgresql://root@127.0.0.1/reef", "postgres://root@127.0.0.1/reef"):
        store = open_store(url)
        assert store.engine.url.drivername == "postgresql+psycopg"
        store.close()


@pytest.mark.postgres
def test_a_postgres_connection_fails_fast_when_the_network_drops(postgres_url: str) -> None:
    """The connections libpq opens carry a TCP user timeout and keepalives, so a database cut
    off by the network breaks them in seconds, not after the kernel's ~15 minutes of
    retransmissions (read back from a live connection)."""
    from reef.store.connect import TCP_USER_TIMEOUT_MS

    store = open_store(postgres_url)
    try:
        with store.engine.connect() as conn:
            pgconn = conn.connection.dbapi_connection.pgconn  # type: ignore[union-attr]
            options = {o.keyword.decode(): o.val for o in pgconn.info}
    finally:
        store.close()
    assert options["tcp_user_timeout"] == str(TCP_USER_TIMEOUT_MS).encode()
    assert options["keepalives"] == b"1" and options["keepalives_count"] == b"3"
