"""32 publishers race to move one scenario's head from the same parent, each through the full
deploy path (MLflow model version, engine admin routes of a served Reef app, CAS, alias):
exactly one wins, the chain stays linear, and MLflow's champion alias names the head."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from reef import registry
from reef.cli.testing import InProcessReef
from reef.deploy.engine import EngineAdmin
from reef.deploy.release import deploy
from reef.errors import HeadMoved
from reef.records import Release, new_id, utcnow
from reef.store.sql import open_store

S = "race"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    with InProcessReef(tmp_path_factory.mktemp("race")) as srv:
        yield srv


def test_32_publishers_one_winner(server: InProcessReef) -> None:
    state: Path = server.state_dir
    tracking = f"sqlite:///{(state / 'mlflow.db').resolve()}"
    store = open_store(f"sqlite:///{state / 'reef.db'}")
    try:
        parent = store.ensure_scenario(S).head_release_id
        releases = []
        for i in range(32):
            rid = new_id("rel")
            uri = registry.register_base(
                tracking, S, rid, "tiny", artifact_location=(state / "mlflow").as_uri()
            )
            releases.append(
                Release(
                    id=rid,
                    scenario=S,
                    seq=0,
                    parent_id=parent,
                    kind="base",
                    created_at=utcnow(),
                    operation="promote",
                    model_uri=uri,
                    metadata={"publisher": i},
                )
            )
        won: list[Release] = []
        lost: list[str] = []
        barrier = threading.Barrier(32)

        def publish(release: Release) -> None:
            admin = EngineAdmin(server.url)
            try:
                barrier.wait()
                published, _ = deploy(
                    store,
                    admin,
                    release,
                    mirror=lambda r: registry.set_champion(tracking, S, r.model_uri or ""),
                )
                won.append(published)
            except HeadMoved as e:
                lost.append(e.code or "")
            finally:
                admin.close()

        threads = [threading.Thread(target=publish, args=(r,)) for r in releases]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert len(won) == 1 and len(lost) == 31 and set(lost) == {"head_moved"}
        chain = store.list_releases(S)
        assert [r.seq for r in chain] == [0, 1]
        assert chain[1].id == won[0].id and chain[1].parent_id == parent
        assert store.get_scenario(S).head_release_id == won[0].id
        champion = registry.champion(tracking, S)
        assert champion is not None and champion[1] == won[0].id
        # the API agrees
        rows = httpx.get(f"{server.url}/reef/scenarios/{S}/releases").json()["data"]
        assert rows[0]["release_id"] == won[0].id and rows[0]["current"]
        assert rows[0]["model_uri"] == won[0].model_uri
    finally:
        store.close()
