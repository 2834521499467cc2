"""Two serving fronts (two replicas) over one database, racing where only the database can
tell them apart: both continue one conversation, both follow one explicit session id, both
answer one Idempotency-Key. Each front decides from what the database held when its call
started, so the race is set up deterministically: every call is placed before any is written.
"""

from __future__ import annotations

import asyncio
from typing import Any

from reef.serving import Serving
from reef.store.commits import GroupCommitter
from reef.store.sql import SQLStore

ASK = [{"role": "user", "content": "Name a fish."}]


def _body(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "tiny", "messages": messages, "max_tokens": 4, "temperature": 0}


async def _replicas(engine: Any, store: SQLStore, n: int) -> list[Serving]:
    fronts = []
    for _ in range(n):
        committer = GroupCommitter(store)
        await committer.start()
        fronts.append(Serving(engine, store, committer, max_tokens_cap=64, scenario_ttl_s=0))
    return fronts


async def _close(fronts: list[Serving]) -> None:
    for front in fronts:
        await front.committer.aclose()


def test_two_replicas_continuing_one_turn_make_one_session_and_a_fork(
    engine: Any, store: SQLStore
) -> None:
    async def run() -> None:
        a, b = await _replicas(engine, store, 2)
        scenario = await a.scenario("race")
        first, _ = await a.complete(
            await a.new_call(scenario, "chat.completions", {}, _body(ASK), {})
        )
        history = [
            *ASK,
            first.response["choices"][0]["message"],
            {"role": "user", "content": "More."},
        ]
        # Both replicas look the parent up before either writes: both see no continuation.
        on_a = await a.new_call(scenario, "chat.completions", {}, _body(history), {})
        on_b = await b.new_call(scenario, "chat.completions", {}, _body(history), {})
        assert (on_a.session_id, on_a.turn) == (on_b.session_id, on_b.turn) == (first.session_id, 1)
        won, _ = await a.complete(on_a)
        lost, _ = await b.complete(on_b)
        await _close([a, b])

        assert (won.session_id, won.turn, won.parent_id) == (first.session_id, 1, first.id)
        # The loser became what it would have been had it started a moment later: a fork.
        assert lost.session_id not in (None, first.session_id)
        assert (lost.turn, lost.parent_id) == (1, first.id)
        stored = {r.id: r for r in store.list_records("race")}
        assert stored[lost.id].session_id == lost.session_id and stored[lost.id].turn == 1
        assert [r.id for r in store.session_records("race", first.session_id)] == [first.id, won.id]

    asyncio.run(run())


def test_replicas_sharing_an_explicit_session_id_take_successive_turns(
    engine: Any, store: SQLStore
) -> None:
    async def run() -> None:
        fronts = await _replicas(engine, store, 3)
        scenario = await fronts[0].scenario("explicit")
        calls = [
            await f.new_call(scenario, "chat.completions", {}, _body(ASK), {}, session_id="app-1")
            for f in fronts
        ]
        assert {c.turn for c in calls} == {0}
        done = await asyncio.gather(*(f.complete(c) for f, c in zip(fronts, calls, strict=True)))
        await _close(fronts)

        records = sorted((r for r, _ in done), key=lambda r: r.turn or 0)
        assert [r.turn for r in records] == [0, 1, 2]
        assert {r.session_id for r in records} == {"app-1"}
        assert [r.parent_id for r in records] == [None, records[0].id, records[1].id]
        stored = sorted(store.list_records("explicit"), key=lambda r: r.turn or 0)
        assert [(r.id, r.turn) for r in stored] == [(r.id, r.turn) for r in records]

    asyncio.run(run())


def test_one_idempotency_key_on_two_replicas_is_one_record(engine: Any, store: SQLStore) -> None:
    """Both replicas run the engine (neither saw the other's key in time); the unique index
    keeps one record, and the replica that lost answers with the winner's record."""

    async def run() -> None:
        a, b = await _replicas(engine, store, 2)
        scenario = await a.scenario("keys")
        body = _body(ASK)
        on_a = await a.new_call(scenario, "chat.completions", body, body, {}, idempotency_key="k1")
        on_b = await b.new_call(scenario, "chat.completions", body, body, {}, idempotency_key="k1")
        assert on_a.replay is None and on_b.replay is None
        won, _ = await a.complete(on_a)
        answered, _ = await b.complete(on_b)
        # A retry on either replica now replays the stored record without running the engine.
        retry = await b.new_call(scenario, "chat.completions", body, body, {}, idempotency_key="k1")
        await _close([a, b])

        assert answered.id == won.id and answered.response == won.response
        assert retry.replay is not None and retry.replay.id == won.id
        assert [r.id for r in store.list_records("keys")] == [won.id]

    asyncio.run(run())
