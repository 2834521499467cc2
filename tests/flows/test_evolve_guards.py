"""Guards in the evolve flow: a candidate that learned the reported preference ("always answer
yes") but broke a guard's task set is rejected by name, and the head stays; with
review.guard_failed, the answers the guard failed wait in the scenario's review queue."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from reef.cli.testing import InProcessReef
from reef.testing.traffic import traffic


def never_yes(completions: list[Any], **_: Any) -> list[float]:
    """The guard's verifier: 1.0 for an answer without the word "yes" (the head's random
    tokens), 0.0 for one with it (what the candidate was taught to say)."""
    return [0.0 if "yes" in str(c).lower().split() else 1.0 for c in completions]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    with InProcessReef(tmp_path_factory.mktemp("guards")) as srv:
        yield srv


@pytest.mark.loop
def test_a_candidate_that_breaks_a_guard_is_rejected_by_name(
    server: InProcessReef, prefect_server: None, tmp_path: Path
) -> None:
    from reef.flows.evolve import evolve

    tasks = tmp_path / "guard.jsonl"
    tasks.write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": f"Is {i} a number?"}]}) + "\n"
            for i in range(200, 212)
        )
    )
    traffic(
        server,
        "guarded",
        24,
        prompt="Is {i} a number? Answer yes or no.",
        report=lambda i, rid: {"score": 0.0, "feedback": {"correction": "yes"}},
        max_tokens=6,
        temperature=1.0,
        seed=lambda i: i,
    )
    overrides = {
        "server": {"state_dir": str(server.state_dir), "port": server.port},
        "engine": {"model": "tiny"},
        "reef": {
            "recipe": "sft",
            "batch_size": 24,
            "params": {"epochs": 12, "learning_rate": 5e-3},
        },
        "gate": {
            "policy": "always",
            "max_tokens": 4,
            "guards": [
                {
                    "name": "no-yes",
                    "dataset": str(tasks),
                    "scorer": "tests.flows.test_evolve_guards:never_yes",
                }
            ],
        },
        "review": {"guard_failed": True},
    }
    before = httpx.get(f"{server.url}/reef/scenarios/guarded/releases").json()["data"]
    result = evolve("guarded", overrides=overrides)
    gate = result["gate"]
    assert result["status"] == "rejected", gate
    assert gate["broken_guard"] == "no-yes" and gate["reason"].startswith(
        "guard 'no-yes' not shown safe"
    )
    (guard,) = gate["guards"]
    assert guard["mean_head"] == 1.0 and guard["mean_candidate"] < 1.0 and guard["n"] == 12
    assert httpx.get(f"{server.url}/reef/scenarios/guarded/releases").json()["data"] == before
    cands = httpx.get(f"{server.url}/reef/scenarios/guarded/candidates").json()["data"]
    assert cands[0]["status"] == "rejected" and cands[0]["gate"]["broken_guard"] == "no-yes"
    _the_failed_answers_wait_for_review(server, result, guard["n"] - guard["wins"])


def _the_failed_answers_wait_for_review(
    server: InProcessReef, result: dict[str, Any], losses: int
) -> None:
    """Every guard task the candidate answered "yes" to (the head never did: each is a loss)
    is a record tagged with the guard and the candidate, made on the head it was judged
    against, queued with reason guard, and not traffic."""
    from reef.records import GUARD_CANDIDATE_TAG, GUARD_TAG
    from reef.store.browse import Browse
    from reef.store.sql import open_store

    store = open_store(server.settings.database_url)
    try:
        items = store.review_items("guarded", None, 100)
        kept = store.get_records("guarded", [i.record_id for i in items])
        head = store.head_release("guarded").id
        traffic = Browse(store).traffic("guarded")
    finally:
        store.close()
    assert losses > 0 and result["guard_answers_kept"] == len(items) == len(kept) == losses
    assert {i.reason for i in items} == {"guard"}
    for record in kept:
        assert record.tags[GUARD_TAG] == "no-yes" and record.release_id == head
        assert record.tags[GUARD_CANDIDATE_TAG] == result["candidate_id"]
        assert "yes" in record.response["choices"][0]["message"]["content"].lower().split()
    assert traffic.records == 24  # the served calls only
