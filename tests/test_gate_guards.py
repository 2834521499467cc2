"""Guards at the gate: a candidate that improves the preference but gets significantly worse on
a guard's task set is rejected, and the rejection names the guard."""

from __future__ import annotations

import json

import pytest

from recipes.scorers import contains_answer, exact_answer, scorer_named
from reef.errors import ConfigError
from reef.gate import GatePolicy, check_guard, decide, with_guards
from reef.settings import load_settings


def test_contains_answer_is_whole_words_case_and_punctuation_aside() -> None:
    answers = ["The smallest planet is Mercury.", "Jupiter.", "mercury", "Mercurys"]
    assert contains_answer(answers, answer=["Mercury"] * 4) == [1.0, 0.0, 1.0, 0.0]
    assert contains_answer(["Yellow!"], answer=[["yellow", "gold"]]) == [1.0]
    assert exact_answer(["Mercury.", "It is Mercury"], answer=["mercury"] * 2) == [1.0, 0.0]
    with pytest.raises(ValueError, match="answer"):
        contains_answer(["x"])
    assert scorer_named("exact") is exact_answer
    assert scorer_named("recipes.scorers:contains_answer") is contains_answer


def test_a_significant_drop_breaks_the_guard() -> None:
    # The demo's story: right on 12 of 16 questions before, 7 after, never better.
    head = [1.0] * 12 + [0.0] * 4
    cand = [1.0] * 7 + [0.0] * 9
    for test in ("bootstrap", "sign"):
        g = check_guard("correct", cand, head, 0.0, GatePolicy(test=test, confidence=0.9))
        assert g.broken, g.reason
        assert g.losses == 5 and g.mean_diff == pytest.approx(-5 / 16)
        assert "guard 'correct' broken" in g.reason


def test_noise_and_an_allowed_drop_hold_the_guard() -> None:
    head = [1.0, 0.0] * 8
    swapped = [0.0, 1.0] * 7 + [0.0, 0.0]  # one net loss among many swaps: not significant
    assert not check_guard("c", swapped, head, 0.0, GatePolicy()).broken
    same = check_guard("c", head, head, 0.0, GatePolicy())
    assert not same.broken and same.mean_diff == 0
    # max_drop: a drop of 2/16 is allowed at 0.2; half the tasks lost is not
    all_right = [1.0] * 16
    assert not check_guard("c", [0.0] * 2 + [1.0] * 14, all_right, 0.2, GatePolicy()).broken
    assert check_guard("c", [0.0] * 8 + [1.0] * 8, all_right, 0.2, GatePolicy()).broken


def test_a_broken_guard_rejects_whatever_the_policy_and_names_itself() -> None:
    held = check_guard("style", [1.0] * 8, [1.0] * 8, 0.0, GatePolicy())
    broken = check_guard("correct", [0.0] * 8, [1.0] * 8, 0.0, GatePolicy())
    for policy in ("always", "improve", "manual"):
        preferred = decide([1.0] * 8, [0.0] * 8, GatePolicy(policy=policy))  # type: ignore[arg-type]
        d = with_guards(preferred, [held, broken])
        assert d.status == "rejected" and d.broken_guard == "correct"
        assert d.reason.startswith("guard 'correct' broken")
        assert [g.name for g in d.guards] == ["style", "correct"]
    kept = with_guards(decide([1.0] * 8, [0.0] * 8, GatePolicy()), [held])
    assert kept.accepted and kept.broken_guard is None
    metrics = d.metrics()
    assert metrics["guard_correct_mean_diff"] == -1.0 and metrics["guard_correct_broken"] == 1.0
    json.dumps(d.as_dict())  # stored with the candidate


def test_guards_in_settings(tmp_path) -> None:  # type: ignore[no-untyped-def]
    s = load_settings(gate={"guards": [{"name": "correct", "dataset": str(tmp_path / "q.jsonl")}]})
    (g,) = s.gate.guards
    assert g.scorer == "contains" and g.max_drop == 0.0
    with pytest.raises(ConfigError, match="unique"):
        load_settings(gate={"guards": [{"name": "a", "dataset": "x"}] * 2})
    with pytest.raises(ConfigError, match="scorer"):
        load_settings(gate={"guards": [{"name": "a", "dataset": "x", "scorer": "judge me"}]})
