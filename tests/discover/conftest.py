"""The real S3 server (moto_server) and a fresh bucket, shared with the experience tests."""

from __future__ import annotations

from tests.experience.conftest import s3_bucket, s3_endpoint

__all__ = ["s3_bucket", "s3_endpoint"]
