"""A deploy that fails leaves the head where it was: an adapter that computes NaN fails the smoke
generation, one that does not fit the model is refused before anything moves, and neither stays
loaded. Driven over HTTP through the admin routes of a served Reef app, as a flow's deploy does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from reef.cli.testing import InProcessReef
from reef.deploy.engine import DeployError, EngineAdmin
from reef.deploy.release import deploy
from reef.records import Release, new_id, utcnow
from reef.store.sql import open_store
from tests.engines.test_embedded_releases import lora

S = "fails"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    # the adapters are directories the test writes, not artifact-store files
    with InProcessReef(tmp_path_factory.mktemp("fails"), engine={"allow_local_paths": True}) as srv:
        yield srv


def _release(store, path: Path) -> Release:  # type: ignore[no-untyped-def]
    head = store.ensure_scenario(S).head_release_id
    return Release(
        id=new_id("rel"),
        scenario=S,
        seq=0,
        parent_id=head,
        kind="adapter",
        created_at=utcnow(),
        uri=str(path),
        operation="training",
    )


@pytest.mark.parametrize("broken", ["nan", "misfit"])
def test_a_failed_deploy_leaves_the_head(
    server: InProcessReef, tmp_path: Path, broken: str
) -> None:
    from reef.models import resolve_model

    tiny = resolve_model("tiny", Path.home() / ".cache" / "reef" / "models")
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    if broken == "misfit":  # an adapter for a model with another hidden size
        config = model.config
        config.hidden_size, config.intermediate_size = 256, 512
        config.head_dim = 64
        model = AutoModelForCausalLM.from_config(config)
    lora(model, 1, tmp_path / "adapter", scale=float("nan") if broken == "nan" else 0.1)
    store = open_store(f"sqlite:///{server.state_dir / 'reef.db'}")
    admin = EngineAdmin(server.url)
    try:
        release = _release(store, tmp_path / "adapter")
        before = store.list_releases(S)
        with pytest.raises(DeployError) as e:
            deploy(store, admin, release)
        assert ("verify" in str(e.value)) == (broken == "nan"), e.value
        assert store.list_releases(S) == before
        assert store.get_scenario(S).head_release_id == release.parent_id
        assert admin.variants() == []  # unstaged
        # still serving the head
        r = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2,
            },
            headers={"x-reef-scenario": S},
        )
        assert r.status_code == 200 and r.headers["x-reef-release-id"] == release.parent_id
    finally:
        admin.close()
        store.close()
