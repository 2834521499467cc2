"""Publishing and promoting are exactly once per candidate, whatever fails on the way.

Driven through a served Reef app over HTTP (the chain of a worker process reaches its engine
through the admin routes). Failures are injected into the real path: the engine's verify step
fails, or the store "dies" right after the compare-and-swap, before the candidate's status is
written (a process killed there)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from reef import registry
from reef.cli.testing import InProcessReef
from reef.deploy.candidates import promoted
from reef.deploy.chain import ReleaseChain
from reef.deploy.release import deploy
from reef.errors import Conflict, EngineUnavailable, ReefError
from reef.experience import collect, receipts
from reef.gate import Decision
from reef.provenance import Provenance
from reef.records import Candidate
from reef.store.sql import SQLStore
from reef.testing.traffic import traffic
from reef.variants import Variants
from tests.engines.test_embedded_releases import lora
from tests.faults.invariants import loop_violations


class Killed(BaseException):
    """The process dies here: nothing after it runs, no handler catches it."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    with InProcessReef(tmp_path_factory.mktemp("once")) as srv:
        yield srv


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from reef.models import resolve_model

    tiny = resolve_model("tiny", Path.home() / ".cache" / "reef" / "models")
    out = tmp_path_factory.mktemp("adapter") / "adapter"
    lora(AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32), 3, out)
    return out


def _candidate(chain: ReleaseChain, scenario: str, files: Path, status: str) -> Candidate:
    chain.store.ensure_scenario(scenario)
    head = chain.store.head_release(scenario)
    decision = Decision(status=status, policy="always", test="none", reason="test", n=0)  # type: ignore[arg-type]
    return chain.add_weights_candidate(
        head,
        files,
        "adapter",
        decision,
        Provenance(recipe="sft", dataset_id="sha256:test", base_model="tiny"),
    )


def _loaded(chain: ReleaseChain, scenario: str) -> list[str]:
    return [v for v in chain.engine.variants() if v.startswith(f"{scenario}@")]


def _failing_verify(monkeypatch: pytest.MonkeyPatch, times: int) -> dict[str, int]:
    """The engine's verify step fails `times` times (a 503, as an engine that is busy), then
    runs for real."""
    calls = {"n": 0}
    real = Variants.verify

    async def verify(self: Variants, name: str) -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] <= times:
            raise EngineUnavailable(f"verify failed ({calls['n']})")
        return await real(self, name)

    monkeypatch.setattr(Variants, "verify", verify)
    return calls


def test_a_retry_after_a_failed_verify_publishes_once(
    server: InProcessReef, adapter: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _failing_verify(monkeypatch, times=1)
    with ReleaseChain.for_settings(server.settings) as chain:
        cand = _candidate(chain, "once-verify", adapter, "accepted")
        base = chain.store.head_release("once-verify")
        release = chain.publish(cand, attempts=3, retry_delay_s=0)
        assert calls["n"] == 2
        chain_now = chain.store.list_releases("once-verify")
        assert [r.id for r in chain_now] == [base.id, cand.id]
        assert chain.store.get_candidate("once-verify", cand.id).status == "published"
        assert chain.store.head_release("once-verify").id == release.id == cand.id
        assert registry.champion(server.settings.tracking_uri, "once-verify")[1] == cand.id
        # publishing it again is a no-op that answers the same release
        assert chain.publish(cand).id == cand.id
        assert len(chain.store.list_releases("once-verify")) == 2


def test_a_failed_candidate_is_never_published(
    server: InProcessReef, adapter: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _failing_verify(monkeypatch, times=10)
    with ReleaseChain.for_settings(server.settings) as chain:
        cand = _candidate(chain, "once-failed", adapter, "accepted")
        base = chain.store.head_release("once-failed")
        with pytest.raises(ReefError, match="verify failed"):
            chain.publish(cand, attempts=2, retry_delay_s=0)
        assert chain.store.get_candidate("once-failed", cand.id).status == "failed"
        monkeypatch.undo()  # the engine is healthy again: a retry still must not publish it
        with pytest.raises(Conflict, match="is failed"):
            chain.publish(cand, attempts=3, retry_delay_s=0)
        assert chain.store.list_releases("once-failed") == [base]
        assert _loaded(chain, "once-failed") == []  # nothing left staged


def test_killed_between_the_swap_and_the_status(
    server: InProcessReef, adapter: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = SQLStore.set_candidate_status

    def dies(self: SQLStore, scenario: str, cid: str, status: str, **kw: Any) -> Candidate:
        if status == "published":
            raise Killed()
        return real(self, scenario, cid, status, **kw)

    with ReleaseChain.for_settings(server.settings) as chain:
        cand = _candidate(chain, "once-killed", adapter, "accepted")
        monkeypatch.setattr(SQLStore, "set_candidate_status", dies)
        with pytest.raises(Killed):
            chain.publish(cand, attempts=3, retry_delay_s=0)
        monkeypatch.undo()
        # the head moved, the status was never written
        assert chain.store.head_release("once-killed").id == cand.id
        assert chain.store.get_candidate("once-killed", cand.id).status == "pending"
    with ReleaseChain.for_settings(server.settings) as chain:  # the retry, in a new process
        release = chain.publish(cand, attempts=3, retry_delay_s=0)
        assert release.id == cand.id
        assert chain.store.get_candidate("once-killed", cand.id).status == "published"
        assert [r.id for r in chain.store.list_releases("once-killed")][-1] == cand.id
        assert len(chain.store.list_releases("once-killed")) == 2


def test_a_promote_that_moved_the_head_is_finished_by_the_next(
    server: InProcessReef, adapter: Path
) -> None:
    with ReleaseChain.for_settings(server.settings) as chain:
        cand = _candidate(chain, "once-promote", adapter, "pending")
        # an earlier promote moved the head, then died before the candidate said so
        deploy(chain.store, chain.engine, promoted(cand, chain.store.head_release("once-promote")))
        assert chain.store.get_candidate("once-promote", cand.id).status == "pending"
        release = chain.promote("once-promote", cand.id, by="ops")
        assert release.id == cand.id and "approval" not in release.metadata  # the first's
        assert chain.store.get_candidate("once-promote", cand.id).status == "published"
        assert len(chain.store.list_releases("once-promote")) == 2
        with pytest.raises(Conflict, match="is published"):  # done: a second promote is refused
            chain.promote("once-promote", cand.id, by="ops")


def test_an_error_that_is_not_a_reef_error_unstages(
    server: InProcessReef, adapter: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def verify(self: Variants, name: str) -> dict[str, Any]:
        raise RuntimeError("CUDA error: an illegal memory access")  # torch, say

    monkeypatch.setattr(Variants, "verify", verify)
    with ReleaseChain.for_settings(server.settings) as chain:
        cand = _candidate(chain, "once-torch", adapter, "accepted")
        with pytest.raises(ReefError):  # the route answers 500 to the chain's admin client
            chain.publish(cand, attempts=1)
        assert _loaded(chain, "once-torch") == []
        assert chain.store.get_candidate("once-torch", cand.id).status == "failed"
        assert len(chain.store.list_releases("once-torch")) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_whose_variant_leaves_before_the_engine_takes_it_is_answered(
    server: InProcessReef, adapter: Path, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """A rollback or a retired canary unloads a variant in another task right after a call
    chose it (a rollout's end, under traffic): the call is still answered, by its release."""
    import httpx

    scenario = f"once-unloaded-{int(stream)}"
    with ReleaseChain.for_settings(server.settings) as chain:
        release = chain.publish(_candidate(chain, scenario, adapter, "accepted"))
    real = Variants.model_for
    raced: list[str] = []

    async def model_for(self: Variants, scenario_name: str, release_id: str) -> str | None:
        name = await real(self, scenario_name, release_id)
        if name is not None and not raced:
            raced.append(name)
            await self.unload(name)  # what the other task does between the two steps
        return name

    monkeypatch.setattr(Variants, "model_for", model_for)
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        headers={"x-reef-scenario": scenario},
        json={
            "model": "tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3,
            "stream": stream,
        },
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert raced and r.headers["x-reef-release-id"] == release.id


def test_recover_finishes_a_candidate_whose_swap_went_through(
    server: InProcessReef, adapter: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed between the swap and the status: nobody publishes that candidate again,
    so the next worker's recover finishes it (its status, the MLflow alias)."""
    real = SQLStore.set_candidate_status

    def dies(self: SQLStore, scenario: str, cid: str, status: str, **kw: Any) -> Candidate:
        if status == "published":
            raise Killed()
        return real(self, scenario, cid, status, **kw)

    with ReleaseChain.for_settings(server.settings) as chain:
        cand = _candidate(chain, "once-recovered", adapter, "accepted")
        monkeypatch.setattr(SQLStore, "set_candidate_status", dies)
        with pytest.raises(Killed):
            chain.publish(cand, attempts=1)
        monkeypatch.undo()
    with ReleaseChain.for_settings(server.settings) as chain:  # the next worker
        assert chain.recover("once-recovered") == [f"{cand.id}: on the chain, marked published"]
        assert chain.store.get_candidate("once-recovered", cand.id).status == "published"
        champion = registry.champion(server.settings.tracking_uri, "once-recovered")
        assert champion is not None and champion[1] == cand.id
        assert chain.recover("once-recovered") == []  # nothing left: idempotent


def test_recover_retires_only_accepted_candidates_the_head_left_behind(
    server: InProcessReef, adapter: Path
) -> None:
    """Two runs from one head: the second published, the first died after registering. Its
    candidate can never be published (its swap names the old head): recover marks it failed.
    A candidate held for a human stays pending: a promote puts it on today's head."""
    with ReleaseChain.for_settings(server.settings) as chain:
        orphan = _candidate(chain, "once-orphan", adapter, "accepted")
        held = _candidate(chain, "once-orphan", adapter, "pending")
        assert chain.recover("once-orphan") == []  # the head has not moved: a live run may
        chain.publish(_candidate(chain, "once-orphan", adapter, "accepted"))
        (line,) = chain.recover("once-orphan")
        assert line.startswith(f"{orphan.id}: its run ended before publishing it")
        failed = chain.store.get_candidate("once-orphan", orphan.id)
        assert failed.status == "failed" and "head has moved on" in (failed.message or "")
        assert chain.store.get_candidate("once-orphan", held.id).status == "pending"


def test_recover_moves_the_champion_alias_a_failed_mirror_left_behind(
    server: InProcessReef, adapter: Path
) -> None:
    """A publish whose MLflow was away after the swap leaves the alias on the release before
    (the deploy logs it and goes on): the next recover moves it to the head, once."""
    s = "once-alias"
    with ReleaseChain.for_settings(server.settings) as chain:
        first = chain.publish(_candidate(chain, s, adapter, "accepted"))
        second = chain.publish(_candidate(chain, s, adapter, "accepted"))
        assert first.model_uri and second.model_uri
        # what the failed mirror leaves: the alias where the release before put it
        registry.set_champion(server.settings.tracking_uri, s, first.model_uri)
        (line,) = chain.recover(s)
        assert line == f"MLflow's champion alias named {first.id}: moved to the head {second.id}"
        champion = registry.champion(server.settings.tracking_uri, s)
        assert champion is not None and champion[1] == second.id
        assert chain.recover(s) == []  # nothing left: idempotent


# A worker's publish, in a process of its own: the batch's receipts (from the experience as the
# evolve run collects it) go with the candidate's compare-and-swap; REEF_FAULTS kills it there.
_PUBLISH = """
import json, sys
from reef.deploy.chain import ReleaseChain
from reef.experience import collect, receipts
from reef.settings import load_settings

overrides, scenario, candidate_id = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
with ReleaseChain.for_settings(load_settings(None, **overrides)) as chain:
    batch = collect(chain.store, scenario, "scored", recipe="sft").samples
    made = receipts(scenario, "sft", batch, candidate_id)
    chain.publish(chain.store.get_candidate(scenario, candidate_id), consumptions=made)
"""


def test_killed_right_after_the_swap_its_batch_is_consumed_once(
    server: InProcessReef, adapter: Path, tmp_path: Path
) -> None:
    """SIGKILLed right after the head's compare-and-swap (reef.faults `after_cas`), before
    anything else is written: the batch's consumption receipts went with the swap, so the
    release is on the chain with its batch consumed; the next worker's recover finishes the
    candidate, and nothing is left to train again."""
    s = "once-cas-kill"
    reported = traffic(server, s, 3, report=lambda i, rid: {"score": 1.0}, max_tokens=3)
    with ReleaseChain.for_settings(server.settings) as chain:
        cand = _candidate(chain, s, adapter, "accepted")
    env = {**os.environ, "REEF_FAULTS": f"after_cas@{s}", "REEF_FAULTS_DIR": str(tmp_path)}
    args = [json.dumps(server.overrides), s, cand.id]
    killed = subprocess.run(
        [sys.executable, "-c", _PUBLISH, *args], env=env, capture_output=True, text=True
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert "fault injected: SIGKILL at after_cas" in killed.stderr
    with ReleaseChain.for_settings(server.settings) as chain:  # the next worker
        store = chain.store
        assert store.head_release(s).id == cand.id
        assert store.get_candidate(s, cand.id).status == "pending"  # the kill came first
        assert store.consumed_record_ids(s, "sft") == set(reported)  # in the swap's transaction
        assert chain.recover(s) == [f"{cand.id}: on the chain, marked published"]
        assert isinstance(store, SQLStore)
        assert loop_violations(store, s, set(reported)) == []
        again = collect(store, s, "scored", recipe="sft")
        assert again.samples == () and again.dropped["consumed"] == len(reported)


def test_a_publish_that_fails_consumes_nothing(
    server: InProcessReef, adapter: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The receipts are written if and only if the head moved: a batch whose candidate failed
    to deploy stays eligible, to be trained again."""
    s = "once-unconsumed"
    reported = traffic(server, s, 2, report=lambda i, rid: {"score": 1.0}, max_tokens=3)
    _failing_verify(monkeypatch, times=10)
    with ReleaseChain.for_settings(server.settings) as chain:
        cand = _candidate(chain, s, adapter, "accepted")
        batch = collect(chain.store, s, "scored", recipe="sft").samples
        assert len(batch) == len(reported)
        made = receipts(s, "sft", batch, cand.id)
        with pytest.raises(ReefError, match="verify failed"):
            chain.publish(cand, attempts=1, consumptions=made)
        assert chain.store.get_candidate(s, cand.id).status == "failed"
        assert chain.store.consumed_record_ids(s, "sft") == set()
        assert len(collect(chain.store, s, "scored", recipe="sft").samples) == len(reported)


@pytest.mark.faults  # two MLflow registrations: ~9 s, in the fault matrix's stage
def test_a_candidate_the_store_did_not_take_leaves_no_mlflow_version(
    server: InProcessReef, adapter: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A candidate write that fails after its MLflow version exists (the database away) tags
    the version; the scenario's next recover deletes it when the store has no such candidate,
    and only untags it when the write went through and its answer was lost."""
    from mlflow import MlflowClient

    from reef.errors import StoreError

    scenario = "once-unrecorded"
    uri = server.settings.tracking_uri
    with ReleaseChain.for_settings(server.settings) as chain:
        real = type(chain.store).add_candidate
        tries = {"n": 0}

        def add_candidate(self: Any, candidate: Candidate, events: Any = ()) -> Candidate:
            tries["n"] += 1
            if tries["n"] == 2:  # written, then the connection drops before the answer
                real(self, candidate, events)
            raise StoreError(f"database away ({tries['n']})")

        monkeypatch.setattr(type(chain.store), "add_candidate", add_candidate)
        for _ in range(2):
            with pytest.raises(StoreError):
                _candidate(chain, scenario, adapter, "rejected")
        monkeypatch.undo()
        tagged = registry.unrecorded(uri, scenario)
        assert len(tagged) == 2
        kept = chain.store.list_candidates(scenario)
        assert [c.id for c in kept] == [tagged[1][1]]
        done = chain.recover(scenario)
        assert len(done) == 2 and registry.unrecorded(uri, scenario) == []
        versions = MlflowClient(uri).search_model_versions(f"name = 'reef-{scenario}'")
        named = {v.tags.get(registry.RELEASE_ID) for v in versions}
        assert tagged[0][1] not in named and tagged[1][1] in named
        assert chain.recover(scenario) == []  # settled: nothing more to do
