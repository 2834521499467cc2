"""Serve one inference call and record it: engine in, durable record out, receipt back.

The API routes (OpenAI and Anthropic wire formats) do HTTP framing only; this module decides
which release serves the call, asks the engine, and makes the record durable before the
answer (or a stream's final event) leaves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from reef import anthropic, logs, responses
from reef.admission import Admission, Slot
from reef.engines.base import Completion, Engine, ServesResponses
from reef.engines.chunks import assemble
from reef.engines.defaults import sampling_tags
from reef.errors import IdempotencyKeyReused, SessionTurnTaken, UnknownModel
from reef.harness import Harness, HarnessCache
from reef.limits import Limits
from reef.records import INCOMPLETE_TAG, Record, Scenario, new_id, utcnow
from reef.rollouts import Arm, Rollouts, served_release
from reef.sessions import candidate_hashes, record_state_hash
from reef.shadow import Shadows
from reef.store.chain import ChainStore
from reef.store.commits import GroupCommitter
from reef.store.deadline import bounded
from reef.store.records import RecordStore
from reef.store.scenarios import ScenarioStore
from reef.store.sessions import SessionStore
from reef.variants import Variants

log = logging.getLogger(__name__)

T = TypeVar("T")

Render = Callable[[dict[str, Any]], dict[str, Any]]
# A scenario's own sampling values (reef.scenario_settings.sampling_defaults): None where the
# engine's apply. Called off the event loop; it may read the database.
SamplingOf = Callable[[str], dict[str, float] | None]


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
    session_id: str | None = None
    turn: int | None = None
    parent_id: str | None = None
    idempotency_key: str | None = None
    # The parent this call continues in its session, held so that a concurrent continuation
    # of the same parent in this process becomes a fork (see Serving._session).
    claim: str | None = None
    # A stored answer to this request (an Idempotency-Key retry): give it back, serve nothing.
    replay: Record | None = None
    # A Responses body the engine's server answers itself (ServesResponses): `engine_body` is
    # the client's body and goes to `respond` / `respond_stream` instead of the chat methods.
    native: bool = False
    # The engine body before the head's variant and harness went in: what a shadow rollout's
    # candidate gets, with its own (reef.shadow).
    base_body: dict[str, Any] | None = None
    # The client named the session (x-reef-session-id, a continued response): a turn another
    # replica took first becomes the next turn of that session, not a fork.
    explicit_session: bool = False
    # The rollout arm drawn for this call: the one its outcome counts for (never its tags,
    # which a caller's headers could have named).
    arm: Arm | None = None
    # The scenario's own sampling values for a request that names none, over the engine's
    # (scenarios.<name>.engine.sampling_defaults); None: the engine's apply.
    sampling_defaults: dict[str, float] | None = None

    @property
    def release_id(self) -> str:
        return self.replay.release_id if self.replay else self.scenario.head_release_id


def _state_hash(call: Call, response: dict[str, Any], answer: dict[str, Any]) -> str:
    """The conversation state after the call; for a Responses body passed through (whose
    conversation the upstream keeps), the upstream's response id as a state."""
    if call.native and isinstance(response.get("id"), str):
        return responses.answered_state(response["id"])
    return record_state_hash(call.engine_body.get("messages") or [], answer)


@dataclass(frozen=True)
class _Session:
    """Where a call goes in its session (None for a replayed record stored without one)."""

    session_id: str | None
    turn: int | None
    parent_id: str | None = None
    claim: str | None = None

    @classmethod
    def of(cls, record: Record) -> _Session:
        """The place a stored record was given."""
        return cls(record.session_id, record.turn, record.parent_id)


# A claim on a parent left behind by a stream whose body never started (and whose cleanup
# therefore never ran) stops counting after this long.
_CLAIM_TTL_S = 600.0

# How often a record whose session turn was taken concurrently is re-stitched and written
# again before the call fails (each retry follows a write that beat it, so more than a couple
# means a session written to by many replicas at once).
_RESTITCH_TRIES = 8


class ServingStore(ScenarioStore, RecordStore, SessionStore, ChainStore, Protocol):
    """What serving reads: the scenario row (created on first use), records (sessions and
    Idempotency-Keys; they are written through the GroupCommitter), and the release or live
    canary that serves a call."""


class Serving:
    """Scenario lookup, request checks, engine calls and durable recording."""

    def __init__(
        self,
        engine: Engine,
        store: ServingStore,
        committer: GroupCommitter,
        *,
        max_tokens_cap: int,
        scenario_ttl_s: float = 2.0,
        variants: Variants | None = None,
        harnesses: HarnessCache | None = None,
        limits: Limits | None = None,
        rollouts: Rollouts | None = None,
        shadows: Shadows | None = None,
        admission: Admission | None = None,
        sampling_of: SamplingOf | None = None,
        store_deadline_s: float | None = None,
    ):
        self.engine = engine
        # How long a call's store work (its lookups here; the record's commit is the
        # committer's) may wait for the database: store.deadline_s on Postgres, None on SQLite.
        self.store_deadline_s = store_deadline_s
        # Each scenario's own sampling values, read with its row (and cached as long).
        self._sampling_of = sampling_of
        # The engine's running slots and the bounded line in front of them (engine.max_running,
        # max_queue, max_queue_wait_s): every call takes a slot before the engine sees it.
        self.admission = admission
        # Live canaries: which arm (release) serves a call, and each arm's health.
        self.rollouts = rollouts
        # Shadow rollouts: copies of calls answered by the candidate after the user's answer.
        self.shadows = shadows
        # What one request may ask for (the routes check their bodies against it).
        self.limits = limits if limits is not None else Limits(max_tokens=max_tokens_cap)
        # The harness a scenario's head carries, injected into requests when its config says so.
        self.harnesses = harnesses
        # release id -> (its harness, the record tags saying what was injected); None: nothing
        self._injections: dict[str, tuple[Harness, dict[str, str]] | None] = {}
        # Which engine variant serves a scenario's head release (None: the engine cannot
        # load releases, and every scenario is served by its base model).
        self.variants = variants
        self.store = store
        self.committer = committer
        self.max_tokens_cap = max_tokens_cap
        # Scenario rows are read on every call; a short cache keeps that off the hot path.
        # The head may move in another process (a flow publishing a release), hence the TTL.
        self._scenario_ttl_s = scenario_ttl_s
        self._scenarios: dict[str, tuple[Scenario, dict[str, float] | None, float]] = {}
        # Session parents continued by calls in flight: parent id -> (record id, deadline).
        self._claims: dict[str, tuple[str, float]] = {}
        # Idempotency-Keys in flight: (scenario, route, key) -> (record id, its answer to come;
        # None when that call failed). A key names a request of one route only.
        self._keys: dict[tuple[str, str, str], tuple[str, asyncio.Future[Record | None]]] = {}
        # The records of cut streams being written (held so that the tasks are not collected).
        self._cut_writes: set[asyncio.Task[None]] = set()

    async def scenario(self, name: str) -> Scenario:
        """The scenario, created with its base release on first use."""
        hit = self._scenarios.get(name)
        now = time.monotonic()
        if hit is not None and hit[2] > now:
            return hit[0]
        scenario, sampling = await self._stored(self._read_scenario, name)
        self._scenarios[name] = (scenario, sampling, now + self._scenario_ttl_s)
        return scenario

    def _stored(self, fn: Callable[..., T], /, *args: Any) -> Awaitable[T]:
        """Store work off the event loop, answered StoreTimeout (503) once store.deadline_s
        passes without the database answering (reef.store.deadline)."""
        return bounded(self.store_deadline_s, fn, *args)

    def _read_scenario(self, name: str) -> tuple[Scenario, dict[str, float] | None]:
        """The scenario row and its own sampling values, in one trip off the event loop: run-time
        changes (PUT /reef/scenarios/{s}/settings in any replica) reach calls within the TTL."""
        scenario = self.store.ensure_scenario(name)
        return scenario, self._sampling_of(name) if self._sampling_of is not None else None

    def _sampling(self, name: str) -> dict[str, float] | None:
        hit = self._scenarios.get(name)
        return hit[1] if hit is not None else None

    def forget(self, name: str) -> None:
        self._scenarios.pop(name, None)

    def models(self) -> list[str]:
        """The models a client may name: the engine's, without release variants (a scenario's
        head picks the variant that serves it, never the client)."""
        loaded = set(self.variants.loaded()) if self.variants is not None else set()
        return [m for m in self.engine.models() if m not in loaded]

    def resolve_model(self, requested: str) -> str:
        models = self.models()
        if requested in models:
            return requested
        known = ", ".join(models)
        raise UnknownModel(
            f"The model '{requested}' does not exist on this server; available: {known}",
            param="model",
        )

    @property
    def passes_responses_through(self) -> bool:
        """Whether /v1/responses goes unchanged to an engine that serves it itself."""
        return isinstance(self.engine, ServesResponses) and self.engine.serves_responses

    def _engine_complete(self, call: Call) -> Awaitable[Completion]:
        if call.native:
            assert isinstance(self.engine, ServesResponses)
            return self.engine.respond(call.engine_body)
        return self.engine.complete(call.engine_body, sampling_defaults=call.sampling_defaults)

    async def _reloaded(self, call: Call) -> bool:
        """The call's variant left the engine between choosing it and the engine taking the
        call (a canary retired, a rollback unloading it, in another task): load it again, so
        the call is answered by the release it started on. False when it names no variant."""
        model = call.engine_body.get("model")
        if self.variants is None or call.base_body is None or model == call.base_body.get("model"):
            return False
        name = await self.variants.model_for(call.scenario.name, call.release_id)
        log.info("reloaded %s for a call that chose it before it was unloaded", name)
        return name == model

    def _engine_stream(self, call: Call) -> AsyncIterator[dict[str, Any] | Completion]:
        if call.native:
            assert isinstance(self.engine, ServesResponses)
            return self.engine.respond_stream(call.engine_body)
        return self.engine.stream(call.engine_body, sampling_defaults=call.sampling_defaults)

    def check_admission(self) -> None:
        """EngineBusy (429) now when the engine's line is full: the early answer, before the
        call's session, quota and Idempotency-Key are looked at (the authoritative check is
        when the call takes its slot)."""
        if self.admission is not None:
            self.admission.check()

    async def _slot(self) -> Slot | None:
        return await self.admission.enter() if self.admission is not None else None

    def check_max_tokens(self, max_tokens: int | None, param: str = "max_tokens") -> None:
        self.limits.check_max_tokens(max_tokens, param)

    async def new_call(
        self,
        scenario: Scenario,
        route: str,
        client_body: dict[str, Any],
        engine_body: dict[str, Any],
        tags: dict[str, str],
        *,
        session_id: str | None = None,
        idempotency_key: str | None = None,
        native: bool = False,
        user_id: str | None = None,
    ) -> Call:
        """A call ready for `complete` or `open_stream`, placed in its session; or, for a
        retried Idempotency-Key, a call whose `replay` is the stored record to answer with.
        `native`: a Responses body passed through unchanged (`passes_responses_through`), so
        no variant and no harness is put into it. Raises IdempotencyKeyReused (409) when the
        key names a different request body.
        """
        record_id = logs.for_call(scenario.name, new_id("rec"))  # what it logs names them
        base_body = engine_body
        arm = None
        if self.rollouts is not None:
            arm = await self.rollouts.arm(
                scenario,
                session_id=session_id,
                user_id=user_id,
                tags=tags,
                messages=engine_body.get("messages") or [],
                fallback=record_id,
            )
            if arm is not None:
                # The arm's release serves this call as the head would (variant, harness,
                # the release id recorded); the record's tags name the arm.
                scenario = dataclasses.replace(scenario, head_release_id=arm.release_id)
                tags = {**tags, **arm.tags}
        if self.variants is not None and not native:
            # The head's variant, fixed for this call: a deploy that moves the head meanwhile
            # does not change the weights (or the release id recorded) of a call in flight.
            variant = await self.variants.model_for(scenario.name, scenario.head_release_id)
            if variant is not None:
                engine_body = {**engine_body, "model": variant}
        if self.harnesses is not None and not native:
            # Before the session lookup: records hash the conversation the engine saw, so the
            # next turn (injected the same way) continues it.
            engine_body, tags = await self._with_harness(scenario, engine_body, tags)
        stored = None
        if idempotency_key is not None:
            stored = await self._take_key(
                scenario.name, route, idempotency_key, client_body, record_id
            )
        if stored is not None:  # a retried key: the stored record answers, in its own place
            record_id, place = stored.id, _Session.of(stored)
        else:
            try:
                place = await self._session(
                    scenario.name, engine_body.get("messages") or [], session_id, record_id
                )
            except BaseException:
                self._release_key(scenario.name, route, idempotency_key, record_id, None)
                raise
        return Call(
            scenario,
            route,
            client_body,
            engine_body,
            tags,
            record_id,
            place.session_id,
            place.turn,
            place.parent_id,
            idempotency_key,
            place.claim,
            replay=stored,
            native=native,
            base_body=base_body,
            explicit_session=stored is None and session_id is not None,
            arm=arm,
            sampling_defaults=None if native else self._sampling(scenario.name),
        )

    async def _with_harness(
        self, scenario: Scenario, engine_body: dict[str, Any], tags: dict[str, str]
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """The head's harness rules and skills catalog in the system message, when its config
        asks for server-side injection (`{"inject": true}` in harness.json). The record keeps
        the client's request as sent; its tags say what was injected and from which release."""
        assert self.harnesses is not None
        release_id = scenario.head_release_id
        if release_id not in self._injections:  # once per release: releases never change
            release = await self._stored(served_release, self.store, scenario.name, release_id)
            harness = await asyncio.to_thread(self.harnesses.get, release)
            text = harness.system_text() if harness is not None else ""
            inject = harness is not None and harness.config().get("inject") is True
            self._injections[release_id] = (
                (
                    harness,
                    {
                        "reef.harness": harness.content_hash(),
                        "reef.harness_release": release_id,
                        "reef.system": text,
                    },
                )
                if inject and text and harness is not None
                else None
            )
        injection = self._injections[release_id]
        if injection is None:
            return engine_body, tags
        harness, injected = injection
        messages = harness.inject(engine_body.get("messages") or [])
        return {**engine_body, "messages": messages}, {**tags, **injected}

    # sessions -------------------------------------------------------------------
    async def _session(
        self, scenario: str, messages: list[dict[str, Any]], explicit: str | None, record_id: str
    ) -> _Session:
        """Which session the call joins, as which turn, after which parent.

        An explicit session id wins: the call follows that session's highest turn. Otherwise
        the call continues the record whose request + answer its messages extend (the
        longest such), in that record's session, unless that record already has a
        continuation: then the call is a fork, a new session whose first record names the
        parent it branched from (turn = parent's turn + 1), so the tree can be rebuilt.

        "Already has a continuation" is decided from the database plus the calls in flight
        in this process (a claim on the parent, taken before the database is asked, so a
        continuation committed in between is seen). Two replicas continuing one parent at
        the same instant can both place their call at its next turn, and concurrent calls
        with one explicit session id can get the same turn; neither survives the write:
        (scenario, session, turn) is unique in the database, and a record that lost its turn
        is re-stitched (`_restitched`) and written again.
        """
        if explicit is not None:
            tail = await self._stored(self.store.session_tail, scenario, explicit)
            if tail is None:
                return _Session(explicit, 0)
            return _Session(explicit, (tail.turn or 0) + 1, tail.id)
        hashes = candidate_hashes(messages)
        if not hashes:
            return _Session(new_id("ses"), 0)
        parent = await self._stored(self.store.find_session_parent, scenario, hashes)
        if parent is None:
            return _Session(new_id("ses"), 0)
        turn = (parent.turn or 0) + 1
        if parent.session_id is not None and self._claim(parent.id, record_id):
            try:
                forked = await self._stored(self.store.has_children, scenario, parent.id)
            except BaseException:
                self._unclaim(parent.id, record_id)
                raise
            if not forked:
                return _Session(parent.session_id, turn, parent.id, claim=parent.id)
            self._unclaim(parent.id, record_id)
        return _Session(new_id("ses"), turn, parent.id)

    def _claim(self, parent_id: str, record_id: str) -> bool:
        now = time.monotonic()
        held = self._claims.get(parent_id)
        if held is not None and held[1] > now:
            return False
        self._claims[parent_id] = (record_id, now + _CLAIM_TTL_S)
        return True

    def _unclaim(self, parent_id: str, record_id: str) -> None:
        held = self._claims.get(parent_id)
        if held is not None and held[0] == record_id:
            del self._claims[parent_id]

    # idempotency ----------------------------------------------------------------
    async def _take_key(
        self, scenario: str, route: str, key: str, body: dict[str, Any], record_id: str
    ) -> Record | None:
        """The record stored (or being made in this process) under `key` for `route`, if any;
        else None, and this call now holds the key until it ends (`_release_key`)."""
        slot = (scenario, route, key)
        while (held := self._keys.get(slot)) is not None:
            # An identical request is in flight here: its answer is ours. If it failed, nothing
            # was stored and this request tries itself (unless another waiter took over).
            stored = await asyncio.shield(held[1])
            if stored is not None:
                return _same_request(stored, key, body)
        future: asyncio.Future[Record | None] = asyncio.get_running_loop().create_future()
        self._keys[slot] = (record_id, future)
        try:
            stored = await self._stored(self.store.find_idempotent, scenario, route, key)
        except BaseException:
            self._release_key(scenario, route, key, record_id, None)
            raise
        if stored is None:
            return None
        self._release_key(scenario, route, key, record_id, stored)
        return _same_request(stored, key, body)

    def _release_key(
        self, scenario: str, route: str, key: str | None, record_id: str, record: Record | None
    ) -> None:
        if key is None:
            return
        slot = (scenario, route, key)
        held = self._keys.get(slot)
        if held is None or held[0] != record_id:
            return
        del self._keys[slot]
        if not held[1].done():
            held[1].set_result(record)

    async def _stored_instead(self, call: Call, clash: IdempotencyKeyReused) -> Record:
        """Another process stored a record under this call's key first (the unique index
        refused ours): its record is the answer, when it was for the same body."""
        assert call.idempotency_key is not None
        stored = await self._stored(
            self.store.find_idempotent, call.scenario.name, call.route, call.idempotency_key
        )
        if stored is None:
            raise clash
        return _same_request(stored, call.idempotency_key, call.client_body)

    def _end(self, call: Call, record: Record | None) -> None:
        """The call is over (answered, failed or abandoned): release what it held."""
        if call.claim is not None:
            self._unclaim(call.claim, call.record_id)
        self._release_key(
            call.scenario.name, call.route, call.idempotency_key, call.record_id, record
        )

    async def _restitched(self, call: Call, record: Record) -> Record:
        """`record` again, placed where it belongs now that another record took its session
        turn first: with an explicit session, the turn after the session's tail; continuing a
        conversation, a fork (a new session that still names the parent), exactly what this
        call would have become had it seen the other one before it started."""
        if call.explicit_session and record.session_id is not None:
            tail = await self._stored(self.store.session_tail, record.scenario, record.session_id)
            if tail is not None:
                turn = (tail.turn or 0) + 1
                return dataclasses.replace(record, turn=turn, parent_id=tail.id)
        return dataclasses.replace(record, session_id=new_id("ses"))

    async def _commit(self, call: Call, record: Record) -> Record:
        """Make `record` durable; the record as written (re-stitched if its turn was taken)."""
        for _ in range(_RESTITCH_TRIES - 1):
            try:
                await self.committer.add(record)
                return record
            except SessionTurnTaken:
                record = await self._restitched(call, record)
        await self.committer.add(record)
        return record

    # serving ----------------------------------------------------------------------
    def _record(self, call: Call, response: dict[str, Any], done: Completion, t0: float) -> Record:
        timings = dict(done.timings)
        timings["server_ms"] = (time.perf_counter() - t0) * 1000.0
        # The conversation state a client continues: the answer as it will come back in its
        # next request (for /v1/messages, the Anthropic answer as to_openai will translate it).
        answer = (
            anthropic.assistant_message(response) if call.route == "messages" else done.response
        )
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
            topk=done.topk,
            timings=timings,
            tags={**call.tags, **sampling_tags(done.sampling)},
            session_id=call.session_id,
            turn=call.turn,
            parent_id=call.parent_id,
            state_hash=_state_hash(call, response, answer),
            idempotency_key=call.idempotency_key,
        )

    async def complete(self, call: Call, render: Render = _identity) -> tuple[Record, Completion]:
        """Serve without streaming; returns once the record is durable.

        The record returned is normally the call's own. With an Idempotency-Key that another
        process stored first (both ran the engine; the unique index kept one record), it is
        that process's record: one record, one receipt, for every retry.
        """
        t0 = time.perf_counter()
        record: Record | None = None
        try:
            slot = await self._slot()
            try:
                try:
                    done = await self._engine_complete(call)
                except UnknownModel:
                    if not await self._reloaded(call):
                        raise
                    done = await self._engine_complete(call)
            finally:  # the engine is done with it: the next call in line starts meanwhile
                if slot is not None:
                    slot.release()
            record = self._record(call, render(done.response), done, t0)
            try:
                record = await self._commit(call, record)
            except IdempotencyKeyReused as clash:
                record = await self._stored_instead(call, clash)
        except BaseException as e:
            self._end(call, None)
            self._observe(call, e, t0)
            raise
        self._end(call, record)
        self._observe(call, None, t0)
        self._shadow(call, record, done)
        return record, done

    def _shadow(self, call: Call, record: Record, done: Completion) -> None:
        """Copy this answered call to the scenario's shadow candidate, when the sample and the
        bound allow: nothing here waits (reef.shadow runs the copy as a background task, and
        looks the candidate up there)."""
        shadows, rollouts = self.shadows, self.rollouts
        if shadows is None or rollouts is None or call.native or call.base_body is None:
            return
        name = call.scenario.name
        if call.replay is not None or not shadows.active(name) or not shadows.take(name):
            return
        body = {k: v for k, v in call.base_body.items() if k not in ("stream", "stream_options")}

        async def candidate() -> str | None:
            # Only copies answered by the head the candidate was made on compare the two (after
            # a promote, or with the head moved, the cached candidate may be stale a moment).
            live = await rollouts.canary(name)
            return live.id if live is not None and live.parent_id == record.release_id else None

        async def answer(release_id: str) -> dict[str, Any]:
            prepared = body
            if self.variants is not None:
                variant = await self.variants.model_for(name, release_id)
                if variant is not None:
                    prepared = {**prepared, "model": variant}
            if self.harnesses is not None:
                scenario = dataclasses.replace(call.scenario, head_release_id=release_id)
                prepared, _ = await self._with_harness(scenario, prepared, {})
            defaults = call.sampling_defaults  # the candidate samples as the user's answer did
            return (await self.engine.complete(prepared, sampling_defaults=defaults)).response

        messages = body.get("messages") or []
        shadows.launch(record, messages, done.response, candidate, answer)

    def _observe(self, call: Call, error: BaseException | None, t0: float) -> None:
        """A rollout arm's call outcome for its guardrail: a server-side failure (an engine
        error, a 5xx) counts against the arm; a refused request (4xx) is the client's."""
        arm = call.arm
        if self.rollouts is None or arm is None or arm.name not in ("canary", "control"):
            return
        if error is not None and getattr(error, "status", 500) < 500:
            return
        ms = (time.perf_counter() - t0) * 1000.0
        self.rollouts.observe(arm.rollout_id, arm.name, error is None, ms)

    async def open_stream(
        self, call: Call, render: Render = _identity
    ) -> AsyncIterator[dict[str, Any] | tuple[Record, Completion]]:
        """Start a stream. Errors before the first chunk raise here, before any header is sent.

        The returned iterator yields chunk dicts, then one (record, completion) pair once the
        record is durable; the route sends its final event only after that.
        """
        t0 = time.perf_counter()
        slot: Slot | None = None
        try:
            slot = await self._slot()
            source = aiter(self._engine_stream(call))
            try:
                first = await anext(source)
            except UnknownModel:
                await _close(source)
                if not await self._reloaded(call):
                    raise
                source = aiter(self._engine_stream(call))
                try:
                    first = await anext(source)
                except BaseException:
                    await _close(source)
                    raise
            except BaseException:
                await _close(source)
                raise
        except BaseException:
            if slot is not None:
                slot.release()
            self._end(call, None)
            raise
        relay = self._relay(call, source, first, render, t0, slot)
        # A body the server never starts iterating (the client left first) never runs the
        # relay's `finally`: release the call's slot and claims when the generator is dropped.
        weakref.finalize(relay, self._dropped, call, slot)
        return relay

    def _dropped(self, call: Call, slot: Slot | None) -> None:
        if slot is not None:
            slot.release()
        self._end(call, None)

    async def _relay(
        self,
        call: Call,
        source: AsyncIterator[dict[str, Any] | Completion],
        first: dict[str, Any] | Completion,
        render: Render,
        t0: float,
        slot: Slot | None = None,
    ) -> AsyncIterator[dict[str, Any] | tuple[Record, Completion]]:
        record: Record | None = None
        sent: list[dict[str, Any]] = []  # the chunks handed on: a cut stream's record
        finished = False
        try:
            item = first
            while not isinstance(item, Completion):
                sent.append(item)
                yield item
                item = await anext(source)
            finished = True
            if slot is not None:  # the engine is done with it; the record is written next
                slot.release()
            made = self._record(call, render(item.response), item, t0)
            try:
                made = await self._commit(call, made)
            except IdempotencyKeyReused as e:
                # The stream (with this call's receipt in its headers) has been sent already:
                # another process stored an answer under this key first. Say so; a retry
                # replays that answer.
                raise IdempotencyKeyReused(
                    f"Idempotency-Key '{call.idempotency_key}' was stored by a concurrent "
                    f"request first ({e.message}); retry to receive its answer"
                ) from e
            record = made
            self._shadow(call, record, item)
            yield record, item
        except BaseException as e:
            if not finished and sent:
                await self._keep_cut(call, sent, render, t0, e)
            raise
        finally:
            if slot is not None:
                slot.release()
            self._end(call, record)
            await _close(source)

    async def _keep_cut(
        self,
        call: Call,
        sent: list[dict[str, Any]],
        render: Render,
        t0: float,
        cause: BaseException,
    ) -> None:
        """A stream cut before its end still gets a record under the receipt its headers
        carried: what was streamed so far, tagged reef.incomplete with why. Stored without the
        call's Idempotency-Key (a retry with the key runs again instead of replaying the cut
        answer). An engine failure's record is durable before the route sends the error event;
        a stream closed from outside (the client left: a cancellation, or the generator closed)
        may await nothing more, so its record is written by a task of its own."""
        reason = "engine_error" if isinstance(cause, Exception) else "stream_closed"
        try:
            record = self._cut_record(call, sent, render, t0, reason)
        except Exception:
            log.exception(
                "stream %s was cut (%s); its record could not be made", call.record_id, reason
            )
            return
        if reason == "engine_error":
            await self._store_cut(call, record)
            return
        try:
            task = asyncio.get_running_loop().create_task(self._store_cut(call, record))
        except RuntimeError:  # the loop is gone (a stream collected after shutdown)
            log.error("stream %s was cut after the server stopped: no record", call.record_id)
            return
        self._cut_writes.add(task)
        task.add_done_callback(self._cut_writes.discard)

    def _cut_record(
        self, call: Call, sent: list[dict[str, Any]], render: Render, t0: float, reason: str
    ) -> Record:
        response: dict[str, Any]
        partial: dict[str, Any]
        if call.native:  # Responses events: the newest state of the response they carried
            objects = (e["response"] for e in reversed(sent) if isinstance(e.get("response"), dict))
            response = partial = next(objects, {})
        else:  # chat.completion chunks: the answer they add up to, in the route's form
            partial = assemble(sent)
            response = render(partial)
        made = self._record(call, _unfinished(response), Completion(response=partial), t0)
        tags = {**made.tags, INCOMPLETE_TAG: reason}
        return dataclasses.replace(made, tags=tags, idempotency_key=None)

    async def _store_cut(self, call: Call, record: Record) -> None:
        try:
            await self._commit(call, record)
        except Exception as e:
            log.error("stream %s was cut; storing what it sent failed: %s", record.id, e)


def _same_request(stored: Record, key: str, body: dict[str, Any]) -> Record:
    if stored.request != body:
        raise IdempotencyKeyReused(
            f"Idempotency-Key '{key}' was already used for a different request "
            f"(record '{stored.id}'); use a new key for a new request"
        )
    return stored


def _unfinished(response: dict[str, Any]) -> dict[str, Any]:
    """A cut stream's answer in its route's form, saying that it did not end: an Anthropic
    message without a stop_reason, a Responses object `incomplete` (a chat.completion's
    finish_reason is null already)."""
    out = dict(response)
    if "stop_reason" in out:
        out["stop_reason"] = None
    if out.get("object") == "response":
        out["status"] = "incomplete"
    return out


async def _close(source: AsyncIterator[Any]) -> None:
    aclose = getattr(source, "aclose", None)
    if aclose is not None:
        await aclose()
