"""What only Reef writes stays Reef's: record tags under `reef.` (the rollout arm, the injected
harness text), the `metadata.source` of a judgment and the `judge_` report ids the judging
worker takes. A client that sends them gets a 400 with an OpenAI-style error."""

from __future__ import annotations

import httpx
import pytest

from reef import judge
from reef.cli.testing import InProcessReef
from reef.wire import RESERVED_REPORT_ID_PREFIXES, RESERVED_SOURCES
from tests.api.conftest import records_of


def _chat(server: InProcessReef, scenario: str, **tags: str) -> httpx.Response:
    headers = {"x-reef-scenario": scenario, **{f"x-reef-tag-{k}": v for k, v in tags.items()}}
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=headers, timeout=60)


@pytest.mark.parametrize(
    "tag",
    ["reef.arm", "reef.rollout", "reef.system", "reef.harness_release", "REEF.Arm", "reef."],
)
def test_client_tags_under_reef_are_refused(server: InProcessReef, scenario: str, tag: str) -> None:
    r = _chat(server, scenario, **{tag: "canary", "reef.rollout": "forged"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "reserved_tag" and error["type"] == "invalid_request_error"
    assert "reef." in error["message"]
    assert records_of(server, scenario) == []  # nothing served, nothing recorded
    # no guardrail window was opened for the forged rollout id
    rollouts = server._server.config.app.state.services.serving.rollouts  # type: ignore[union-attr]
    assert not any(key[0] == "forged" for key in rollouts._health)


def test_other_tags_still_reach_the_record(server: InProcessReef, scenario: str) -> None:
    r = _chat(server, scenario, team="blue", **{"reefy.x": "1"})
    assert r.status_code == 200, r.text
    (rec,) = records_of(server, scenario)
    assert rec["tags"]["team"] == "blue" and rec["tags"]["reefy.x"] == "1"
    assert not any(k.startswith("reef.arm") for k in rec["tags"])


def _report(server: InProcessReef, scenario: str, **body: object) -> httpx.Response:
    return httpx.post(
        f"{server.url}/reef/report",
        json=body,
        headers={"x-reef-scenario": scenario},
        timeout=30,
    )


def test_judgment_markers_are_reefs_own(server: InProcessReef, scenario: str) -> None:
    assert judge.SOURCE in RESERVED_SOURCES  # the source a judgment is stored with
    rid = _chat(server, scenario).headers["x-reef-agent-record-id"]
    for source in ["judge", "Judge", " judge "]:
        r = _report(server, scenario, references=[rid], score=1.0, metadata={"source": source})
        assert r.status_code == 400, (source, r.text)
        assert r.json()["error"]["code"] == "reserved_source"
        assert r.json()["error"]["param"] == "metadata.source"
    for prefix in RESERVED_REPORT_ID_PREFIXES:
        r = _report(server, scenario, report_id=f"{prefix}{rid}", references=[rid], score=1.0)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "reserved_report_id"
        assert r.json()["error"]["param"] == "report_id"
    # the worker's id for this record's judgment is still free, and nothing counts as judged
    reports = httpx.get(
        f"{server.url}/reef/scenarios/{scenario}/reports", params={"limit": 100}
    ).json()["data"]
    assert reports == []
    # a client's own source and id are fine
    r = _report(
        server,
        scenario,
        report_id="mine-1",
        references=[rid],
        score=1.0,
        metadata={"source": "support-app"},
    )
    assert r.status_code == 201, r.text
