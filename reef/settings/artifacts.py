"""artifacts: where datasets and release files (adapters, checkpoints) are kept."""

from __future__ import annotations

from pydantic import Field

from reef.settings.section import Section


class ArtifactSettings(Section):
    url: str | None = Field(
        None, description="directory or s3://bucket/prefix; default: state_dir/artifacts"
    )
    s3_endpoint_url: str | None = Field(
        None, description="S3-compatible server (MinIO, ...); default: AWS"
    )
    s3_region: str | None = Field(None, description="S3 region; default: boto3's chain")
