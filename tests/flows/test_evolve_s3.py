"""The loop on S3: dataset snapshots, release files and MLflow artifacts in a bucket of a real
S3 protocol server (moto_server on loopback); the serving process fetches the release from
there when it deploys it."""

from __future__ import annotations

from pathlib import Path

import boto3
import httpx
import openai

from reef.cli.testing import InProcessReef
from reef.testing.traffic import traffic


def test_evolve_with_artifacts_on_s3(
    tmp_path: Path,
    s3_endpoint: str,
    s3_bucket: str,
    prefect_server: None,
) -> None:
    from reef.flows.evolve import evolve

    url = f"s3://{s3_bucket}/reef"
    artifacts = {"url": url, "s3_endpoint_url": s3_endpoint}
    # credentials reach boto3 through the environment (the s3_bucket fixture sets them)
    with InProcessReef(tmp_path / "state", artifacts=artifacts) as srv:
        traffic(srv, "s3", 2, report=lambda i, rid: {"score": 1.0}, max_tokens=3)
        overrides = {
            "server": {"state_dir": str(srv.state_dir), "port": srv.port},
            "engine": {"model": "tiny"},
            "reef": {"recipe": "sft", "batch_size": 2, "params": {"epochs": 1}},
            "gate": {"policy": "always"},
            "artifacts": artifacts,
        }
        result = evolve("s3", overrides=overrides)
        assert result["status"] == "published", result
        assert result["dataset"]["uri"].startswith(f"s3://{s3_bucket}/reef/datasets/")
        head = httpx.get(f"{srv.url}/reef/scenarios/s3/releases").json()["data"][0]
        assert head["uri"].startswith(f"s3://{s3_bucket}/reef/releases/s3/")
        keys = [
            o["Key"]
            for o in boto3.client("s3", endpoint_url=s3_endpoint)
            .list_objects_v2(Bucket=s3_bucket)
            .get("Contents", [])
        ]
        assert any(
            k.startswith("reef/releases/s3/") and k.endswith("adapter_model.safetensors")
            for k in keys
        )
        assert any(k.startswith("reef/mlflow/") for k in keys)  # MLflow's model version files
        client = openai.OpenAI(
            base_url=srv.base_url, api_key="none", default_headers={"x-reef-scenario": "s3"}
        )
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": "q9"}], max_tokens=3
        )
        assert raw.headers["x-reef-release-id"] == head["release_id"]
