"""reef.client against a real Reef (the tiny model, served in this process over HTTP, with
tokens), and behind a small real HTTP proxy that answers 429 and 503 before passing requests
on: what an application that reports feedback sees."""

from __future__ import annotations

import asyncio
import inspect
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import openai
import pytest

from reef.api.auth import hash_token
from reef.cli.testing import InProcessReef
from reef.client import AsyncReef, Reef, ReefAPIError, ReefConnectionError
from reef.errors import BadRequest
from reef.wire import ReportIn, ReportOut

ROOT = Path(__file__).resolve().parents[1]
ADMIN = "reef_admin_token_for_client_tests"
ALICE = "reef_alice_token_for_client_tests"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    state = tmp_path_factory.mktemp("reef-client")
    config = state / "serve.yaml"
    config.write_text(
        "engine:\n  default_max_tokens: 4\nauth:\n  tokens:\n"
        f"    - {{name: ops, sha256: {hash_token(ADMIN)}, admin: true}}\n"
        f"    - {{name: alice, sha256: {hash_token(ALICE)}, scenarios: [alice]}}\n"
    )
    with InProcessReef(state, config=config) as srv:
        yield srv


@pytest.fixture
def scenario() -> str:
    return f"c-{uuid.uuid4().hex[:10]}"


def receipts(server: InProcessReef, scenario: str, n: int, key: str = ADMIN) -> list[str]:
    chat = openai.OpenAI(
        base_url=server.base_url, api_key=key, default_headers={"x-reef-scenario": scenario}
    )
    return [
        chat.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": f"q{i}"}], max_tokens=2
        ).headers["x-reef-agent-record-id"]
        for i in range(n)
    ]


def test_report_records_and_releases(server: InProcessReef, scenario: str) -> None:
    refs = receipts(server, scenario, 2)
    with Reef(server.url, ADMIN, scenario=scenario) as reef:
        out = reef.report(refs, score=0.75, feedback={"correction": "Hi."}, report_id="r-1")
        assert isinstance(out, ReportOut)
        assert (out.id, out.scenario, out.references, out.created) == ("r-1", scenario, refs, True)
        again = reef.report(refs, score=0.75, feedback={"correction": "Hi."}, report_id="r-1")
        assert again.created is False and again.created_at == out.created_at
        text = reef.report(refs[0], feedback="too long", metadata={"by": "test"})
        assert text.id.startswith("rpt_") and text.score is None and text.metadata == {"by": "test"}

        page = reef.records(limit=1)
        assert [r.id for r in page.data] == refs[:1] and page.has_more
        rest = reef.records(after=page.last_id)
        assert [r.id for r in rest.data] == refs[1:] and not rest.has_more
        assert reef.record(refs[1]).release_id == page.data[0].release_id
        session = page.data[0].session_id
        assert session and [r.id for r in reef.session(session).data] == refs[:1]

        reports = reef.reports().data
        assert [r.id for r in reports] == ["r-1", text.id]

        chain = reef.releases().data
        assert [(r.seq, r.current, r.kind) for r in chain] == [(0, True, "base")]
        assert chain[0].release_id == page.data[0].release_id


def test_the_openai_base_url_and_the_environment_work_too(
    server: InProcessReef, scenario: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    (ref,) = receipts(server, scenario, 1)
    monkeypatch.setenv("REEF_BASE_URL", server.base_url)  # .../v1, as the OpenAI SDK takes it
    monkeypatch.setenv("REEF_API_KEY", ADMIN)
    with Reef(scenario=scenario) as reef:
        assert reef.base_url == server.url
        assert reef.report(ref, score=1).score == 1.0


def test_async_client(server: InProcessReef, scenario: str) -> None:
    refs = receipts(server, scenario, 3)

    async def run() -> tuple[list[ReportOut], int, int]:
        async with AsyncReef(server.url, ADMIN, scenario=scenario) as reef:
            reports = await asyncio.gather(
                *(reef.report(r, score=i / 2, report_id=f"a-{i}") for i, r in enumerate(refs))
            )
            records = await reef.records(limit=10)
            first = await reef.record(refs[0])
            assert first.session_id and len((await reef.session(first.session_id)).data) == 1
            assert len((await reef.reports(limit=5)).data) == 3
            releases = await reef.releases()
            return list(reports), len(records.data), len(releases.data)

    reports, n_records, n_releases = asyncio.run(run())
    assert sorted(r.id for r in reports) == ["a-0", "a-1", "a-2"]
    assert [r.score for r in sorted(reports, key=lambda r: r.id)] == [0.0, 0.5, 1.0]
    assert (n_records, n_releases) == (3, 1)


def test_errors_carry_the_servers_answer(server: InProcessReef, scenario: str) -> None:
    (ref,) = receipts(server, scenario, 1)
    with Reef(server.url, ADMIN, scenario=scenario) as reef:
        with pytest.raises(ReefAPIError) as unknown:
            reef.report("rec_doesnotexist", score=1)
        assert unknown.value.status == 400 and unknown.value.code == "unknown_reference"
        assert "rec_doesnotexist" in unknown.value.message
        reef.report(ref, score=1, report_id="same")
        with pytest.raises(ReefAPIError) as clash:
            reef.report(ref, score=0, report_id="same")
        assert clash.value.status == 409 and clash.value.type == "conflict_error"
        with pytest.raises(ReefAPIError) as missing:
            reef.records("no-such-scenario")
        assert missing.value.status == 404
    with Reef(server.url, "wrong", scenario=scenario) as reef, pytest.raises(ReefAPIError) as bad:
        reef.report(ref, score=1)
    assert bad.value.status == 401 and "invalid API key" in str(bad.value)
    # a scenario token reads its own scenario, never another
    (mine,) = receipts(server, "alice", 1, key=ALICE)
    with Reef(server.url, ALICE, scenario="alice") as reef:
        assert reef.report(mine, score=1).scenario == "alice"
        with pytest.raises(ReefAPIError) as foreign:
            reef.records(scenario)
        assert foreign.value.status == 403


def test_a_malformed_report_is_refused_before_it_is_sent(server: InProcessReef) -> None:
    with Reef(server.url, ADMIN) as reef:
        with pytest.raises(BadRequest, match="needs a score, feedback, or both"):
            reef.report("rec_x")
        with pytest.raises(BadRequest, match="references"):
            reef.report([], score=1)
        with pytest.raises(BadRequest, match="report_id"):
            reef.report("rec_x", score=1, report_id="has spaces")


def test_an_unreachable_server_is_one_error_after_the_retries() -> None:
    port = free_port()  # nothing listens there
    started = time.monotonic()
    with (
        Reef(f"http://127.0.0.1:{port}", max_retries=2, backoff_s=0.05) as reef,
        pytest.raises(ReefConnectionError, match="unreachable"),
    ):
        reef.report("rec_x", score=1)
    assert time.monotonic() - started < 5


class Flaky:
    """A real HTTP server in front of Reef: the first requests get the canned answers
    (status, headers), the rest are passed on. `seen` holds every request's method, path and
    authorization header, and when it came."""

    def __init__(self, upstream: str, canned: list[tuple[int, dict[str, str]]]):
        self.canned = list(canned)
        self.seen: list[tuple[str, str, str | None, float]] = []
        flaky = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                flaky.seen.append(
                    (self.command, self.path, self.headers.get("authorization"), time.monotonic())
                )
                if flaky.canned:
                    status, headers = flaky.canned.pop(0)
                    payload = b'{"error": {"message": "busy", "type": "rate_limit_error"}}'
                    self._reply(status, {**headers, "content-type": "application/json"}, payload)
                    return
                keep = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                r = httpx.request(self.command, upstream + self.path, content=body, headers=keep)
                self._reply(r.status_code, {"content-type": "application/json"}, r.content)

            def _reply(self, status: int, headers: dict[str, str], payload: bytes) -> None:
                self.send_response(status)
                for k, v in {**headers, "content-length": str(len(payload))}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _any

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_429_and_503_are_retried_after_retry_after(server: InProcessReef, scenario: str) -> None:
    (ref,) = receipts(server, scenario, 1)
    flaky = Flaky(server.url, [(429, {"retry-after": "1"}), (503, {})])
    try:
        with Reef(flaky.url, ADMIN, scenario=scenario, backoff_s=0.05) as reef:
            out = reef.report(ref, score=1, report_id="retried")
        assert out.id == "retried" and out.created
        times = [t for *_, t in flaky.seen]
        assert len(times) == 3 and {a for _, _, a, _ in flaky.seen} == {f"Bearer {ADMIN}"}
        assert times[1] - times[0] >= 0.95  # the server's Retry-After, not the 0.05 s backoff
        assert times[2] - times[1] < 0.5
    finally:
        flaky.close()


def test_async_retries_and_giving_up(server: InProcessReef, scenario: str) -> None:
    flaky = Flaky(server.url, [(503, {}), (503, {}), (503, {})])

    async def run() -> int:
        async with AsyncReef(flaky.url, ADMIN, max_retries=1, backoff_s=0.01) as reef:
            try:
                await reef.releases(scenario)
            except ReefAPIError as e:
                return e.status
        return 0

    try:
        assert asyncio.run(run()) == 503
        assert len(flaky.seen) == 2  # the first try and one retry
    finally:
        flaky.close()


def test_a_retry_after_beyond_max_backoff_is_not_waited_for(server: InProcessReef) -> None:
    flaky = Flaky(server.url, [(429, {"retry-after": "3600"})])
    started = time.monotonic()
    try:
        with Reef(flaky.url, ADMIN, max_backoff_s=30) as reef, pytest.raises(ReefAPIError) as e:
            reef.report("rec_x", score=1)
        assert e.value.status == 429 and e.value.type == "rate_limit_error"
        assert time.monotonic() - started < 5 and len(flaky.seen) == 1
    finally:
        flaky.close()


def test_the_client_speaks_the_report_routes_own_models(server: InProcessReef) -> None:
    """The route's OpenAPI body and answer are the models the client validates with, and
    every field of the body is a keyword of `report` (references: its receipts)."""
    spec = httpx.get(f"{server.url}/openapi.json").json()
    post = spec["paths"]["/reef/report"]["post"]
    body_ref = post["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    answer_ref = post["responses"]["201"]["content"]["application/json"]["schema"]["$ref"]
    assert body_ref.rsplit("/", 1)[1] == ReportIn.__name__
    assert answer_ref.rsplit("/", 1)[1] == ReportOut.__name__
    for method in (Reef.report, AsyncReef.report):
        keywords = set(inspect.signature(method).parameters) - {"self", "receipts", "scenario"}
        assert keywords == set(ReportIn.model_fields) - {"references"}
        assert inspect.signature(method).return_annotation in ("ReportOut", ReportOut)


def test_importing_the_client_loads_no_server_or_model_library() -> None:
    code = (
        "import sys, reef.client; "
        "print(sorted(m for m in ('torch', 'fastapi', 'transformers', 'starlette', 'api') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
