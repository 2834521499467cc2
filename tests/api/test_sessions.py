"""Sessions through the real SDKs: prefix-extension stitching, forks, explicit session ids."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from reef.cli.testing import InProcessReef


def _client(server: InProcessReef, scenario: str, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.base_url,
        api_key="unused",
        default_headers={"x-reef-scenario": scenario, **headers},
    )


def _ask(c: openai.OpenAI, messages: list[dict], **headers: str) -> tuple[str, dict]:
    raw = c.chat.completions.with_raw_response.create(
        model="tiny", messages=messages, max_tokens=6, temperature=0, extra_headers=headers
    )
    message = raw.parse().choices[0].message
    # What an application appends to its history: the SDK's message, dumped as is.
    return raw.headers["x-reef-agent-record-id"], message.model_dump()


def _record(server: InProcessReef, scenario: str, receipt: str) -> dict:
    r = httpx.get(f"{server.url}/reef/scenarios/{scenario}/records/{receipt}")
    r.raise_for_status()
    return r.json()


def test_three_turns_form_one_session(server: InProcessReef, scenario: str) -> None:
    c = _client(server, scenario)
    history: list[dict] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a fish."},
    ]
    receipts = []
    for follow_up in ("Another one.", "And a third."):
        receipt, answer = _ask(c, history)
        receipts.append(receipt)
        history += [answer, {"role": "user", "content": follow_up}]
    receipt, _ = _ask(c, history)
    receipts.append(receipt)

    records = [_record(server, scenario, r) for r in receipts]
    assert records[0]["session_id"].startswith("ses_")
    assert {r["session_id"] for r in records} == {records[0]["session_id"]}
    assert [r["turn"] for r in records] == [0, 1, 2]
    assert [r["parent_id"] for r in records] == [None, receipts[0], receipts[1]]

    # An unrelated conversation is a session of its own.
    other, _ = _ask(c, [{"role": "user", "content": "Name a bird."}])
    assert _record(server, scenario, other)["session_id"] != records[0]["session_id"]
    assert _record(server, scenario, other)["turn"] == 0

    listed = httpx.get(f"{server.url}/reef/scenarios/{scenario}/records").json()["data"]
    assert {r["id"]: r["turn"] for r in listed}[receipts[2]] == 2


def test_a_fork_becomes_its_own_session(server: InProcessReef, scenario: str) -> None:
    c = _client(server, scenario)
    start = [{"role": "user", "content": "Name a tree."}]
    first, answer = _ask(c, start)
    second, _ = _ask(c, [*start, answer, {"role": "user", "content": "Taller?"}])
    fork, fork_answer = _ask(c, [*start, answer, {"role": "user", "content": "Older?"}])

    r0, r1, rf = (_record(server, scenario, r) for r in (first, second, fork))
    assert r1["session_id"] == r0["session_id"] and r1["turn"] == 1
    assert rf["session_id"] not in (None, r0["session_id"])
    assert (rf["turn"], rf["parent_id"]) == (1, first)

    # The fork's own continuation stays on the fork's branch.
    history = [*start, answer, {"role": "user", "content": "Older?"}, fork_answer]
    after_fork, _ = _ask(c, [*history, {"role": "user", "content": "Why?"}])
    r3 = _record(server, scenario, after_fork)
    assert (r3["session_id"], r3["turn"], r3["parent_id"]) == (rf["session_id"], 2, fork)


def test_explicit_session_id_wins(server: InProcessReef, scenario: str) -> None:
    c = _client(server, scenario, **{"x-reef-session-id": "user-42:chat"})
    a, _ = _ask(c, [{"role": "user", "content": "Name a fish."}])
    b, _ = _ask(c, [{"role": "user", "content": "Name a bird."}])
    ra, rb = _record(server, scenario, a), _record(server, scenario, b)
    assert (ra["session_id"], ra["turn"], ra["parent_id"]) == ("user-42:chat", 0, None)
    assert (rb["session_id"], rb["turn"], rb["parent_id"]) == ("user-42:chat", 1, a)


@pytest.mark.parametrize("bad", ["", "has space", "x" * 129, "-leading"])
def test_invalid_session_id_is_rejected(server: InProcessReef, scenario: str, bad: str) -> None:
    r = httpx.post(
        f"{server.base_url}/chat/completions",
        headers={"x-reef-scenario": scenario, "x-reef-session-id": bad},
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_session_id"


def test_the_end_user_is_recorded_as_a_tag(server: InProcessReef, scenario: str) -> None:
    """x-reef-user-id names who a call served: the record's tag reef.user (reef.select.users
    trains on one user's turns); a call without it has no such tag."""
    c = _client(server, scenario, **{"x-reef-user-id": "alice@example.com"})
    a, _ = _ask(c, [{"role": "user", "content": "Name a fish."}])
    assert _record(server, scenario, a)["tags"]["reef.user"] == "alice@example.com"
    b, _ = _ask(_client(server, scenario), [{"role": "user", "content": "Name a bird."}])
    assert "reef.user" not in _record(server, scenario, b)["tags"]
    r = httpx.post(
        f"{server.base_url}/chat/completions",
        headers={"x-reef-scenario": scenario, "x-reef-user-id": "x" * 513},
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_user_id"
    assert r.json()["error"]["param"] == "x-reef-user-id"


def test_anthropic_route_stitches_turns(server: InProcessReef, scenario: str) -> None:
    c = anthropic.Anthropic(
        base_url=server.url, api_key="unused", default_headers={"x-reef-scenario": scenario}
    )
    messages: list[dict] = [{"role": "user", "content": "Name a fish."}]
    raw = c.messages.with_raw_response.create(
        model="tiny", max_tokens=6, system="Be brief.", messages=messages
    )
    first = raw.headers["x-reef-agent-record-id"]
    answer = raw.parse()
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in answer.content]},
        {"role": "user", "content": "Another one."},
    ]
    raw = c.messages.with_raw_response.create(
        model="tiny", max_tokens=6, system="Be brief.", messages=messages
    )
    second = raw.headers["x-reef-agent-record-id"]
    r0, r1 = _record(server, scenario, first), _record(server, scenario, second)
    assert r0["route"] == "messages" and r0["turn"] == 0
    assert (r1["session_id"], r1["turn"], r1["parent_id"]) == (r0["session_id"], 1, first)


def test_identical_conversations_each_get_their_next_turn(
    server: InProcessReef, scenario: str
) -> None:
    """Two users ask the same and get the same answer (greedy): the two records share one
    conversation state. Each user's next turn continues one of them, so both answers have a
    next turn (what the judge reads), rather than both next turns landing on the oldest."""
    c = _client(server, scenario)
    start = [{"role": "user", "content": "Name a river."}]
    first, answer = _ask(c, start)
    second, again = _ask(c, start)
    assert again["content"] == answer["content"]
    follow = [*start, answer, {"role": "user", "content": "Longer?"}]
    a, _ = _ask(c, follow)
    b, _ = _ask(c, follow)

    ra, rb = _record(server, scenario, a), _record(server, scenario, b)
    assert {ra["parent_id"], rb["parent_id"]} == {first, second}
    assert all(r["turn"] == 1 for r in (ra, rb))
    sessions = {_record(server, scenario, r)["session_id"] for r in (first, second)}
    assert {ra["session_id"], rb["session_id"]} == sessions
