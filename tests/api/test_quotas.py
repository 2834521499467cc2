"""Quotas per token (auth.tokens[].quota, .scenario_quotas): 429 with Retry-After and OpenAI's
error JSON, counted in the database two replicas share, shown on /metrics and the dashboard."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from reef.api.auth import hash_token
from reef.cli.testing import InProcessReef

ADMIN, RPM, SCOPED, BUDGET, FREE, ANTH, WIDE = (
    f"{n}-quota-token" for n in ("ops", "rpm", "sc", "bg", "fr", "an", "wd")
)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[InProcessReef]]:
    state: Path = tmp_path_factory.mktemp("reef-quotas")
    config = state / "serve.yaml"
    config.write_text(
        "auth:\n  tokens:\n"
        f"    - {{name: ops, sha256: {hash_token(ADMIN)}, admin: true}}\n"
        f"    - name: rpm\n      sha256: {hash_token(RPM)}\n      scenarios: [a]\n"
        "      quota: {requests_per_minute: 3}\n"
        f"    - name: scoped\n      sha256: {hash_token(SCOPED)}\n      scenarios: [a, b]\n"
        "      scenario_quotas: {b: {requests_per_minute: 1}}\n"
        f"    - name: budget\n      sha256: {hash_token(BUDGET)}\n      scenarios: [a]\n"
        "      quota: {tokens_per_day: 5}\n"
        f"    - {{name: free, sha256: {hash_token(FREE)}, scenarios: [a]}}\n"
        f"    - name: anth\n      sha256: {hash_token(ANTH)}\n      scenarios: [a]\n"
        "      quota: {requests_per_minute: 1}\n"
        f"    - name: wide\n      sha256: {hash_token(WIDE)}\n      scenarios: [a]\n"
        "      quota: {requests_per_minute: 100000, tokens_per_day: 100000000}\n"
    )
    database = {"database_url": f"sqlite:///{state / 'shared.db'}"}
    with (
        InProcessReef(state / "one", config=config, store=database) as one,
        InProcessReef(state / "two", config=config, store=database) as two,
    ):
        yield [one, two]


def _client(srv: InProcessReef, token: str, scenario: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=srv.base_url,
        api_key=token,
        max_retries=0,
        default_headers={"x-reef-scenario": scenario},
    )


def _chat(client: openai.OpenAI) -> object:
    return client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )


def _not_at_a_minute_end() -> None:
    """Counts reset when the minute turns: start a minute-limited check well inside one."""
    if time.time() % 60 > 50:
        time.sleep(61 - time.time() % 60)


def test_requests_per_minute_hold_across_replicas(replicas: list[InProcessReef]) -> None:
    _not_at_a_minute_end()
    clients = [_client(srv, RPM, "a") for srv in replicas]
    for i in range(3):
        _chat(clients[i % 2])
    for client in clients:  # the fourth call, on either replica
        with pytest.raises(openai.RateLimitError) as refused:
            _chat(client)
        r = refused.value.response
        assert r.status_code == 429
        assert 1 <= int(r.headers["retry-after"]) <= 60
        error = r.json()["error"]
        assert error["code"] == "rate_limit_exceeded" and error["type"] == "requests"
        assert "requests_per_minute 3" in error["message"]
    assert _chat(_client(replicas[0], FREE, "a"))  # another token is not limited


def test_a_scenario_quota_limits_that_scenario_only(replicas: list[InProcessReef]) -> None:
    _not_at_a_minute_end()
    _chat(_client(replicas[0], SCOPED, "b"))
    with pytest.raises(openai.RateLimitError) as refused:
        _chat(_client(replicas[1], SCOPED, "b"))
    assert "in scenario 'b'" in refused.value.response.json()["error"]["message"]
    for _ in range(3):
        _chat(_client(replicas[1], SCOPED, "a"))


def test_a_daily_token_budget_refuses_once_spent(replicas: list[InProcessReef]) -> None:
    client = _client(replicas[0], BUDGET, "a")
    _chat(client)  # admitted at 0 tokens; spends its prompt and completion (more than 5)
    deadline = time.monotonic() + 10
    while True:  # the tokens are counted in the background once the answer has left
        try:
            _chat(_client(replicas[1], BUDGET, "a"))
        except openai.RateLimitError as e:
            refused = e
            break
        assert time.monotonic() < deadline, "the daily budget never refused"
        time.sleep(0.1)
    r = refused.response
    assert r.json()["error"]["code"] == "insufficient_quota"
    assert r.json()["error"]["type"] == "tokens"
    assert 1 <= int(r.headers["retry-after"]) <= 86_400


def test_metrics_and_dashboard_show_quotas(replicas: list[InProcessReef]) -> None:
    _not_at_a_minute_end()
    srv = replicas[0]
    for _ in range(4):
        with contextlib.suppress(openai.RateLimitError):
            _chat(_client(srv, RPM, "a"))
    headers = {"authorization": f"Bearer {ADMIN}"}
    refused = 'reef_quota_refusals_total{limit="requests_per_minute",token="rpm"}'
    used = 'reef_quota_used{limit="requests_per_minute",scope="all",token="rpm"} 3.0'
    deadline, text = time.monotonic() + 20, ""
    while not (refused in text and used in text) and time.monotonic() < deadline:
        text = httpx.get(f"{srv.url}/metrics", headers=headers).text
        time.sleep(0.2)
    assert refused in text and used in text, text
    assert 'reef_quota_limit{limit="tokens_per_day",scope="all",token="budget"} 5.0' in text
    with httpx.Client(base_url=srv.url) as browser:
        signin = browser.post("/ui/login", data={"token": ADMIN, "next": "/ui"})
        assert signin.status_code in (200, 303), signin.text
        page = browser.get("/ui/quotas")
    assert page.status_code == 200, page.text
    assert 'href="/ui/s/b">b</a>' in page.text  # the scoped token's quota in scenario b
    assert ">rpm<" in page.text and ">3 / 3<" in page.text


def test_the_anthropic_routes_refuse_in_their_own_shape(replicas: list[InProcessReef]) -> None:
    _not_at_a_minute_end()
    client = anthropic.Anthropic(
        base_url=replicas[0].url,
        api_key=ANTH,
        max_retries=0,
        default_headers={"x-reef-scenario": "a"},
    )
    ask = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    client.messages.create(**ask)  # type: ignore[call-overload]
    with pytest.raises(anthropic.RateLimitError) as refused:
        client.messages.create(**ask)  # type: ignore[call-overload]
    body = refused.value.response.json()
    assert body["type"] == "error" and body["error"]["code"] == "rate_limit_exceeded"
    assert int(refused.value.response.headers["retry-after"]) >= 1


def test_calls_far_from_a_limit_reach_the_shared_counters_in_batches(
    replicas: list[InProcessReef],
) -> None:
    """A limit no call nears: each replica counts its calls in process and adds them to the
    database's counters with its next sync, so both replicas' calls are in the shared count."""
    _not_at_a_minute_end()
    for srv in replicas:
        for _ in range(6):
            _chat(_client(srv, WIDE, "a"))
    headers = {"authorization": f"Bearer {ADMIN}"}
    used = 'reef_quota_used{limit="requests_per_minute",scope="all",token="wide"} 12.0'
    deadline, text = time.monotonic() + 20, ""
    while used not in text and time.monotonic() < deadline:
        text = httpx.get(f"{replicas[1].url}/metrics", headers=headers).text
        time.sleep(0.2)
    assert used in text, text
    tokens = 'reef_quota_used{limit="tokens_per_day",scope="all",token="wide"}'
    [line] = [ln for ln in text.splitlines() if ln.startswith(tokens)]
    assert float(line.split()[-1]) >= 12  # every call's prompt and completion tokens
    in_process = 'reef_quota_admissions_total{counted="process"}'
    counted = [
        float(ln.split()[-1])
        for srv in replicas
        for ln in httpx.get(f"{srv.url}/metrics", headers=headers).text.splitlines()
        if ln.startswith(in_process)
    ]
    assert sum(counted) > 0  # after each replica's first sync, calls skip the database
