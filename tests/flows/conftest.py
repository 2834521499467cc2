"""Flow fixtures: one Prefect test server (prefect_test_harness) for the whole session, its
home and database in a temporary directory."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

# the real S3 server (moto_server) and a fresh bucket, shared with the experience tests
from tests.experience.conftest import s3_bucket, s3_endpoint

__all__ = ["s3_bucket", "s3_endpoint"]


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Start the harness once (~10 s); flows called in tests run against it. Prefect is first
    imported here, after PREFECT_HOME points into the session's temporary directory."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PREFECT_HOME", str(tmp_path_factory.mktemp("prefect-home")))
        mp.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        mp.setenv("PREFECT_LOGGING_TO_API_ENABLED", "false")
        from prefect.testing.utilities import prefect_test_harness

        with prefect_test_harness(server_startup_timeout=60):
            yield
