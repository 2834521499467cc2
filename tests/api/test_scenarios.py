"""Scenarios: created on first use or explicitly; listed; deleted with their data."""

from __future__ import annotations

import httpx

from reef.cli.testing import InProcessReef
from tests.api.conftest import records_of, wait_cleaned


def test_create_get_list_delete(server: InProcessReef, scenario: str) -> None:
    r = httpx.post(f"{server.url}/reef/scenarios", json={"name": scenario, "description": "demo"})
    assert r.status_code == 201
    created = r.json()
    assert created["name"] == scenario and created["head_release_id"].startswith("rel_")
    assert httpx.post(f"{server.url}/reef/scenarios", json={"name": scenario}).status_code == 409
    assert httpx.get(f"{server.url}/reef/scenarios/{scenario}").json() == created
    names = [s["name"] for s in httpx.get(f"{server.url}/reef/scenarios").json()["data"]]
    assert scenario in names
    releases = httpx.get(f"{server.url}/reef/scenarios/{scenario}/releases").json()["data"]
    assert [(r["seq"], r["kind"], r["release_id"], r["current"]) for r in releases] == [
        (0, "base", created["head_release_id"], True)
    ]

    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    httpx.post(
        f"{server.url}/v1/chat/completions", json=body, headers={"x-reef-scenario": scenario}
    )
    assert len(records_of(server, scenario)) == 1

    r = httpx.delete(f"{server.url}/reef/scenarios/{scenario}")
    assert r.status_code == 202 and r.json()["status"] == "pending"
    assert httpx.get(f"{server.url}/reef/scenarios/{scenario}").status_code == 404
    assert httpx.delete(f"{server.url}/reef/scenarios/{scenario}").status_code == 404
    wait_cleaned(server, scenario)  # its files, in the background
    # used again, it comes back empty with a fresh base release
    httpx.post(
        f"{server.url}/v1/chat/completions", json=body, headers={"x-reef-scenario": scenario}
    )
    again = httpx.get(f"{server.url}/reef/scenarios/{scenario}").json()
    assert again["head_release_id"] != created["head_release_id"]
    assert len(records_of(server, scenario)) == 1


def test_first_use_creates_default_scenario(server: InProcessReef) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body)
    assert r.status_code == 200
    receipt = r.headers["x-reef-agent-record-id"]
    assert httpx.get(f"{server.url}/reef/scenarios/default/records/{receipt}").status_code == 200


def test_record_pagination(server: InProcessReef, scenario: str) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    receipts = [
        httpx.post(
            f"{server.url}/v1/chat/completions", json=body, headers={"x-reef-scenario": scenario}
        ).headers["x-reef-agent-record-id"]
        for _ in range(5)
    ]
    url = f"{server.url}/reef/scenarios/{scenario}/records"
    page1 = httpx.get(url, params={"limit": 2}).json()
    assert [r["id"] for r in page1["data"]] == receipts[:2] and page1["has_more"] is True
    page2 = httpx.get(url, params={"limit": 10, "after": page1["last_id"]}).json()
    assert [r["id"] for r in page2["data"]] == receipts[2:] and page2["has_more"] is False
    assert httpx.get(url, params={"limit": 0}).status_code == 400
