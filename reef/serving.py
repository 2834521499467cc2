"""Serve one inference call and record it: engine in, durable record out, receipt back.

The API routes (OpenAI and Anthropic wire formats) do HTTP framing only; this module decides
which release serves the call, asks the engine, and makes the record durable before the
answer (or a stream's final event) leaves.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from reef.engines.base import Completion, Engine
from reef.errors import BadRequest, UnknownModel
from reef.records import Record, Scenario, new_id, utcnow
from reef.store.base import Store
from reef.store.commits import GroupCommitter

Render = Callable[[dict[str, Any]], dict[str, Any]]


def _identity(response: dict[str, Any]) -> dict[str, Any]:
    return response


@dataclass(frozen=True)
class Call:
    """One accepted inference request, ready for the engine."""

    scenario: Scenario
    route: str  # "chat.completions" | "messages"
    client_body: dict[str, Any]  # as the client sent it (what the record keeps)
    engine_body: dict[str, Any]  # OpenAI chat-completions form for the engine
    tags: dict[str, str]
    record_id: str

    @property
    def release_id(self) -> str:
        return self.scenario.head_release_id


class Serving:
    """Scenario lookup, request checks, engine calls and durable recording."""

    def __init__(
        self,
        engine: Engine,
        store: Store,
        committer: GroupCommitter,
        *,
        max_tokens_cap: int,
        scenario_ttl_s: float = 2.0,
    ):
        self.engine = engine
        self.store = store
        self.committer = committer
        self.max_tokens_cap = max_tokens_cap
        # Scenario rows are read on every call; a short cache keeps that off the hot path.
        # The head may move in another process (a flow publishing a release), hence the TTL.
        self._scenario_ttl_s = scenario_ttl_s
        self._scenarios: dict[str, tuple[Scenario, float]] = {}

    async def scenario(self, name: str) -> Scenario:
        """The scenario, created with its base release on first use."""
        hit = self._scenarios.get(name)
        now = time.monotonic()
        if hit is not None and hit[1] > now:
            return hit[0]
        scenario = await asyncio.to_thread(self.store.ensure_scenario, name)
        self._scenarios[name] = (scenario, now + self._scenario_ttl_s)
        return scenario

    def forget(self, name: str) -> None:
        self._scenarios.pop(name, None)

    def resolve_model(self, requested: str) -> str:
        models = self.engine.models()
        if requested in models:
            return requested
        known = ", ".join(models)
        raise UnknownModel(
            f"The model '{requested}' does not exist on this server; available: {known}",
            param="model",
        )

    def check_max_tokens(self, max_tokens: int | None, param: str = "max_tokens") -> None:
        if max_tokens is not None and max_tokens > self.max_tokens_cap:
            raise BadRequest(
                f"{param} is {max_tokens}, above this server's cap of {self.max_tokens_cap}",
                code="max_tokens_too_large",
                param=param,
            )

    def new_call(
        self,
        scenario: Scenario,
        route: str,
        client_body: dict[str, Any],
        engine_body: dict[str, Any],
        tags: dict[str, str],
    ) -> Call:
        return Call(scenario, route, client_body, engine_body, tags, new_id("rec"))

    def _record(self, call: Call, response: dict[str, Any], done: Completion, t0: float) -> Record:
        timings = dict(done.timings)
        timings["server_ms"] = (time.perf_counter() - t0) * 1000.0
        return Record(
            id=call.record_id,
            scenario=call.scenario.name,
            created_at=utcnow(),
            route=call.route,
            model=str(call.client_body.get("model", "")),
            stream=bool(call.client_body.get("stream", False)),
            request=call.client_body,
            response=response,
            release_id=call.release_id,
            prompt_token_ids=done.prompt_token_ids,
            completion_token_ids=done.completion_token_ids,
            logprobs=done.logprobs,
            timings=timings,
            tags=call.tags,
        )

    async def complete(self, call: Call, render: Render = _identity) -> tuple[Record, Completion]:
        """Serve without streaming; returns once the record is durable."""
        t0 = time.perf_counter()
        done = await self.engine.complete(call.engine_body)
        record = self._record(call, render(done.response), done, t0)
        await self.committer.add(record)
        return record, done

    async def open_stream(
        self, call: Call, render: Render = _identity
    ) -> AsyncIterator[dict[str, Any] | tuple[Record, Completion]]:
        """Start a stream. Errors before the first chunk raise here, before any header is sent.

        The returned iterator yields chunk dicts, then one (record, completion) pair once the
        record is durable; the route sends its final event only after that.
        """
        t0 = time.perf_counter()
        source = aiter(self.engine.stream(call.engine_body))
        try:
            first = await anext(source)
        except BaseException:
            await _close(source)
            raise
        return self._relay(call, source, first, render, t0)

    async def _relay(
        self,
        call: Call,
        source: AsyncIterator[dict[str, Any] | Completion],
        first: dict[str, Any] | Completion,
        render: Render,
        t0: float,
    ) -> AsyncIterator[dict[str, Any] | tuple[Record, Completion]]:
        try:
            item = first
            while not isinstance(item, Completion):
                yield item
                item = await anext(source)
            record = self._record(call, render(item.response), item, t0)
            await self.committer.add(record)
            yield record, item
        finally:
            await _close(source)


async def _close(source: AsyncIterator[Any]) -> None:
    aclose = getattr(source, "aclose", None)
    if aclose is not None:
        await aclose()
