"""artifacts: where datasets and release files (adapters, checkpoints) are kept."""

from __future__ import annotations

from pydantic import Field

from reef.settings.section import Section


class ArtifactSettings(Section):
    """artifacts: where datasets and release files (adapters, checkpoints) are kept, a
    directory or S3 (credentials: boto3's chain: AWS_* environment, ~/.aws, instance role)."""

    url: str | None = Field(
        None, description="directory or s3://bucket/prefix; default: state_dir/artifacts"
    )
    s3_endpoint_url: str | None = Field(
        None, description="S3-compatible server (MinIO, ...); default: AWS"
    )
    s3_region: str | None = Field(None, description="S3 region; default: boto3's chain")
    s3_connect_timeout_s: float = Field(5.0, gt=0, description="S3 connection timeout")
    s3_read_timeout_s: float = Field(30.0, gt=0, description="S3 read timeout (per socket read)")
    s3_max_attempts: int = Field(
        3, ge=1, le=20, description="S3 attempts per call (boto3's standard retry mode)"
    )
