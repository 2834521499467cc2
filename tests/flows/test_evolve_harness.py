"""Harness evolution through the evolve flow, run in-process against a served Reef app (tiny
model): consistently failing feedback → GEPA search with the served model as proposer → paired
episodes of candidate vs head (N repeats) → the gate decides, with the numbers stored on the
candidate and in MLflow. A rejected candidate leaves the head alone; an accepted one is
released with the head's weights and serves the next call. Infrastructure failures in the
evaluation are their own outcome, and the head's episodes are cached."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from reef.cli.testing import InProcessReef
from reef.deploy.engine import EngineAdmin
from reef.harness import Harness
from reef.recipes.harness.episodes import (
    EpisodeError,
    Task,
    correction_scorer,
    paired_evaluation,
)
from reef.testing.process import free_port
from reef.testing.traffic import traffic

WANTED = "Paris is the capital of France."


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    with InProcessReef(tmp_path_factory.mktemp("harness-evolve")) as srv:
        yield srv


def _overrides(srv: InProcessReef, policy: str) -> dict:
    return {
        "server": {"state_dir": str(srv.state_dir), "port": srv.port},
        "engine": {"model": "tiny"},
        "reef": {
            "recipe": "harness",
            "batch_size": 6,
            "params": {
                "max_tokens": 8,
                "proposer_max_tokens": 48,
                "max_metric_calls": 10,
                "repeats": 2,
            },
        },
        "gate": {"policy": policy},  # the default share of evaluation samples, as the status
    }


def _failing_traffic(srv: InProcessReef, scenario: str, n: int = 6) -> None:
    """`n` questions, each answered wrongly and reported with score 0 and a correction."""
    feedback = {"text": "Wrong: name the city.", "correction": WANTED}
    traffic(
        srv,
        scenario,
        n,
        prompt="Question {i}: what is the capital of France?",
        report=lambda i, rid: {"score": 0.0, "feedback": feedback},
        max_tokens=6,
        temperature=0,
    )


def _chain(srv: InProcessReef, scenario: str) -> list[dict]:
    return list(httpx.get(f"{srv.url}/reef/scenarios/{scenario}/releases").json()["data"])


def test_failing_feedback_makes_a_candidate_the_gate_judges(
    server: InProcessReef, prefect_server: None
) -> None:
    from reef import registry
    from reef.flows.evolve import evolve

    # 16 questions: some are evaluation samples (chosen by their content), the rest train
    _failing_traffic(server, "fails", 16)
    before = _chain(server, "fails")
    status = httpx.get(f"{server.url}/reef/scenarios/fails/status").json()
    held = status["dropped"]["held_out"]
    assert held >= 1 and status["eligible"] == 16 - held
    result = evolve("fails", overrides=_overrides(server, "improve"))
    assert result["status"] in ("rejected", "published"), result
    gate = result["gate"]
    # Paired evaluation on the evaluation samples: both sides, 2 repeats each.
    assert gate["n"] == held and gate["mean_candidate"] is not None
    assert gate["mean_head"] is not None
    cands = httpx.get(f"{server.url}/reef/scenarios/fails/candidates").json()["data"]
    assert len(cands) == 1
    cand = cands[0]
    assert cand["operation"] == "harness" and cand["recipe"] == "harness"
    assert cand["gate"] == gate  # the numbers are stored with the candidate
    m = cand["metrics"]
    assert m["eval_tasks"] == held and m["eval_repeats"] == 2 and m["eval_infra_failures"] == 0
    assert m["eval_episodes"] == 4 * held and m["search_proposals"] >= 1
    harness = cand["metadata"]["harness"]
    assert harness["content_hash"] == cand["content_hash"]
    assert cand["metadata"]["weights_release_id"] == before[0]["release_id"]

    tracking = f"sqlite:///{(server.state_dir / 'mlflow.db').resolve()}"
    tags = registry.get_tags(tracking, cand["model_uri"])
    assert tags["reef.kind"] == "harness" and tags["reef.release_id"] == cand["release_id"]
    assert tags["reef.gate"] == gate["status"]
    if result["status"] == "rejected":
        assert cand["status"] == "rejected"
        assert _chain(server, "fails") == before  # the head did not move
    else:
        assert _chain(server, "fails")[0]["release_id"] == cand["release_id"]


@pytest.mark.loop
def test_an_accepted_harness_is_released_and_serves(
    server: InProcessReef, prefect_server: None, tmp_path: Path
) -> None:
    from reef import registry
    from reef.flows.evolve import evolve

    _failing_traffic(server, "always")
    base = _chain(server, "always")[0]
    # a guard the tiny model fails on every task (it never answers "Paris"), allowed to drop
    # everything: it holds, and with review.guard_failed its tasks wait for a reviewer
    tasks = tmp_path / "capitals.jsonl"
    tasks.write_text(
        "".join(
            json.dumps({"id": f"t{i}", "messages": [{"role": "user", "content": q}], "answer": a})
            + "\n"
            for i, (q, a) in enumerate([("Capital of France?", "Paris"), ("Of Peru?", "Lima")])
        )
    )
    overrides = _overrides(server, "always")
    overrides["gate"]["guards"] = [
        {"name": "capitals", "dataset": str(tasks), "scorer": "exact", "max_drop": 1.0}
    ]
    overrides["review"] = {"guard_failed": True}
    result = evolve("always", overrides=overrides)
    assert result["status"] == "published", result
    assert result["guard_answers_kept"] == 2
    _guard_answers_queued(server, "always", result["candidate_id"], {"t0": "Paris", "t1": "Lima"})
    chain = _chain(server, "always")
    head = chain[0]
    assert head["release_id"] == result["release_id"] and head["operation"] == "harness"
    assert head["kind"] == base["kind"] == "base"  # the weights did not change
    assert head["metadata"]["weights_release_id"] == base["release_id"]

    got = httpx.get(f"{server.url}/reef/harness", params={"scenario": "always"}).json()
    assert got["release_id"] == head["release_id"] and got["files"]
    assert got["content_hash"] == head["content_hash"]
    assert got["evaluation"]["gate"]["status"] == "accepted"

    client = openai.OpenAI(
        base_url=server.base_url, api_key="none", default_headers={"x-reef-scenario": "always"}
    )
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=2
    )
    assert raw.headers["x-reef-release-id"] == head["release_id"]
    # the scenario's first harness is injected for every client, and the record says so
    assert got["inject"] is True
    rec = httpx.get(
        f"{server.url}/reef/scenarios/always/records/{raw.headers['x-reef-agent-record-id']}"
    ).json()
    assert rec["tags"]["reef.harness_release"] == head["release_id"]

    tracking = f"sqlite:///{(server.state_dir / 'mlflow.db').resolve()}"
    champ = registry.champion(tracking, "always")
    assert champ is not None and champ[1] == head["release_id"]

    # The batch was consumed: a second run has nothing new to learn from.
    again = evolve("always", overrides=_overrides(server, "always"))
    assert again["status"] == "not_ready", again


def _guard_answers_queued(
    server: InProcessReef, scenario: str, candidate: str, expected: dict[str, str]
) -> None:
    """The harness candidate's failed guard answers are queued (reason guard), one per task."""
    from reef.records import GUARD_CANDIDATE_TAG, GUARD_EXPECTED_TAG, GUARD_TASK_TAG
    from reef.store.sql import open_store

    store = open_store(server.settings.database_url)
    try:
        items = store.review_items(scenario, None, 10)
        kept = store.get_records(scenario, [i.record_id for i in items])
    finally:
        store.close()
    assert {i.reason for i in items} == {"guard"}
    assert {r.tags[GUARD_TASK_TAG]: r.tags[GUARD_EXPECTED_TAG] for r in kept} == expected
    assert {r.tags[GUARD_CANDIDATE_TAG] for r in kept} == {candidate}


def test_an_upstream_engine_evolves_its_harness(
    tmp_path_factory: pytest.TempPathFactory, prefect_server: None
) -> None:
    """No weights to train (a hosted model): the harness still evolves, is released on the
    chain and served; an executable one waits for review and is promoted."""
    from reef.flows.evolve import evolve

    with InProcessReef(tmp_path_factory.mktemp("back")) as back:
        upstream = {"kind": "upstream", "upstream": {"url": back.base_url}}
        with InProcessReef(tmp_path_factory.mktemp("front"), engine=upstream) as front:
            _failing_traffic(front, "hosted")
            base = _chain(front, "hosted")[0]
            overrides = _overrides(front, "always")
            overrides["engine"] = {
                "kind": "upstream",
                "upstream": {"url": back.base_url},
                "model": "tiny",
            }
            result = evolve("hosted", overrides=overrides)
            assert result["status"] == "published", result
            head = _chain(front, "hosted")[0]
            assert head["operation"] == "harness" and head["kind"] == "base"
            assert head["metadata"]["weights_release_id"] == base["release_id"]

            client = openai.OpenAI(
                base_url=front.base_url,
                api_key="none",
                default_headers={"x-reef-scenario": "hosted"},
            )
            raw = client.chat.completions.with_raw_response.create(
                model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=2
            )
            assert raw.headers["x-reef-release-id"] == head["release_id"]
            rec = httpx.get(
                f"{front.url}/reef/scenarios/hosted/records/{raw.headers['x-reef-agent-record-id']}"
            ).json()
            assert rec["tags"]["reef.harness_release"] == head["release_id"]

            held = httpx.post(
                f"{front.url}/reef/scenarios/hosted/harness",
                json={"edits": [{"op": "create", "path": "scripts/x.sh", "content": "echo"}]},
                timeout=60,
            )
            assert held.status_code == 202, held.text
            r = httpx.post(
                f"{front.url}/reef/scenarios/hosted/promote",
                json={"release_id": held.json()["release_id"]},
                timeout=60,
            )
            assert r.status_code == 201, r.text
            assert _chain(front, "hosted")[0]["release_id"] == held.json()["release_id"]


def test_paired_evaluation_caches_the_head_and_counts_infra_failures(
    server: InProcessReef,
) -> None:
    admin = EngineAdmin(server.url)
    dead = EngineAdmin(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    httpx.post(f"{server.url}/reef/scenarios", json={"name": "pairs"})
    tasks = [
        Task(
            f"t{i}",
            [{"role": "user", "content": f"Capital of France? ({i})"}],
            {"correction": WANTED},
        )
        for i in range(3)
    ]
    head = Harness.empty()
    candidate = Harness({"AGENTS.md": "Answer with the city's name only.\n"})

    def generate(via: EngineAdmin):  # type: ignore[no-untyped-def]
        def run(messages: list[dict], seed: int) -> str:
            from reef.errors import EngineUnavailable

            try:
                return via.generate("pairs", messages, max_tokens=6, temperature=0.7, seed=seed)
            except EngineUnavailable as e:
                raise EpisodeError(e.message, infra=True) from None

        return run

    cache: dict[str, float] = {}
    kwargs = {
        "repeats": 2,
        "scorer": correction_scorer,
        "weights_id": "base",
        "sampling": {"temperature": 0.7},
        "cache": cache,
    }
    first = paired_evaluation(generate(admin), tasks, candidate, head, **kwargs)  # type: ignore[arg-type]
    assert first.task_ids == ["t0", "t1", "t2"] and first.episodes == 12
    assert first.head_cached == 0 and first.infra_failures == 0 and len(cache) == 6

    # Same head again: its 6 episodes come from the cache; only the candidate runs.
    second = paired_evaluation(generate(admin), tasks, candidate, head, **kwargs)  # type: ignore[arg-type]
    assert second.head_cached == 6 and second.episodes == 6
    assert second.head == first.head  # the cached head scores, paired with the same tasks

    # The engine unreachable for the candidate: failures are counted, not scored as zeros,
    # and no task enters the comparison half-done.
    third = paired_evaluation(generate(dead), tasks, candidate, head, **kwargs)  # type: ignore[arg-type]
    assert third.infra_failures == 6 and third.task_ids == [] and third.candidate == []
    assert third.incomplete_tasks == ["t0", "t1", "t2"]
    admin.close()
    dead.close()


def _job(srv: InProcessReef, scenario: str, text: str) -> str:
    from reef.records import Job, new_id, utcnow
    from reef.store.sql import open_store

    store = open_store(f"sqlite:///{srv.state_dir / 'reef.db'}")
    try:
        now = utcnow()
        job = Job(new_id("job"), scenario, "instruct", "queued", {"text": text}, now, now)
        return store.add_job(job).id
    finally:
        store.close()


@pytest.mark.parametrize("mode", ["append", pytest.param("model", marks=pytest.mark.loop)])
def test_an_instruction_becomes_a_candidate_held_for_review(
    server: InProcessReef, prefect_server: None, mode: str
) -> None:
    from reef import registry
    from reef.flows.instruct import instruct

    scenario = f"ask-{mode}"
    _failing_traffic(server, scenario)
    before = _chain(server, scenario)
    ask = "Answer with the name of the city only."
    job_id = _job(server, scenario, ask)
    overrides = _overrides(server, "improve")
    overrides["reef"]["params"]["instruct_mode"] = mode
    if mode == "model":  # any OpenAI-compatible server proposes: here, Reef's own /v1
        overrides["reef"]["params"].update(proposer_url=server.base_url, proposer_model="tiny")
    out = instruct(scenario, job_id, overrides=overrides)

    job = httpx.get(f"{server.url}/reef/train/{job_id}", params={"scenario": scenario}).json()
    assert job["status"] == "done" and job["candidate_id"] == out["candidate_id"]
    assert [s["step"] for s in job["steps"]] == [
        "proposing",
        "proposed",
        "evaluating",
        "evaluated",
        "pending_review",
    ]
    assert job["result"]["evaluation"]["eval_tasks"] == 6  # every reported question, paired
    assert job["result"]["evaluation"]["eval_repeats"] == 2
    if mode == "append" or out["source"] == "rule":
        assert out["diff"] == {
            "created": ["AGENTS.md", "harness.json"],
            "updated": [],
            "removed": [],
        }
    else:
        assert out["source"] == "proposer" and out["diff"]["created"]

    cand = httpx.get(f"{server.url}/reef/scenarios/{scenario}/candidates").json()["data"][0]
    assert cand["release_id"] == out["candidate_id"] and cand["status"] == "pending"
    assert cand["gate"]["status"] == "pending" and cand["gate"]["n"] == 6
    assert _chain(server, scenario) == before  # held: nothing released

    tracking = f"sqlite:///{(server.state_dir / 'mlflow.db').resolve()}"
    tags = registry.get_tags(tracking, cand["model_uri"])
    assert tags["reef.kind"] == "harness" and tags["reef.recipe"] == "instruct"
    import mlflow

    run = mlflow.MlflowClient(tracking).get_run(out["run_id"])
    assert run.data.params["ask"] == ask and run.data.metrics["eval_tasks"] == 6
    # the round's stages and their seconds (flows.stages); held for review: nothing deployed
    stages = {k for k in run.data.metrics if k.startswith("time.")}
    assert {"time.evaluate_s", "time.gate_s", "time.register_s"} <= stages
    assert "time.deploy_s" not in stages
    assert run.data.metrics["time.total_s"] >= run.data.metrics["time.evaluate_s"] > 0

    # promote releases it; the scenario's first harness is injected for every client
    r = httpx.post(
        f"{server.url}/reef/scenarios/{scenario}/promote",
        json={"release_id": cand["release_id"]},
        timeout=60,
    )
    assert r.status_code == 201, r.text
    got = httpx.get(f"{server.url}/reef/harness", params={"scenario": scenario}).json()
    assert got["release_id"] == cand["release_id"] and got["inject"] is True
    if out["source"] == "rule":
        rules = next(f["content"] for f in got["files"] if f["path"] == "AGENTS.md")
        assert rules == f"## Instructions\n- {ask}\n"
