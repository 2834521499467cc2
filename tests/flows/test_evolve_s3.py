"""The loop on S3: dataset snapshots, release files and MLflow artifacts in a bucket of a real
S3 protocol server (moto_server on loopback); the serving process fetches the release from
there when it deploys it."""

from __future__ import annotations

from pathlib import Path

import boto3
import httpx
import openai

from tests.reefserver import ReefServer

CREDS = {
    "AWS_ACCESS_KEY_ID": "reef-test",
    "AWS_SECRET_ACCESS_KEY": "reef-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def test_evolve_with_artifacts_on_s3(
    tmp_path: Path,
    s3_endpoint: str,
    s3_bucket: str,
    prefect_server: None,
) -> None:
    from flows.evolve import evolve

    url = f"s3://{s3_bucket}/reef"
    env = {
        **CREDS,
        "REEF_ARTIFACTS__URL": url,
        "REEF_ARTIFACTS__S3_ENDPOINT_URL": s3_endpoint,
    }
    with ReefServer(tmp_path / "state", "--model", "tiny", env=env) as srv:
        client = openai.OpenAI(
            base_url=srv.base_url, api_key="none", default_headers={"x-reef-scenario": "s3"}
        )
        for i in range(2):
            raw = client.chat.completions.with_raw_response.create(
                model="tiny", messages=[{"role": "user", "content": f"q{i}"}], max_tokens=3
            )
            httpx.post(
                f"{srv.url}/reef/report",
                json={"references": [raw.headers["x-reef-agent-record-id"]], "score": 1.0},
                headers={"x-reef-scenario": "s3"},
            ).raise_for_status()
        overrides = {
            "server": {"state_dir": str(srv.state_dir), "port": srv.port},
            "engine": {"model": "tiny"},
            "reef": {"recipe": "sft", "batch_size": 2, "params": {"epochs": 1}},
            "gate": {"policy": "always"},
            "artifacts": {"url": url, "s3_endpoint_url": s3_endpoint},
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
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": "q9"}], max_tokens=3
        )
        assert raw.headers["x-reef-release-id"] == head["release_id"]
