"""Triggers, the lines a serving process writes to its evolve worker: what `encode` writes
`parse` reads back, one JSON object a line, and a line that is not a trigger is refused."""

from __future__ import annotations

import json

import pytest

from reef.errors import BadRequest
from reef.triggers import Trigger, encode, parse


@pytest.mark.parametrize(
    "trigger",
    [Trigger.evolve("support-bot_v2.1"), Trigger.job("s", "job_01J"), Trigger.scan()],
)
def test_encode_then_parse_is_the_same_trigger(trigger: Trigger) -> None:
    line = encode(trigger)
    assert line.endswith("\n") and line.count("\n") == 1
    assert json.loads(line)["kind"] == trigger.kind
    assert parse(line) == trigger


def test_the_lines_are_json_objects() -> None:
    assert json.loads(encode(Trigger.job("s", "job_1"))) == {
        "kind": "job",
        "scenario": "s",
        "job_id": "job_1",
    }
    assert json.loads(encode(Trigger.scan())) == {"kind": "scan"}


@pytest.mark.parametrize(
    "line",
    [
        "support",  # the old plain-text protocol: a bare scenario name
        "job s job_1",
        "[]",
        '{"kind": "train", "scenario": "s"}',
        '{"kind": "evolve"}',
        '{"kind": "evolve", "scenario": ""}',
        '{"kind": "evolve", "scenario": 3}',
        '{"kind": "job", "scenario": "s"}',
        '{"kind": "evolve", "scenario": "s", "job_id": "job_1"}',
        '{"kind": "scan", "extra": 1}',
    ],
)
def test_a_line_that_is_not_a_trigger_is_refused(line: str) -> None:
    with pytest.raises(BadRequest):
        parse(line)
