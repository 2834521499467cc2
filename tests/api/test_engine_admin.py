"""The engine's admin load routes load only a scenario's own release files from the artifact
store — never a local path someone names — unless engine.allow_local_paths says otherwise."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from reef.artifacts import artifacts_for
from reef.cli.testing import InProcessReef
from reef.models import resolve_model
from tests.engines.test_embedded_releases import lora


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tiny = resolve_model("tiny", Path.home() / ".cache" / "reef" / "models")
    out = tmp_path_factory.mktemp("adapter") / "a"
    lora(AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32), 5, out)
    return out


@pytest.fixture
def stored(server: InProcessReef, scenario: str, adapter: Path) -> Iterator[str]:
    """The adapter as a candidate's files of `scenario` in the server's artifact store."""
    yield artifacts_for(server.settings).put_tree(f"releases/{scenario}/abc123", adapter)


def _load(server: InProcessReef, name: str, source: str, route: str = "adapter") -> httpx.Response:
    if route == "adapter":
        path, body = "/v1/load_lora_adapter", {"lora_name": name, "lora_path": source}
    else:
        path, body = "/reef/engine/weights", {"name": name, "path": source}
    return httpx.post(server.url + path, json=body, timeout=120)


def _variants(server: InProcessReef) -> list[str]:
    return list(httpx.get(f"{server.url}/reef/engine/variants").json()["data"])


@pytest.mark.parametrize("route", ["adapter", "weights"])
def test_a_local_path_is_refused(
    server: InProcessReef, scenario: str, adapter: Path, route: str
) -> None:
    name = f"{scenario}@rel_local"
    for source in (str(adapter), adapter.as_uri(), str(server.state_dir), "/etc"):
        r = _load(server, name, source, route)
        assert r.status_code == 403, r.text
        assert r.json()["error"]["code"] == "source_not_allowed"
        assert "engine.allow_local_paths" in r.json()["error"]["message"]
    assert name not in _variants(server)


def test_only_the_named_scenarios_release_files_load(
    server: InProcessReef, scenario: str, stored: str
) -> None:
    root = artifacts_for(server.settings).uri("")
    refused = [
        ("other@rel_1", stored),  # another scenario's name for these files
        ("no-scenario", stored),  # not <scenario>@<release_id>
        (f"{scenario}\n@rel_1", stored),
        (f"{scenario}@rel_1", f"{root}/releases/{scenario}/../../mlflow"),
        (f"{scenario}@rel_1", f"{root}/datasets/{scenario}"),
        (f"{scenario}@rel_1", f"{root}/releases/{scenario}"),
    ]
    for name, source in refused:
        r = _load(server, name, source)
        assert r.status_code in (400, 403), (name, source, r.text)
    name = f"{scenario}@rel_1"
    r = _load(server, name, stored)
    assert r.status_code == 200, r.text
    assert r.json()["loaded"] is True
    assert name in _variants(server)
    assert httpx.post(f"{server.url}/v1/unload_lora_adapter", json={"lora_name": name}).json()[
        "unloaded"
    ]


def test_allow_local_paths_loads_any_directory(tmp_path: Path, adapter: Path) -> None:
    with InProcessReef(tmp_path, engine={"allow_local_paths": True}) as srv:
        r = _load(srv, "anything", str(adapter))
        assert r.status_code == 200, r.text
        assert "anything" in _variants(srv)
