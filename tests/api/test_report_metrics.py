"""Named metrics on reports, over real HTTP: a scenario declares its metrics (metrics.<name>
at the top level, scenarios.<name>.metrics, or at run time through PUT .../settings), a report
carries several beside `score` (or alone), each is checked against its declaration (a 400
naming it), stored, answered back, kept in the content that decides an idempotent retry, and
carried through `reef export` and `reef import`. Sent by the Python client, the `reef report`
command and plain HTTP."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from reef.api.auth import hash_token
from reef.cli.main import main
from reef.cli.testing import InProcessReef
from reef.client import Reef, ReefAPIError

ADMIN = "sk-ops-metrics"
METRICS = {
    "helpful": {"type": "boolean"},
    "accuracy": {"type": "float", "range": [0, 1]},
}
TONE = {"tone": {"type": "categorical", "values": ["formal", "casual"]}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    tokens = [{"name": "ops", "sha256": hash_token(ADMIN), "admin": True}]
    with InProcessReef(
        tmp_path_factory.mktemp("reef-metrics"),
        auth={"tokens": tokens},
        gate={"holdout": 0.0},  # no sample held out for the gate: the status counts them all
        metrics=METRICS,
        scenarios={"support": {"metrics": TONE}},
    ) as srv:
        yield srv


def _receipt(server: InProcessReef, scenario: str) -> str:
    chat = openai.OpenAI(
        base_url=server.base_url,
        api_key=ADMIN,
        default_headers={"x-reef-scenario": scenario},
        max_retries=0,
    )
    raw = chat.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    return raw.headers["x-reef-agent-record-id"]


def _post(server: InProcessReef, scenario: str, body: dict[str, object]) -> httpx.Response:
    headers = {"authorization": f"Bearer {ADMIN}", "x-reef-scenario": scenario}
    return httpx.post(f"{server.url}/reef/report", json=body, headers=headers)


def test_declared_metrics_are_stored_and_answered_back(server: InProcessReef) -> None:
    receipt = _receipt(server, "support")
    metrics = {"helpful": True, "accuracy": 0.7, "tone": "formal"}
    with Reef(server.url, ADMIN, scenario="support") as client:
        out = client.report(receipt, score=1.0, metrics=metrics, report_id="m1")
        assert out.created and out.metrics == metrics and out.score == 1.0
        again = client.report(receipt, score=1.0, metrics=metrics, report_id="m1")
        assert again.created is False  # the same content: an idempotent retry
        with pytest.raises(ReefAPIError) as clash:  # the same id, other metrics: 409
            client.report(receipt, score=1.0, metrics={**metrics, "accuracy": 0.2}, report_id="m1")
        assert clash.value.status == 409
        listed = client.reports("support").data
    assert [(r.id, r.metrics) for r in listed] == [("m1", metrics)]
    # metrics alone make a report
    alone = _post(server, "support", {"references": [receipt], "metrics": {"helpful": False}})
    assert alone.status_code == 201, alone.text
    assert (alone.json()["score"], alone.json()["metrics"]) == (None, {"helpful": False})


@pytest.mark.parametrize(
    ("scenario", "metrics", "says"),
    [
        ("support", {"politeness": 1.0}, "'politeness' is not a metric of scenario 'support'"),
        ("support", {"helpful": 1}, "metric 'helpful' is boolean"),
        ("support", {"helpful": "yes"}, "metric 'helpful' is boolean"),
        ("support", {"accuracy": 1.5}, "metric 'accuracy' is 1.5, outside its range [0.0, 1.0]"),
        ("support", {"accuracy": True}, "metric 'accuracy' is a number"),
        ("support", {"tone": "rude"}, "metric 'tone' is one of formal, casual"),
        ("billing", {"tone": "formal"}, "'tone' is not a metric of scenario 'billing'"),
    ],
)
def test_a_bad_metric_is_a_400_naming_it(
    server: InProcessReef, scenario: str, metrics: dict[str, object], says: str
) -> None:
    receipt = _receipt(server, scenario)
    r = _post(server, scenario, {"references": [receipt], "metrics": metrics})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert says in error["message"]
    assert (error["code"], error["param"]) == ("invalid_metric", f"metrics.{next(iter(metrics))}")
    # nothing was stored
    listed = httpx.get(
        f"{server.url}/reef/scenarios/{scenario}/reports",
        headers={"authorization": f"Bearer {ADMIN}"},
    ).json()["data"]
    assert receipt not in {ref for rep in listed for ref in rep["references"]}


def test_a_non_finite_metric_is_refused_by_the_schema(server: InProcessReef) -> None:
    receipt = _receipt(server, "support")
    body = '{"references": ["' + receipt + '"], "metrics": {"accuracy": NaN}}'
    r = httpx.post(
        f"{server.url}/reef/report",
        content=body,
        headers={
            "authorization": f"Bearer {ADMIN}",
            "x-reef-scenario": "support",
            "content-type": "application/json",
        },
    )
    assert r.status_code == 400, r.text


def test_a_metric_declared_at_run_time_is_accepted_at_once(server: InProcessReef) -> None:
    receipt = _receipt(server, "triage")
    body = {"references": [receipt], "metrics": {"urgent": True}}
    assert _post(server, "triage", body).status_code == 400
    put = httpx.put(
        f"{server.url}/reef/scenarios/triage/settings",
        json={"metrics": {"urgent": {"type": "boolean"}}},
        headers={"authorization": f"Bearer {ADMIN}"},
    )
    assert put.status_code == 200, put.text
    assert _post(server, "triage", body).status_code == 201


def test_reef_report_sends_metrics(
    server: InProcessReef, capsys: pytest.CaptureFixture[str]
) -> None:
    receipt = _receipt(server, "support")
    args = ["report", receipt, "--url", server.url, "--scenario", "support", "--token", ADMIN]
    flags = ["--metric", "helpful=true", "--metric", "accuracy=0.25", "--metric", "tone=casual"]
    assert main([*args, *flags, "--json"]) == 0
    stored = json.loads(capsys.readouterr().out)
    assert stored["metrics"] == {"helpful": True, "accuracy": 0.25, "tone": "casual"}
    assert main([*args, "--metric", "tone=rude"]) == 1
    err = capsys.readouterr().err
    assert "400 invalid_metric" in err and len(err.strip().splitlines()) == 1


def test_metrics_survive_export_and_import(server: InProcessReef, tmp_path: Path) -> None:
    from reef.export import export
    from reef.imports import import_file
    from reef.store.sql import open_store

    receipt = _receipt(server, "support")
    metrics = {"helpful": True, "tone": "casual"}
    assert (
        _post(server, "support", {"references": [receipt], "metrics": metrics}).status_code == 201
    )
    out = tmp_path / "support.jsonl"
    store = open_store(server.settings.database_url)
    try:
        export(store, "support", out, "jsonl", progress=False)
        import_file(store, "support-copy", out)
        copied = store.list_reports("support-copy")
    finally:
        store.close()
    assert metrics in [r.metrics for r in copied]


def test_a_scenario_learning_from_a_metric_counts_it(server: InProcessReef) -> None:
    """reef.metric set at run time: the status route counts the reports that give it."""
    url = f"{server.url}/reef/scenarios/learner"
    receipts = [_receipt(server, "learner") for _ in range(3)]
    admin = {"authorization": f"Bearer {ADMIN}"}
    bad = httpx.put(f"{url}/settings", json={"reef": {"metric": "helpful2"}}, headers=admin)
    assert bad.status_code == 400 and "reef.metric 'helpful2'" in bad.json()["error"]["message"]
    put = httpx.put(
        f"{url}/settings", json={"reef": {"metric": "helpful", "batch_size": 2}}, headers=admin
    )
    assert put.status_code == 200, put.text
    for receipt, metrics in zip(receipts, [{"helpful": True}, {"accuracy": 0.5}, {}], strict=True):
        body = {"references": [receipt], "score": 1.0, "metrics": metrics}
        assert _post(server, "learner", body).status_code == 201
    status = httpx.get(f"{url}/status", headers=admin).json()
    assert (status["eligible"], status["ready"]) == (1, False)
    assert status["dropped"]["no_helpful"] == 2
    # each declared metric over the scenario's reports
    assert status["metrics"] == {
        "accuracy": {"type": "float", "n": 1, "mean": 0.5, "min": 0.5, "max": 0.5},
        "helpful": {"type": "boolean", "n": 1, "share_true": 1.0},
    }
