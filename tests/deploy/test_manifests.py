"""deploy/k8s/: every manifest valid for a fixed Kubernetes version (kubernetes-validate,
strict, offline), wired as docs/scale.md says, and speaking only settings Reef knows."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from reef.settings import Settings, load_settings, secret_keys

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
# The oldest minor still widely run when these were written; strict: an unknown field fails.
K8S_VERSION = "1.33.0"
# Files in deploy/k8s that are not Kubernetes resources.
NOT_RESOURCES = {"kustomization.yaml", "prefect.yaml"}


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _resources() -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for name in _docs(K8S / "kustomization.yaml")[0]["resources"]:
        for doc in _docs(K8S / name):
            out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def env_path(name: str) -> tuple[str, ...]:
    """The setting REEF_<SECTION>__<KEY> (or deeper, REEF_ENGINE__VLLM__API_KEY) names."""
    return tuple(name.removeprefix("REEF_").lower().split("__"))


def known_env_key(name: str) -> bool:
    """Whether the variable names a setting of reef.settings, section by section (how
    pydantic-settings maps the environment onto Settings)."""
    model: Any = Settings
    for key in env_path(name):
        fields = getattr(model, "model_fields", None)
        if fields is None or key not in fields:
            return False
        model = fields[key].annotation
    return getattr(model, "model_fields", None) is None  # a value, not a whole section


def _paths(values: dict[str, Any], path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The dotted paths of every value in a settings file, split."""
    out: list[tuple[str, ...]] = []
    for key, value in values.items():
        here = (*path, key)
        out += _paths(value, here) if isinstance(value, dict) else [here]
    return out


def test_kustomization_lists_every_manifest() -> None:
    listed = set(_docs(K8S / "kustomization.yaml")[0]["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - NOT_RESOURCES
    assert listed == on_disk
    assert not list(K8S.rglob("*.py"))  # manifests only: the layer test has nothing to check


@pytest.mark.parametrize(
    "name", sorted(p.name for p in K8S.glob("*.yaml") if p.name not in NOT_RESOURCES)
)
def test_manifest_is_valid_kubernetes(name: str) -> None:
    docs = _docs(K8S / name)
    assert docs
    for doc in docs:
        # Raises ValidationError naming the field on any schema violation.
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_a_broken_manifest_is_caught() -> None:
    """The check above has teeth: a misspelt field fails strict validation."""
    doc = _resources()[("Deployment", "reef-api")]
    broken = json.loads(json.dumps(doc))
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_api_replicas_autoscale_and_are_probed_on_routes_the_app_serves() -> None:
    res = _resources()
    api = res[("Deployment", "reef-api")]["spec"]["template"]["spec"]["containers"][0]
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    paths = json.loads((ROOT / "docs" / "openapi.json").read_text())["paths"]
    assert {"/readyz", "/healthz"} <= set(paths)
    assert "resources" in api and api["resources"]["requests"]["cpu"]  # HPA utilization needs it
    hpa = res[("HorizontalPodAutoscaler", "reef-api")]["spec"]
    assert hpa["scaleTargetRef"]["name"] == "reef-api"
    assert hpa["metrics"][0]["resource"]["name"] == "cpu"
    svc = res[("Service", "reef-api")]["spec"]
    assert svc["selector"] == res[("Deployment", "reef-api")]["spec"]["selector"]["matchLabels"]


def test_vllm_and_the_worker_run_on_gpus() -> None:
    res = _resources()
    for name in ("reef-vllm", "reef-worker"):
        pod = res[("Deployment", name)]["spec"]["template"]["spec"]
        assert pod["nodeSelector"], name
        limits = pod["containers"][0]["resources"]["limits"]
        assert int(limits["nvidia.com/gpu"]) >= 1, name
    worker = res[("Deployment", "reef-worker")]["spec"]["template"]["spec"]["containers"][0]
    assert worker["args"][:3] == ["prefect", "worker", "start"]


def test_secrets_hold_only_secret_settings_and_the_config_none() -> None:
    res = _resources()
    secret = res[("Secret", "reef-secrets")]["stringData"]
    reef_keys = [k for k in secret if k.startswith("REEF_")]
    assert reef_keys
    for key in reef_keys:
        assert known_env_key(key), key
        assert env_path(key) in secret_keys(), f"{key} is not a secret setting"
    config = yaml.safe_load(res[("ConfigMap", "reef-config")]["data"]["reef.yaml"])
    for path in _paths(config):
        assert path not in secret_keys(), f"{'.'.join(path)} belongs in the Secret"
    for key in res[("ConfigMap", "reef-env")]["data"]:
        assert not key.startswith("REEF_") or known_env_key(key), key


def test_reef_loads_the_configmap_with_the_secrets_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    res = _resources()
    path = tmp_path / "reef.yaml"
    path.write_text(res[("ConfigMap", "reef-config")]["data"]["reef.yaml"])
    for key, value in res[("Secret", "reef-secrets")]["stringData"].items():
        monkeypatch.setenv(key, value)
    settings = load_settings(path)  # unknown keys and bad values raise ConfigError
    assert settings.engine.kind == "vllm"
    assert settings.database_url.startswith("postgresql+psycopg://")
    assert settings.store.retention_days == 90
    # The vLLM the config names is the Service in vllm.yaml, serving engine.model's name.
    assert settings.engine.vllm.url == "http://reef-vllm:8000"
    vllm = res[("Deployment", "reef-vllm")]["spec"]["template"]["spec"]["containers"][0]
    assert f"--served-model-name={Path(settings.engine.model).name}" in vllm["args"]
    assert f"--model={settings.engine.model}" in vllm["args"]


def test_the_kubernetes_work_pool_deploys_the_same_flows() -> None:
    k8s = yaml.safe_load((K8S / "prefect.yaml").read_text())
    root = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    entry = {d["entrypoint"] for d in root["deployments"]}
    assert {d["entrypoint"] for d in k8s["deployments"]} == entry
    for d in k8s["deployments"]:
        assert d["work_pool"]["name"] == "reef-k8s"
        assert d["work_pool"]["job_variables"]["image"]
        assert (ROOT / d["entrypoint"].split(":")[0]).is_file()


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_kustomize_renders_the_whole_set() -> None:
    out = subprocess.run(
        ["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    rendered = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert {(d["kind"], d["metadata"]["name"]) for d in rendered} == set(_resources())
    assert all(
        d["metadata"].get("namespace") == "reef" for d in rendered if d["kind"] != "Namespace"
    )
