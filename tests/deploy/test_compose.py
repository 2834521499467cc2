"""deploy/compose/compose.yaml: valid against the Compose Specification's JSON schema
(vendored: compose-spec.json, from github.com/compose-spec/compose-spec schema/compose-spec.json
at 170098ba, minified), complete, and speaking only settings Reef knows."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from reef.settings import load_settings
from tests.deploy.test_manifests import known_env_key

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "compose" / "compose.yaml"
SCHEMA = json.loads((Path(__file__).parent / "compose-spec.json").read_text())


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())  # resolves the x-reef anchors and `<<` merges


def test_compose_file_follows_the_compose_specification(compose: dict[str, Any]) -> None:
    jsonschema.Draft7Validator(SCHEMA).validate(compose)
    broken = copy.deepcopy(compose)
    broken["services"]["reef"]["restart_policy"] = "always"  # a key Compose does not have
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(SCHEMA).validate(broken)


def test_one_host_runs_every_component(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"postgres", "minio", "mlflow", "prefect", "worker", "reef", "vllm"} <= set(services)
    for name, svc in services.items():
        assert svc.get("image"), f"{name} has no image"
        for dep in svc.get("depends_on", {}):
            assert dep in services, f"{name} depends on unknown service {dep}"
    for name in ("vllm", "worker"):
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"], name
    assert services["reef"]["command"][:2] == ["reef", "serve"]
    assert services["worker"]["command"][-1].endswith(
        "prefect worker start --pool reef --type process"
    )
    for name in services:
        for cfg in services[name].get("configs", []):
            assert cfg["source"] in compose["configs"]


def test_reef_reads_the_compose_settings(
    compose: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = compose["services"]["reef"]["environment"]
    for key, value in env.items():
        if key.startswith("REEF_"):
            assert known_env_key(key), key
            # what Compose interpolates ${VAR:-default} to when VAR is unset
            monkeypatch.setenv(key, value.replace("${POSTGRES_PASSWORD:-reef}", "reef"))
    path = tmp_path / "reef.yaml"
    path.write_text(compose["configs"]["reef-config"]["content"])
    settings = load_settings(path)
    assert settings.database_url == "postgresql+psycopg://reef:reef@postgres:5432/reef"
    assert settings.artifacts.s3_endpoint_url == "http://minio:9000"
    assert settings.engine.vllm.url == "http://vllm:8000"
    assert settings.reef.engine_url == "http://reef:8900"
    assert settings.tracking_uri == "http://mlflow:5000"
    # the databases the other services name exist: Postgres creates them at first start
    init = compose["configs"]["postgres-init"]["content"]
    assert "CREATE DATABASE mlflow" in init and "CREATE DATABASE prefect" in init
