"""`engine.upstream.responses: true`: /v1/responses goes unchanged to an upstream that serves
the Responses API itself (tests/responses_upstream.py, a real HTTP server), through the openai
SDK; plain and streamed answers come back as the upstream sent them, recorded with receipts
(the stream's receipt at its start, its last event after the record is durable); the
upstream's refusals keep their status."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from reef.cli.testing import InProcessReef
from tests.api.conftest import records_of
from tests.responses_upstream import MODEL, ResponsesUpstream


@pytest.fixture(scope="module")
def front(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[InProcessReef, ResponsesUpstream]]:
    with (
        ResponsesUpstream() as upstream,
        InProcessReef(
            tmp_path_factory.mktemp("front"),
            engine={
                "kind": "upstream",
                "upstream": {"url": upstream.base_url, "responses": True},
            },
        ) as reef,
    ):
        yield reef, upstream


def _client(reef: InProcessReef, scenario: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=reef.base_url,
        api_key="unused",
        default_headers={"x-reef-scenario": scenario, "x-reef-session-id": f"{scenario}-s"},
        max_retries=0,
    )


def test_a_response_passes_through_unchanged_with_a_receipt(
    front: tuple[InProcessReef, ResponsesUpstream], scenario: str
) -> None:
    reef, upstream = front
    api = _client(reef, scenario)
    body = {"instructions": "Be brief.", "reasoning": {"effort": "low"}, "store": True}
    raw = api.responses.with_raw_response.create(model=MODEL, input="hello there", **body)  # type: ignore[call-overload]
    resp = raw.parse()
    assert resp.id == "resp_up1" or resp.id.startswith("resp_up")  # the upstream's own id
    assert resp.output_text == "echo: hello there (turns before: 0)"
    sent = upstream.bodies[-1]
    assert sent["input"] == "hello there" and sent["reasoning"] == {"effort": "low"}
    assert sent["instructions"] == "Be brief."  # nothing translated, nothing injected
    receipt = raw.headers["x-reef-agent-record-id"]
    # the conversation continues on the upstream, by its ids
    second = api.responses.create(model=MODEL, previous_response_id=resp.id, input="again")
    assert second.output_text == "echo: again (turns before: 1)"
    one, two = sorted(records_of(reef, scenario), key=lambda r: r["turn"])
    assert one["id"] == receipt and one["route"] == "responses"
    assert one["request"]["input"] == "hello there" and one["response"]["id"] == resp.id
    assert two["session_id"] == one["session_id"] == f"{scenario}-s" and two["turn"] == 1


def test_a_stream_passes_through_event_by_event(
    front: tuple[InProcessReef, ResponsesUpstream], scenario: str
) -> None:
    reef, _ = front
    api = _client(reef, scenario)
    with api.responses.with_streaming_response.create(
        model=MODEL, input="stream me", stream=True
    ) as raw:
        receipt = raw.headers["x-reef-agent-record-id"]
        events = list(raw.parse())
    assert [e.sequence_number for e in events] == list(range(len(events)))  # the upstream's
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "echo: stream me (turns before: 0)"
    (record,) = records_of(reef, scenario)
    assert record["id"] == receipt and record["stream"] is True
    assert record["response"]["output"][0]["content"][0]["text"] == text


def test_the_upstreams_refusal_keeps_its_status(
    front: tuple[InProcessReef, ResponsesUpstream], scenario: str
) -> None:
    reef, _ = front
    api = _client(reef, scenario)
    with pytest.raises(openai.BadRequestError) as e:  # the upstream's 400, relayed
        api.responses.create(model=MODEL, input="refuse me")
    assert "refused by the upstream" in e.value.message
    with pytest.raises(openai.NotFoundError):  # a model the upstream does not list: Reef's 404
        api.responses.create(model="nope", input="x")
    assert records_of(reef, scenario) == []


def test_another_scenarios_response_cannot_be_continued(
    front: tuple[InProcessReef, ResponsesUpstream], scenario: str
) -> None:
    """The upstream keeps every scenario's responses under one key: Reef continues a
    `previous_response_id` only when one of the caller's scenario's records answered with it
    (a streamed answer too)."""
    reef, upstream = front
    theirs = _client(reef, f"{scenario}-other").responses.create(model=MODEL, input="secret")
    api = _client(reef, scenario)
    sent = len(upstream.bodies)
    for foreign in (theirs.id, "resp_never_seen"):
        with pytest.raises(openai.NotFoundError) as e:
            api.responses.create(model=MODEL, previous_response_id=foreign, input="tell me")
        assert e.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert len(upstream.bodies) == sent  # the upstream was never asked
    with api.responses.with_streaming_response.create(
        model=MODEL, input="mine", stream=True
    ) as raw:
        mine = next(e for e in raw.parse() if e.type == "response.completed").response
    again = api.responses.create(model=MODEL, previous_response_id=mine.id, input="and?")
    assert again.output_text == "echo: and? (turns before: 1)"
