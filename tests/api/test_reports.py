"""POST /reef/report: feedback on receipts, idempotent by report_id, scoped to the scenario."""

from __future__ import annotations

import httpx
import openai

from reef.cli.testing import InProcessReef


def _receipts(server: InProcessReef, scenario: str, n: int) -> list[str]:
    c = openai.OpenAI(
        base_url=server.base_url, api_key="unused", default_headers={"x-reef-scenario": scenario}
    )
    return [
        c.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": f"q{i}"}], max_tokens=3
        ).headers["x-reef-agent-record-id"]
        for i in range(n)
    ]


def test_report_roundtrip_and_idempotency(
    server: InProcessReef, scenario: str, headers: dict[str, str]
) -> None:
    refs = _receipts(server, scenario, 2)
    body = {
        "report_id": "judge-1",
        "score": 0.75,
        "feedback": {"correction": "Hello!", "note": "too long"},
        "references": refs,
        "metadata": {"judge": "human"},
    }
    first = httpx.post(f"{server.url}/reef/report", json=body, headers=headers)
    assert first.status_code == 201, first.text
    assert first.json()["id"] == "judge-1" and first.json()["created"] is True
    again = httpx.post(f"{server.url}/reef/report", json=body, headers=headers)
    assert again.status_code == 200
    assert again.json()["created"] is False
    assert again.json()["created_at"] == first.json()["created_at"]
    clash = httpx.post(f"{server.url}/reef/report", json={**body, "score": 0.1}, headers=headers)
    assert clash.status_code == 409
    assert clash.json()["error"]["type"] == "conflict_error"
    listed = httpx.get(f"{server.url}/reef/scenarios/{scenario}/reports").json()["data"]
    assert [r["id"] for r in listed] == ["judge-1"]
    assert listed[0]["feedback"] == body["feedback"] and listed[0]["references"] == refs


def test_report_without_id_gets_one(
    server: InProcessReef, scenario: str, headers: dict[str, str]
) -> None:
    (ref,) = _receipts(server, scenario, 1)
    r = httpx.post(
        f"{server.url}/reef/report", json={"score": 1, "references": [ref]}, headers=headers
    )
    assert r.status_code == 201
    assert r.json()["id"].startswith("rpt_")


def test_unknown_and_foreign_receipts_are_rejected(
    server: InProcessReef, scenario: str, headers: dict[str, str]
) -> None:
    (own,) = _receipts(server, scenario, 1)
    (foreign,) = _receipts(server, scenario + "-other", 1)
    for refs in ([own, "rec_doesnotexist"], [foreign]):
        r = httpx.post(
            f"{server.url}/reef/report", json={"score": 1.0, "references": refs}, headers=headers
        )
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "unknown_reference"
        assert refs[-1] in r.json()["error"]["message"]
    assert httpx.get(f"{server.url}/reef/scenarios/{scenario}/reports").json()["data"] == []
    r = httpx.post(
        f"{server.url}/reef/report",
        json={"score": 1.0, "references": [own]},
        headers={"x-reef-scenario": scenario + "-never-used"},
    )
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "not_found_error"


def test_bad_report_bodies(server: InProcessReef, scenario: str, headers: dict[str, str]) -> None:
    (ref,) = _receipts(server, scenario, 1)
    cases = [
        ({"score": "high", "references": [ref]}, "score"),
        ({"score": 1, "references": []}, "references"),
        ({"score": 1, "references": [ref, ref]}, "unique"),
        ({"references": [ref]}, "score"),
        ({"score": 1, "references": [ref], "extra": 1}, "extra"),
    ]
    for body, word in cases:
        r = httpx.post(f"{server.url}/reef/report", json=body, headers=headers)
        assert r.status_code == 400, body
        assert word in r.json()["error"]["message"], r.json()
    nan = httpx.post(
        f"{server.url}/reef/report",
        content=b'{"score": NaN, "references": ["%s"]}' % ref.encode(),
        headers={**headers, "content-type": "application/json"},
    )
    assert nan.status_code == 400
    assert httpx.get(f"{server.url}/reef/scenarios/{scenario}/reports").json()["data"] == []
