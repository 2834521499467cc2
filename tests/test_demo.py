"""The learning demo (demo/): its scorer and question pool, and — slow — the demo itself on
real SmolLM2 with a small round budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from demo.curve import Step, plot, table
from demo.preference import (
    HELD_OUT,
    HELD_OUT_KEYS,
    MAX_WORDS,
    TRAIN,
    correct,
    messages,
    score,
    scorer,
    words,
)


def test_score_counts_words() -> None:
    assert score("Paris.") == 1.0
    assert score("The capital is Paris, France.") == 1.0  # five words
    assert score("The capital of France is Paris.") == 0.0  # six
    assert score("") == 0.0 and score("   ") == 0.0 and score(None) == 0.0
    assert score("Leonardo da Vinci - of course!") == 1.0  # a lone dash is not a word
    assert words("Twenty-four hours.") == 2
    assert words("one\ntwo\tthree") == 3


def test_scorer_is_a_trl_style_reward() -> None:
    assert scorer(["Paris.", "It is the city of Paris in France."]) == [1.0, 0.0]
    assert scorer([[{"role": "assistant", "content": "Blue."}], []]) == [1.0, 0.0]


def test_held_out_keys_judge_correctness() -> None:
    assert len(HELD_OUT_KEYS) == len(HELD_OUT)
    for (_, reference), keys in zip(HELD_OUT, HELD_OUT_KEYS, strict=True):
        assert correct(reference, keys), reference
    assert not correct("Jupiter.", ["Mercury"]) and not correct("Green.", ["yellow"])
    assert correct("It is 81.", ["eighty-one", "81"])


def test_question_pool() -> None:
    assert len(TRAIN) >= 40 and len(HELD_OUT) == 16
    for question, reference in TRAIN + HELD_OUT:
        assert question.strip().endswith("?")
        assert 0 < words(reference) <= MAX_WORDS, reference
        assert score(reference) == 1.0
    questions = [q for q, _ in TRAIN + HELD_OUT]
    assert len(set(questions)) == len(questions)  # no duplicates, so held-out is disjoint
    assert not {q for q, _ in TRAIN} & {q for q, _ in HELD_OUT}
    assert messages("Q?")[0]["role"] == "system" and messages("Q?")[1]["content"] == "Q?"


def test_terse_thumb_is_ten_words_and_unstated() -> None:
    from demo import terse

    assert terse.score("The capital of Egypt is Cairo.") == 1.0
    assert terse.score("one two three four five six seven eight nine ten") == 1.0
    assert terse.score("one two three four five six seven eight nine ten eleven") == 0.0
    assert terse.score("") == 0.0 and terse.score(None) == 0.0
    assert "word" not in terse.SYSTEM_PROMPT  # the model is never told


def test_a_text_only_report_is_judged_like_the_next_turn() -> None:
    from demo.reactions import report, rule_judge
    from reef.judge import Exchange, Judge, dispatch

    long = "First sentence here. And a second one, which makes it too long for the user."
    assert report(long) == {"feedback": "too long"}
    assert report("Cairo.") == {"feedback": "Thanks, that's what I needed."}
    judge = Judge(rule_judge, "rule", votes=3)
    msgs = ({"role": "user", "content": "Q?"},)
    bad = judge.judge(Exchange(msgs, long, "feedback", report(long)["feedback"]))
    good = judge.judge(Exchange(msgs, "Cairo.", "feedback", report("Cairo.")["feedback"]))
    assert bad.score == -1 and bad.hints and dispatch(bad.score, bad.hints) is not None
    assert good.score == 1


def test_curve_table_and_png(tmp_path: Path) -> None:
    steps = [
        Step(0, "rel_base", 0.125, 2, 16, 12.0, 0.0, 40.0, correct=10),
        Step(1, "rel_one", 0.875, 14, 16, 90.0, 70.0, 130.0, train_pass_rate=0.25, correct=9),
        Step(2, "rel_one", 0.875, 14, 16, 60.0, 40.0, 190.0, 0.5, 9, rejected="guard 'correct'"),
    ]
    text = table(steps)
    assert "| 0 | `rel_base` | 12% (2/16) | 62% (10/16) | – |" in text
    assert "| 1 | `rel_one` | 88% (14/16) | 56% (9/16) | 25% |" in text
    assert "| 2 | `rel_one` (candidate rejected: head kept) | 88% (14/16) |" in text
    png = plot(steps, tmp_path / "curve.png", target=0.8, title="t")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_demo_learns_the_preference(tmp_path: Path) -> None:
    """The whole demo on SmolLM2: a release trained on one or two rounds of feedback beats the
    base model on the held-out questions, and the curve lands in the PNG and in MLflow."""
    from demo.__main__ import SCENARIO, run

    state = tmp_path / "state"
    steps = run(
        state,
        rounds=2,
        target=0.8,
        max_tokens=24,
        params={"epochs": 4, "batch_size": 4, "max_length": 256},
        round_timeout_s=600,
    )
    assert steps[0].round == 0 and len(steps) >= 2
    assert len({s.release_id for s in steps}) == len(steps)  # one release per round
    assert steps[-1].pass_rate > steps[0].pass_rate
    assert steps[-1].pass_rate >= 0.5
    assert (state / "learning-curve.png").exists()

    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{state / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(f"reef/{SCENARIO}")
    assert experiment is not None
    (demo_run,) = client.search_runs([experiment.experiment_id], "attributes.run_name = 'demo'")
    history = client.get_metric_history(demo_run.info.run_id, "pass_rate")
    assert [m.step for m in history] == [s.round for s in steps]
    assert "learning-curve.png" in [a.path for a in client.list_artifacts(demo_run.info.run_id)]


def test_the_reactions_user_words_reactions_several_ways_and_the_demo_uses_the_shipped_judge() -> (
    None
):
    from demo.reactions import COMPLAINTS, THANKS_ALL, react
    from demo.reactions_run import config

    long = "First sentence here. And a second one, which makes it too long for the user."
    wordings = {react(long + " " + str(i)) for i in range(40)}
    assert wordings <= set(COMPLAINTS) and len(wordings) >= 3
    assert react("Cairo.") in THANKS_ALL
    assert react(long) == react(long)  # the same reply draws the same words
    shipped = config(8, None, 4, "shipped", "default")
    assert "function" not in shipped["judge"] and "gate" not in shipped  # Reef's defaults
    rule = config(8, None, 4, "rule", "always")
    assert rule["judge"]["function"] == "demo.reactions:rule_judge"
    assert rule["gate"] == {"policy": "always"}
