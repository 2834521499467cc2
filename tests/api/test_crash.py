"""SIGKILL under load, then restart: every receipt a client was given is readable."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.reefserver import ReefServer


def _load(
    url: str, scenario: str, receipts: list[str], stop: threading.Event, errors: list[str]
) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    with httpx.Client(timeout=10) as client:
        while not stop.is_set():
            try:
                r = client.post(
                    f"{url}/v1/chat/completions", json=body, headers={"x-reef-scenario": scenario}
                )
            except httpx.HTTPError:
                return  # the server died under us: this request got no receipt
            if r.status_code == 200:
                receipts.append(r.headers["x-reef-agent-record-id"])
            else:
                errors.append(r.text)


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_sigkill_under_load_loses_no_acknowledged_record(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    args = ["--model", "tiny"]
    if backend == "postgres":
        args += ["--database-url", request.getfixturevalue("postgres_url")]
    server = ReefServer(tmp_path, *args).start()
    receipts: list[str] = []
    errors: list[str] = []
    stop = threading.Event()
    threads = [
        threading.Thread(target=_load, args=(server.url, "crash", receipts, stop, errors))
        for _ in range(8)
    ]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        while len(receipts) < 100 and time.monotonic() < deadline:
            time.sleep(0.05)
        server.kill()
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=15)
        server.kill()
    assert errors == []
    assert len(receipts) >= 100, "the load never reached 100 answers"
    acknowledged = list(receipts)

    with ReefServer(tmp_path, *args) as restarted:
        stored: set[str] = set()
        after = None
        while True:
            page = httpx.get(
                f"{restarted.url}/reef/scenarios/crash/records",
                params={"limit": 1000, **({"after": after} if after else {})},
            ).json()
            stored.update(r["id"] for r in page["data"])
            if not page["has_more"]:
                break
            after = page["last_id"]
    missing = [r for r in acknowledged if r not in stored]
    assert missing == [], f"{len(missing)} of {len(acknowledged)} acknowledged receipts lost"
