"""Structured outputs on the embedded engine, through the official SDKs: `response_format`
(chat), `text.format` (Responses) and `output_config.format` (Messages) are enforced while
decoding, on the tiny random model, whose unconstrained answers are never JSON."""

from __future__ import annotations

import json
from typing import Literal

import anthropic
import httpx
import jsonschema
import openai
import pydantic
import pytest

from reef.cli.testing import InProcessReef
from tests.api.conftest import records_of

EDIT = {
    "type": "object",
    "properties": {
        "op": {"enum": ["grow", "nudge"]},
        "i": {"type": "integer", "minimum": 0, "maximum": 5},
        "ok": {"type": "boolean"},
    },
    "required": ["op", "i", "ok"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "edit", "schema": EDIT}}
ASK = [{"role": "user", "content": "One edit, please."}]


def client(server: InProcessReef, scenario: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.base_url, api_key="unused", default_headers={"x-reef-scenario": scenario}
    )


def test_json_schema_answers_fit_the_schema_and_records_keep_raw_logprobs(
    server: InProcessReef, scenario: str
) -> None:
    c = client(server, scenario)
    answers = [
        c.chat.completions.create(
            model="tiny",
            messages=ASK,
            response_format=FORMAT,  # type: ignore[arg-type]
            temperature=1.0,
            seed=seed,
            max_tokens=48,
        ).choices[0]
        for seed in range(6)
    ]
    for choice in answers:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content or ""), EDIT)
    assert len({a.message.content for a in answers}) > 1  # sampled, not one forced answer
    plain = c.chat.completions.create(model="tiny", messages=ASK, temperature=0, max_tokens=24)
    with pytest.raises(ValueError):  # the same model unconstrained writes no JSON
        json.loads(plain.choices[0].message.content or "")

    record = records_of(server, scenario)[0]
    assert record["request"]["response_format"] == FORMAT
    # The raw distribution's log-probs, not the mask's: a token the mask made certain still
    # has the probability the model gave it.
    assert len(record["logprobs"]) == len(record["completion_token_ids"])
    assert any(lp < -1e-3 for lp in record["logprobs"])


class Edit(pydantic.BaseModel):
    op: Literal["grow", "nudge"]
    i: int
    ok: bool


def test_the_sdk_parse_helper_gets_its_pydantic_model(server: InProcessReef, scenario: str) -> None:
    parsed = client(server, scenario).chat.completions.parse(
        model="tiny", messages=ASK, response_format=Edit, temperature=0.7, seed=3, max_tokens=48
    )
    edit = parsed.choices[0].message.parsed
    assert isinstance(edit, Edit) and edit.op in ("grow", "nudge")


def test_a_stream_assembles_to_a_valid_answer(server: InProcessReef, scenario: str) -> None:
    stream = client(server, scenario).chat.completions.create(
        model="tiny",
        messages=ASK,
        response_format=FORMAT,  # type: ignore[arg-type]
        temperature=1.0,
        seed=11,
        max_tokens=48,
        stream=True,
    )
    parts, finish = [], None
    for chunk in stream:
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "stop" and len([p for p in parts if p]) > 1
    jsonschema.validate(json.loads("".join(parts)), EDIT)


def test_json_object_answers_are_objects(server: InProcessReef, scenario: str) -> None:
    c = client(server, scenario)
    finished = []
    for seed in range(4):
        choice = c.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_object"},
            temperature=0.7,
            seed=seed,
            max_tokens=64,
        ).choices[0]
        text = choice.message.content or ""
        assert text.startswith("{")
        if choice.finish_reason == "stop":
            finished.append(json.loads(text))
    assert finished and all(isinstance(f, dict) for f in finished)


def test_responses_text_format_and_messages_output_config(
    server: InProcessReef, scenario: str
) -> None:
    response = client(server, scenario).responses.create(
        model="tiny",
        input="One edit, please.",
        text={"format": {"type": "json_schema", "name": "edit", "schema": EDIT, "strict": True}},
        temperature=1.0,
        max_output_tokens=48,
    )
    jsonschema.validate(json.loads(response.output_text), EDIT)

    message = anthropic.Anthropic(
        base_url=server.url, api_key="unused", default_headers={"x-reef-scenario": scenario}
    ).messages.create(
        model="tiny",
        max_tokens=48,
        messages=[{"role": "user", "content": "One edit, please."}],
        output_config={"format": {"type": "json_schema", "schema": EDIT}},
    )
    assert message.stop_reason == "end_turn"
    text = "".join(b.text for b in message.content if b.type == "text")
    jsonschema.validate(json.loads(text), EDIT)


@pytest.mark.parametrize(
    ("response_format", "says"),
    [
        ({"type": "regex", "regex": "a+"}, "'regex' is not supported"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "json_schema.schema"),
        ("json", "valid dictionary"),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}},
            "cannot be enforced",
        ),
    ],
)
def test_a_format_that_cannot_be_enforced_is_a_400_and_nothing_is_recorded(
    server: InProcessReef, scenario: str, response_format: object, says: str
) -> None:
    answer = httpx.post(
        f"{server.base_url}/chat/completions",
        headers={"x-reef-scenario": scenario},
        json={"model": "tiny", "messages": ASK, "response_format": response_format},
    )
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "response_format" and says in error["message"]
    assert records_of(server, scenario) == []


def test_the_discovery_demos_constrained_rollouts_are_edit_lists(server: InProcessReef) -> None:
    """The discovery demo's harness asks with its edits schema (`--constrained`); the tiny
    model, which writes no JSON of its own, answers lists the demo parses; the verifier alone
    decides whether the packing is valid."""
    from demo.discover import actions
    from demo.discover.harness import Config, Reef
    from demo.discover.sandbox import Limits

    n, scenario = 6, "discover-constrained"
    parent = actions.seed_state(n)
    reef = Reef(server.url, scenario, "tiny")
    cfg = Config(n=n, action="edits", constrained=True, max_tokens=96, temperature=1.0)
    try:
        answers = [
            reef.chat(actions.prompt("edits", n, parent, 0.9997, "", constrained=True), cfg, s)
            for s in range(4)
        ]
        plain = Config(n=n, action="edits", max_tokens=32, temperature=1.0)
        unconstrained, _, _ = reef.chat(actions.prompt("edits", n, parent, 0.9997, ""), plain, 0)
    finally:
        reef.close()
    record = records_of(server, scenario)[0]
    assert record["request"]["response_format"] == actions.response_format("edits", n)
    for text, _, _ in answers:
        edits = actions.parse_edits(text, n)  # raises on anything but a well-formed list
        assert 1 <= len(edits) <= actions.CONSTRAINED_EDITS
        verdict = actions.judge("edits", text, n, parent, Limits(wall_s=10)).verdict
        assert verdict.valid or "overlap" in verdict.reason or "square" in verdict.reason
    with pytest.raises(actions.ActionError):
        actions.parse_edits(unconstrained, n)
