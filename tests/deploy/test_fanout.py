"""Deploy fan-out: a release reaches every engine that serves the scenario, or none of them.

Three real serving processes' apps (the tiny model, one SQLite database and one artifact
directory between them, as replicas share Postgres and S3) and a deploy configured with all of
their admin URLs (engine.fleet.admin_urls), as a worker's deploy is. One engine that fails: a Reef
whose base model is another one (it refuses to load the adapter: the stage fails there), or an
HTTP server that loads and then answers 500 to verify. Either way the head stays, the healthy
engines are unstaged, and the error names the failing engine. A replica that was down during a
deploy serves the head once it starts."""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from reef.cli.testing import InProcessReef
from reef.deploy.engine import DeployError, EngineAdmin, Fleet, engines_for
from reef.deploy.release import deploy
from reef.errors import ConfigError
from reef.models import resolve_model
from reef.records import Candidate, Release, new_id, utcnow
from reef.settings import load_settings
from reef.store.sql import open_store
from tests.engines.test_embedded_releases import lora
from tests.reefserver import wait_for

S = "fleet"
TINY = resolve_model("tiny", Path.home() / ".cache" / "reef" / "models")


class _Shared:
    """What replicas share: one database, one artifact store."""

    def __init__(self, root: Path):
        self.root = root
        self.database_url = f"sqlite:///{root / 'reef.db'}"

    def reef(self, name: str, **overrides: Any) -> InProcessReef:
        """A replica's app (not started), with its own state directory."""
        engine = {"allow_local_paths": True, **overrides.pop("engine", {})}
        return InProcessReef(
            self.root / name,
            store={"database_url": self.database_url},
            artifacts={"url": str(self.root / "artifacts")},
            engine=engine,
            **overrides,
        )


class _RefusesVerify(BaseHTTPRequestHandler):
    """An engine's admin routes that load anything and then fail the smoke generation."""

    def do_GET(self) -> None:  # /reef/engine/variants
        self._answer(200, {"object": "list", "data": []})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.path == "/reef/engine/verify":
            self._answer(500, {"error": {"message": "verifying: a logit is not finite"}})
        else:
            self._answer(200, {"loaded": True})

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def _other_base(out: Path) -> Path:
    """A model of the tiny one's family with another hidden size (its tokenizer and chat
    template): an adapter trained for the tiny model does not fit it."""
    model = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32)
    config = model.config
    config.hidden_size, config.intermediate_size = 256, 512
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    for f in TINY.iterdir():
        if f.is_file() and not (out / f.name).exists():
            shutil.copy(f, out / f.name)
    return out


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> _Shared:
    return _Shared(tmp_path_factory.mktemp("fleet"))


@pytest.fixture(scope="module")
def healthy(shared: _Shared) -> Iterator[list[InProcessReef]]:
    """Two replicas up from the start (the third is started by the catch-up test)."""
    a, b = shared.reef("a").start(), shared.reef("b")
    try:
        b.start()
        yield [a, b]
    finally:
        b.stop()
        a.stop()


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("adapters")
    out = []
    for seed in (1, 2, 3):
        model = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32)
        lora(model, seed, root / f"a{seed}")
        out.append(root / f"a{seed}")
    return out


def _release(store: Any, path: Path) -> Release:
    return Release(
        id=new_id("rel"),
        scenario=S,
        seq=0,
        parent_id=store.ensure_scenario(S).head_release_id,
        kind="adapter",
        created_at=utcnow(),
        uri=str(path),
        operation="training",
    )


def _fleet(*urls: str) -> Any:
    """The engines a worker configured with these admin URLs deploys to."""
    return engines_for(load_settings(engine={"fleet": {"admin_urls": list(urls)}}))


def _variants(server: InProcessReef) -> list[str]:
    admin = EngineAdmin(server.url)
    try:
        return admin.variants()
    finally:
        admin.close()


def _deploy(store: Any, servers: list[InProcessReef], files: Path) -> tuple[Release, Any]:
    fleet = _fleet(*(s.url for s in servers))
    try:
        return deploy(store, fleet, _release(store, files))
    finally:
        fleet.close()


def _served_release(server: InProcessReef) -> str:
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        headers={"x-reef-scenario": S},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return r.headers["x-reef-release-id"]


@contextlib.contextmanager
def _refusing_verify() -> Iterator[str]:
    """The URL of an HTTP server with _RefusesVerify's answers."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RefusesVerify)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(params=["other_base", "verify_500"])
def failing(request: pytest.FixtureRequest, shared: _Shared, tmp_path: Path) -> Iterator[str]:
    """The admin URL of an engine that fails the stage."""
    if request.param == "other_base":
        with shared.reef("other", engine={"model": str(_other_base(tmp_path / "m"))}) as srv:
            yield srv.url
    else:
        with _refusing_verify() as url:
            yield url


def test_one_failing_engine_keeps_the_head_and_unstages_the_others(
    shared: _Shared, healthy: list[InProcessReef], adapters: list[Path], failing: str
) -> None:
    store = open_store(shared.database_url)
    fleet = _fleet(*(s.url for s in healthy), failing)
    try:
        assert isinstance(fleet, Fleet) and len(fleet.members) == 3
        release = _release(store, adapters[0])
        before = store.list_releases(S)
        with pytest.raises(DeployError) as e:
            deploy(store, fleet, release)
        message = str(e.value)
        assert f"failed on 1 of 3 engines (engine {failing}:" in message, message
        assert "the head stays" in message
        assert f"; unloaded again from {healthy[0].url}, {healthy[1].url};" in message
        assert store.list_releases(S) == before
        assert store.get_scenario(S).head_release_id == release.parent_id
        for server in healthy:  # loaded and verified there, then unloaded again
            assert _variants(server) == [], server.url
            assert _served_release(server) == release.parent_id
    finally:
        fleet.close()
        store.close()


def test_every_engine_serves_the_release_and_a_late_one_catches_up(
    shared: _Shared, healthy: list[InProcessReef], adapters: list[Path]
) -> None:
    store = open_store(shared.database_url)
    late = shared.reef("c")  # down during the first deploy
    try:
        first, _ = _deploy(store, healthy, adapters[1])
        for server in healthy:
            assert _served_release(server) == first.id
        late.start()  # starts after the head moved: loads it on start, before any call
        wait_for("the late replica loads the head", lambda: _variants(late), late, timeout=60)
        assert _variants(late) == [f"{S}@{first.id}"]
        assert _served_release(late) == first.id

        everyone = [*healthy, late]
        second, timings = _deploy(store, everyone, adapters[2])
        assert sorted(timings["verify"]) == sorted(s.url for s in everyone)
        assert store.get_scenario(S).head_release_id == second.id
        for server in everyone:
            assert _served_release(server) == second.id
            assert f"{S}@{second.id}" in _variants(server)
    finally:
        late.stop()
        store.close()


def test_a_promote_through_a_replica_reaches_every_engine(
    shared: _Shared, healthy: list[InProcessReef], adapters: list[Path]
) -> None:
    """A serving process's own chain (promote, rollback, harness releases) fans out too: its
    engine in process (its own entry in the list is recognized), the others over HTTP."""
    store = open_store(shared.database_url)
    head = store.head_release(S)
    now = utcnow()
    held = store.add_candidate(
        Candidate(
            id=new_id("rel"),
            scenario=S,
            parent_id=head.id,
            kind="adapter",
            created_at=now,
            status="pending",
            uri=str(adapters[0]),
            content_hash=None,
            recipe="sft",
            dataset_id=None,
            metrics={},
            gate={"status": "pending", "policy": "manual"},
            model_uri=None,
            updated_at=now,
        )
    )
    try:
        with _refusing_verify() as broken:
            replica = shared.reef("d")
            replica.overrides["engine"]["fleet"] = {
                "admin_urls": [replica.url, healthy[0].url, broken]
            }
            with replica:
                wait_for("the replica loads the head", lambda: _variants(replica), replica, 60)
                before = _variants(healthy[0])
                r = httpx.post(
                    f"{replica.url}/reef/scenarios/{S}/promote",
                    json={"release_id": held.id},
                    timeout=120,
                )
                assert r.status_code == 502, r.text
                message = r.json()["error"]["message"]
                # its own entry is this process's engine: three engines, not four
                assert f"failed on 1 of 3 engines (engine {broken}: /reef/engine/verify" in message
                assert f"; unloaded again from {replica.url}, {healthy[0].url};" in message
                assert store.head_release(S).id == head.id
                assert store.get_candidate(S, held.id).status == "pending"  # to try again
                assert _variants(replica) == [f"{S}@{head.id}"]
                assert _variants(healthy[0]) == before
    finally:
        store.close()


def test_registered_engines_get_every_deploy_and_a_silent_one_drops_out(
    tmp_path: Path, adapters: list[Path]
) -> None:
    """engine.fleet.registry: replicas enter the database with a heartbeat and deploys reach
    every live one; one that stops leaves, one that goes silent (crashed) is left out after
    engine.fleet.registry_ttl_s, and one that starts later loads the head."""
    shared = _Shared(tmp_path)
    ttl = 2.0
    register = {"fleet": {"registry": True, "heartbeat_s": 0.5, "registry_ttl_s": ttl}}
    first_up, stops, late = (shared.reef(n, engine=register) for n in ("r1", "r2", "late"))
    store = open_store(shared.database_url)
    worker = load_settings(engine=register, store={"database_url": shared.database_url})
    fleet = engines_for(worker, store=store)  # a worker's: no admin URL, the registry only
    try:
        first_up.start()
        stops.start()
        assert store.live_engines(ttl) == sorted([first_up.url, stops.url])
        first, timings = deploy(store, fleet, _release(store, adapters[0]))
        assert sorted(timings["verify"]) == sorted([first_up.url, stops.url])
        assert [_served_release(s) for s in (first_up, stops)] == [first.id, first.id]

        stops.stop()  # a clean stop leaves the registry
        assert store.live_engines(ttl) == [first_up.url]
        crashed = "http://127.0.0.1:9"  # a heartbeat nobody renews
        store.register_engine(crashed, started=True)
        with pytest.raises(DeployError, match=f"failed on 1 of 2 engines \\(engine {crashed}:"):
            deploy(store, fleet, _release(store, adapters[1]))
        wait_for(
            "the silent engine's entry expires",
            lambda: len(store.live_engines(ttl)) == 1,
            first_up,
            10,
        )
        second, timings = deploy(store, fleet, _release(store, adapters[1]))
        assert timings["verify"]["model"] == f"{S}@{second.id}"  # one engine's answer

        late.start()  # down during that deploy: registers, and loads the head on start
        assert late.url in store.live_engines(ttl)
        wait_for("the late replica loads the head", lambda: _variants(late), late, timeout=60)
        assert _variants(late) == [f"{S}@{second.id}"]
        assert _served_release(late) == second.id
    finally:
        fleet.close()  # type: ignore[attr-defined]
        for server in (late, stops, first_up):
            server.stop()
        store.close()


def test_fleet_settings_are_checked() -> None:
    urls = load_settings(
        engine={"fleet": {"admin_urls": ["http://a:8900/", "http://b:8900", "http://a:8900"]}}
    )
    assert urls.engine.fleet.admin_urls == ("http://a:8900", "http://b:8900")
    with pytest.raises(ConfigError, match="'a:8900' is not an http"):
        load_settings(engine={"fleet": {"admin_urls": ["a:8900"]}})
    with pytest.raises(ConfigError, match="registry_ttl_s must be longer"):
        load_settings(engine={"fleet": {"registry": True, "heartbeat_s": 10, "registry_ttl_s": 5}})
