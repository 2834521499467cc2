"""Scale fixtures: the real S3 protocol server (moto_server) and a Prefect server of this
module's own (the flow tests' server class, started here: tests/flows' conftest is not loaded
when only tests/scale is collected)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.experience.conftest import s3_bucket, s3_endpoint
from tests.flows.conftest import _PrefectServer

__all__ = ["s3_bucket", "s3_endpoint"]


@pytest.fixture(scope="module")
def prefect_server() -> Iterator[_PrefectServer]:
    """A Prefect server subprocess, starting (`.wait()` until it answers); this process's
    PREFECT_API_URL points at it meanwhile."""
    server = _PrefectServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
