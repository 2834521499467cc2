"""SIGKILL under load, then restart: every receipt a client was given is readable. The killed
server is a real `reef serve` process (the kill is what is tested); what restarts on its state
is the same app, served in-process. Part of the fault matrix (`make test-faults`): about 25 s
of two server starts and a kill, too long for `make test`'s budget."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from reef.cli.testing import InProcessReef
from reef.testing.process import ReefServer

pytestmark = pytest.mark.faults

Doomed = dict[str, tuple[ReefServer, dict[str, str]]]


@pytest.fixture(scope="module")
def doomed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Doomed]:
    """A `reef serve` (and its store settings) for each backend this module's selected tests
    kill, all started at once: a start is a Python process importing torch, ~10 s of one core,
    and the starts overlap on the others."""
    backends = {
        item.callspec.params["backend"]
        for item in request.session.items
        if getattr(item, "module", None) is request.module
    }
    servers: Doomed = {}
    for backend in sorted(backends):
        args, store = ["--model", "tiny"], {}
        if backend == "postgres":
            try:
                store["database_url"] = request.getfixturevalue("postgres_url")
            except pytest.skip.Exception:
                continue  # the test asks for it too, and is skipped
            args += ["--database-url", store["database_url"]]
        state = tmp_path_factory.mktemp(f"crash-{backend}")
        servers[backend] = (ReefServer(state, *args), store)
    try:
        with ThreadPoolExecutor(max_workers=max(1, len(servers))) as pool:
            list(pool.map(lambda s: s.start(), [srv for srv, _ in servers.values()]))
        yield servers
    finally:
        for srv, _ in servers.values():
            srv.kill()


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
    backend: str, doomed: Doomed, request: pytest.FixtureRequest
) -> None:
    if backend == "postgres":
        request.getfixturevalue("postgres_url")  # skips where PostgreSQL is not reachable
    server, store = doomed[backend]
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

    with InProcessReef(server.state_dir, store=store) as restarted:
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
