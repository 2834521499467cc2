"""Guards at the gate: a candidate must show it is no worse than the head on each guard's task
set (within `max_drop`); one that gets worse, or that the tasks cannot show is not worse, is
rejected whatever the policy, and the rejection names the guard."""

from __future__ import annotations

import json

import numpy as np
import pytest

from reef.errors import ConfigError
from reef.gate import GatePolicy, check_guard, decide, with_guards
from reef.recipes.scorers import contains_answer, exact_answer, scorer_named
from reef.settings import load_settings


def test_contains_answer_is_whole_words_case_and_punctuation_aside() -> None:
    answers = ["The smallest planet is Mercury.", "Jupiter.", "mercury", "Mercurys"]
    assert contains_answer(answers, answer=["Mercury"] * 4) == [1.0, 0.0, 1.0, 0.0]
    assert contains_answer(["Yellow!"], answer=[["yellow", "gold"]]) == [1.0]
    assert exact_answer(["Mercury.", "It is Mercury"], answer=["mercury"] * 2) == [1.0, 0.0]
    with pytest.raises(ValueError, match="answer"):
        contains_answer(["x"])
    assert scorer_named("exact") is exact_answer
    assert scorer_named("reef.recipes.scorers:contains_answer") is contains_answer


def test_a_significant_drop_breaks_the_guard() -> None:
    # Right on 12 of 16 questions before, 7 after, never better.
    head = [1.0] * 12 + [0.0] * 4
    cand = [1.0] * 7 + [0.0] * 9
    for test in ("bootstrap", "sign"):
        g = check_guard("correct", cand, head, 0.0, GatePolicy(test=test, confidence=0.9))
        assert g.broken, g.reason
        assert g.losses == 5 and g.wins == 11 and g.mean_diff == pytest.approx(-5 / 16)
        assert g.reason.startswith("guard 'correct' not shown safe: n=16")


def test_the_demo_drop_is_not_shown_safe() -> None:
    """`make demo`'s numbers: 11 of 16 reference answers right before, 8 after (4 lost, 1
    won), no drop allowed. Testing for a significant drop let it through (the drop's upper
    bound was exactly 0); the candidate has not shown it is no worse, so it is refused."""
    head = [1.0] * 11 + [0.0] * 5
    cand = [1.0] * 7 + [0.0] * 4 + [1.0] + [0.0] * 4
    assert (sum(head), sum(cand)) == (11, 8)
    policy = GatePolicy(test="bootstrap", confidence=0.9)
    d = np.asarray(cand) - np.asarray(head)
    resampled = d[np.random.default_rng(0).integers(0, 16, (2000, 16))].mean(axis=1)
    assert np.quantile(resampled, 0.9) >= 0  # the old question: no significant drop
    g = check_guard("correct", cand, head, 0.0, policy)
    assert g.broken and g.n == 16 and g.losses == 4
    assert g.ci_low is not None and g.ci_low < 0
    assert g.reason.startswith(
        f"guard 'correct' not shown safe: n=16, 90% lower bound {g.ci_low:+.4g} < -max_drop = -0"
    )
    sign = check_guard("correct", cand, head, 0.0, GatePolicy(test="sign"))
    assert sign.broken and "not shown safe: n=16" in sign.reason
    decision = with_guards(decide([1.0] * 8, [0.0] * 8, GatePolicy(policy="always")), [g])
    assert decision.status == "rejected" and decision.broken_guard == "correct"
    assert "n=16" in decision.reason and decision.reason.endswith("policy 'always' (n=8)")


def test_too_little_evidence_is_not_shown_safe() -> None:
    # One lost task in two, or one task, or none: nothing shows the candidate is no worse.
    for cand, head in (([1.0, 0.0], [1.0, 1.0]), ([1.0], [1.0]), ([], [])):
        for test in ("bootstrap", "sign"):
            g = check_guard("c", cand, head, 0.1, GatePolicy(test=test))  # type: ignore[arg-type]
            assert g.broken and f"not shown safe: n={len(cand)}" in g.reason, g.reason
    # the same answers twice: the sign test cannot tell 2 tasks from chance
    assert check_guard("c", [1.0, 1.0], [1.0, 1.0], 0.0, GatePolicy(test="sign")).broken


def test_an_unchanged_guard_and_an_allowed_drop_are_shown_safe() -> None:
    head = [1.0, 0.0] * 8
    for test in ("bootstrap", "sign"):
        same = check_guard("c", head, head, 0.0, GatePolicy(test=test))  # type: ignore[arg-type]
        assert not same.broken and same.mean_diff == 0, same.reason
        assert same.reason.startswith("guard 'c' shown safe: n=16")
    # gains only: the bound is 0 with max_drop 0, and that is enough
    gained = check_guard("c", [1.0] * 16, head, 0.0, GatePolicy())
    assert not gained.broken and gained.ci_low is not None and gained.ci_low > 0
    # swaps that cost one answer net: not shown safe with no drop allowed
    swapped = [0.0, 1.0] * 7 + [0.0, 0.0]
    assert check_guard("c", swapped, head, 0.0, GatePolicy()).broken
    # max_drop 0.2: 4 of 64 lost is shown within it; half of 16 lost is not
    all_right = [1.0] * 64
    few_lost = check_guard("c", [0.0] * 4 + [1.0] * 60, all_right, 0.2, GatePolicy())
    assert not few_lost.broken and few_lost.ci_low is not None and few_lost.ci_low >= -0.2
    assert check_guard("c", [0.0] * 8 + [1.0] * 8, [1.0] * 16, 0.2, GatePolicy()).broken


def test_a_broken_guard_rejects_whatever_the_policy_and_names_itself() -> None:
    held = check_guard("style", [1.0] * 8, [1.0] * 8, 0.0, GatePolicy())
    broken = check_guard("correct", [0.0] * 8, [1.0] * 8, 0.0, GatePolicy())
    for policy in ("always", "improve", "manual"):
        preferred = decide([1.0] * 8, [0.0] * 8, GatePolicy(policy=policy))  # type: ignore[arg-type]
        d = with_guards(preferred, [held, broken])
        assert d.status == "rejected" and d.broken_guard == "correct"
        assert d.reason.startswith("guard 'correct' not shown safe: n=8")
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
