"""The judge's rules (the OpenClaw-RL paper): plurality with ties -> 0, the hint filter, the
dispatch table, and a judgment as a stored report that a person's report overrides."""

from __future__ import annotations

from datetime import timedelta

import pytest

from reef.experience import pick
from reef.judge import (
    HINT_HEADER,
    Exchange,
    Judge,
    append_hint,
    boxed,
    dispatch,
    hint_candidates,
    hint_of,
    hints_of,
    judgment_report,
    plurality,
)
from reef.records import Report, utcnow


@pytest.mark.parametrize(
    ("votes", "want"),
    [
        ([1, 1, -1], 1),
        ([-1, -1, 1], -1),
        ([1, -1, 0], 0),  # three-way tie
        ([1, -1], 0),  # two-way tie for the top count
        ([1, 1, -1, -1, 0], 0),
        ([None, None, -1], -1),  # void votes do not count
        ([None, None, None], 0),  # no valid vote
        ([], 0),
        ([0, 0, 1], 0),
        ([7, 1], 1),  # out-of-range values are void
    ],
)
def test_plurality_and_the_tie_rule(votes: list[int | None], want: int) -> None:
    assert plurality(votes) == want


def test_the_last_boxed_value_is_the_vote() -> None:
    assert boxed("maybe \\boxed{-1} no wait \\boxed{1}") == 1
    assert boxed("\\boxed{ -1 }") == -1
    assert boxed("no verdict") is None
    assert hint_of("\\boxed{1} [HINT_START] Keep it short. [HINT_END]") == "Keep it short."
    assert hint_of("\\boxed{-1} [HINT_START]ignored hint text[HINT_END]") is None
    assert hint_of("\\boxed{1} and no markers") is None


def test_hint_filter_length_dedupe_shortest_first_cap() -> None:
    hints = [
        "  Use one sentence only.  ",
        "too short",  # 9 characters: dropped
        "exactly10c",  # 10 characters: dropped (must be longer than 10)
        "Use one sentence only.",  # duplicate after stripping
        None,
        "Answer in one short sentence, no lists at all.",
        "Be brief.!!",  # 11 characters: kept
        "Reply with a single sentence please.",
    ]
    assert hint_candidates(hints) == (
        "Be brief.!!",
        "Use one sentence only.",
        "Reply with a single sentence please.",
    )
    assert hint_candidates(hints, limit=1) == ("Be brief.!!",)
    assert hint_candidates([None, "short"]) == ()


def test_dispatch_table() -> None:
    assert dispatch(1, ["a hint that is long"]) == dispatch(1, ("x" * 11,))
    d = dispatch(-1, ["a hint that is long"])
    assert d is not None and (d.reward, d.teacher) == (-1, "hints")
    d = dispatch(0, ["a hint that is long"])
    assert d is not None and (d.reward, d.teacher) == (0, "hints")
    d = dispatch(1, [])
    assert d is not None and (d.reward, d.teacher) == (1, "anchor")
    d = dispatch(-1, [])
    assert d is not None and (d.reward, d.teacher) == (-1, "anchor")
    assert dispatch(0, []) is None


def test_hint_goes_to_the_last_user_message() -> None:
    messages = [
        {"role": "system", "content": "be nice"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "second"}]},
    ]
    out = append_hint(messages, "Keep it short.")
    assert out[3]["content"] == "second" + HINT_HEADER + "Keep it short."
    assert out[1]["content"] == "first"
    assert messages[3]["content"] == [{"type": "text", "text": "second"}]  # not mutated
    only_system = append_hint([{"role": "system", "content": "s"}], "Keep it short.")
    assert only_system[-1]["role"] == "user" and only_system[-1]["content"].endswith("short.")


def _rule(task: str, exchange: Exchange, sample: int) -> str:
    """A rule judge whose third vote dissents: the plurality must still win."""
    long = len(exchange.reply.split()) > 5
    if task == "evaluate":
        vote = -1 if long else 1
        return f"\\boxed{{{-vote if sample == 2 else vote}}}"
    if long:
        return "\\boxed{1} [HINT_START]Answer in one sentence of at most five words.[HINT_END]"
    return "\\boxed{-1}"


EXCHANGE = Exchange(
    messages=({"role": "user", "content": "What is rust?"},),
    reply="Rust is a systems programming language focused on safety and speed.",
    next_role="user",
    next_text="Too long. Keep it to one sentence.",
)


def test_judge_votes_and_hints_become_a_report() -> None:
    j = Judge(_rule, "function:tests:_rule", votes=3).judge(EXCHANGE)
    assert j.score == -1
    assert j.votes == {"1": 1, "0": 0, "-1": 2, "void": 0}
    assert j.hints == ("Answer in one sentence of at most five words.",)  # deduplicated
    assert j.trains and len(j.raw["evaluate"]) == 3 and len(j.raw["hint"]) == 3
    report = judgment_report("s", "judge_rec_1", "rec_1", EXCHANGE, j)
    assert report.score == -1.0 and report.references == ("rec_1",)
    assert report.metadata["source"] == "judge" and report.metadata["judge"].startswith("function")
    assert hints_of(report.feedback) == j.hints
    assert report.feedback["next_state"] == {"role": "user", "content": EXCHANGE.next_text}


def test_a_persons_score_wins_over_the_judge() -> None:
    t0 = utcnow()
    human = Report("rep_h", "s", t0, ("rec_1",), score=1.0)
    judged = Report(
        "judge_rec_1", "s", t0 + timedelta(seconds=5), ("rec_1",), -1.0, None, {"source": "judge"}
    )
    assert pick([human, judged]) == (human, 1.0)
    text_only = Report("rep_t", "s", t0, ("rec_1",), None, "too long")
    assert pick([text_only, judged]) == (judged, -1.0)  # the judgment scores the text
    assert pick([text_only]) == (text_only, None)
