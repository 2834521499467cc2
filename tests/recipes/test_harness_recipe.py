"""The harness recipe's pure parts: reading a proposer's reply as edits, keeping only the valid
ones, an instruction as a rule, the correction scorer, tasks from scored rows, and the recipe's
registration and parameters. (The search and the evaluation run against a real engine in
tests/flows/test_evolve_harness.py.)"""

from __future__ import annotations

import json

import pytest

from reef.errors import ConfigError
from reef.harness import Harness
from reef.recipe import evolves_with, load_recipe
from reef.recipes.harness.episodes import correction_scorer, feedback_text, tasks_from_rows
from reef.recipes.harness.propose import (
    apply_valid,
    instruction_messages,
    parse_edits,
    reflection_messages,
    served,
    with_instruction,
)
from reef.recipes.harness.recipe import HarnessRecipe, decode, encode

SKILL = "---\nname: cite\ndescription: Cites sources.\n---\nCite.\n"
HEAD = Harness({"AGENTS.md": "Be brief.\n", "skills/cite/SKILL.md": SKILL})


def test_blocks_become_creates_updates_and_removes() -> None:
    reply = (
        "Here is my change.\n"
        "=== FILE: AGENTS.md ===\nBe brief.\nName the city.\n=== END ===\n"
        "=== FILE: prompts/city.md ===\nWhich city?\n=== END ===\n"
        "=== DELETE: skills/cite/SKILL.md ===\n"
        "=== DELETE: skills/none/SKILL.md ===\n"  # not in the harness: ignored
    )
    edits = parse_edits(reply, HEAD)
    assert edits == [
        {"op": "update", "path": "AGENTS.md", "content": "Be brief.\nName the city.\n"},
        {"op": "create", "path": "prompts/city.md", "content": "Which city?\n"},
        {"op": "remove", "path": "skills/cite/SKILL.md"},
    ]
    new = apply_valid(HEAD, edits)
    assert sorted(new.files) == ["AGENTS.md", "prompts/city.md"]


def test_a_reply_without_blocks_is_the_new_rules() -> None:
    assert parse_edits("Always name the city.", HEAD) == [
        {"op": "update", "path": "AGENTS.md", "content": "Always name the city.\n"}
    ]
    fenced = "```markdown\nAlways name the city.\n```"
    assert parse_edits(fenced, Harness.empty())[0] == {
        "op": "create",
        "path": "AGENTS.md",
        "content": "Always name the city.\n",
    }
    assert parse_edits("   \n", HEAD) == []
    # a reply that tried blocks but got them wrong proposes nothing (not its raw text as rules)
    assert parse_edits("=== FILE: AGENTS.md ===\nno end marker", HEAD) == []


def test_invalid_edits_are_dropped_and_the_valid_ones_kept() -> None:
    reply = (
        "=== FILE: ../escape.md ===\nx\n=== END ===\n"
        "=== FILE: skills/bad/SKILL.md ===\nno front matter\n=== END ===\n"
        "=== FILE: notes.txt ===\nnot in the layout\n=== END ===\n"
        "=== FILE: AGENTS.md ===\nName the city.\n=== END ===\n"
    )
    new = apply_valid(HEAD, parse_edits(reply, HEAD))
    assert new.files == {"AGENTS.md": "Name the city.\n", "skills/cite/SKILL.md": SKILL}
    assert apply_valid(HEAD, parse_edits("=== FILE: /etc/x ===\ny\n=== END ===\n", HEAD)) == HEAD


def test_an_instruction_becomes_a_rule_under_instructions() -> None:
    first = with_instruction(Harness.empty(), "Reproduce a bug with a failing test first.")
    assert first.files["AGENTS.md"] == (
        "## Instructions\n- Reproduce a bug with a failing test first.\n"
    )
    second = with_instruction(HEAD, "Cite  the\nfile you changed.")
    assert (
        second.files["AGENTS.md"] == "Be brief.\n\n## Instructions\n- Cite the file you changed.\n"
    )
    third = with_instruction(second, "Run the tests.")
    assert third.files["AGENTS.md"].endswith(
        "## Instructions\n- Cite the file you changed.\n- Run the tests.\n"
    )
    assert third.files["skills/cite/SKILL.md"] == SKILL

    # a scenario's first harness is injected server-side; later ones keep the head's settings
    assert served(first, Harness.empty()).config() == {"inject": True}
    assert served(third, HEAD) == third
    off = Harness({"AGENTS.md": "x\n", "harness.json": '{"inject": false}'})
    assert served(off, Harness.empty()) == off
    # and the proposer may not touch the settings
    assert parse_edits('=== FILE: harness.json ===\n{"inject": false}\n=== END ===\n', HEAD) == []


def test_the_proposer_sees_the_harness_and_the_evidence() -> None:
    messages = reflection_messages(
        HEAD,
        [{"prompt": "Capital?", "answer": "Lyon", "score": 0.0, "correction": "Paris"}],
    )
    assert messages[0]["role"] == "system" and "=== FILE:" in messages[0]["content"]
    user = messages[1]["content"]
    assert "Be brief." in user and "Lyon" in user and "The answer the user wanted: Paris" in user
    ask = instruction_messages(Harness.empty(), "Cite sources.")[1]["content"]
    assert "the harness is empty" in ask and "Cite sources." in ask


def test_correction_scorer_is_word_f1() -> None:
    wanted = ["Paris is the capital of France."] * 4
    got = correction_scorer(
        ["Paris is the capital of France", "Paris", "Lyon", ""], correction=wanted
    )
    assert got[0] == 1.0 and got[2] == 0.0 and got[3] == 0.0
    assert got[1] == pytest.approx(2 * 1.0 * (1 / 6) / (1 + 1 / 6))


def test_tasks_from_scored_rows() -> None:
    rows = [
        {
            "sample_id": "s1",
            "messages": json.dumps([{"role": "user", "content": "Capital?"}]),
            "completion": "Lyon",
            "score": 0.0,
            "feedback": json.dumps({"correction": "Paris", "text": "wrong"}),
        },
        {
            "sample_id": "s2",
            "messages": json.dumps([{"role": "user", "content": "Hi"}]),
            "completion": "Hello",
            "score": 1.0,
            "feedback": json.dumps("nice"),
        },
    ]
    t1, t2 = tasks_from_rows(rows)
    assert t1.task_id == "s1" and t1.columns["correction"] == "Paris" and t1.columns["score"] == 0.0
    assert t2.columns["correction"] is None and t2.columns["feedback"] == "nice"
    assert feedback_text(None) == "" and feedback_text("not json") == "not json"
    recipe = load_recipe("harness")
    assert recipe.scorable([t1, t2]) == [t1]  # type: ignore[attr-defined]
    assert t1.content_key() != t2.content_key()


def test_the_recipe_is_registered_with_checked_params() -> None:
    recipe = load_recipe("harness", {"repeats": 3, "instruct_mode": "model"})
    assert isinstance(recipe, HarnessRecipe)
    assert recipe.target == "harness" and recipe.kind == "scored"
    assert recipe.params.repeats == 3 and recipe.params.instruct_mode == "model"
    with pytest.raises(ConfigError, match="unknown parameter"):
        load_recipe("harness", {"repeat": 3})
    with pytest.raises(ConfigError):
        load_recipe("harness", {"instruct_mode": "shout"})
    with pytest.raises(ConfigError):
        load_recipe("harness", {"scorer": "no.such.module:fn"}).task_scorer()  # type: ignore[attr-defined]
    assert decode(encode(HEAD)) == HEAD
    assert load_recipe("sft").target == "weights"
    # a hosted model has no weights to train; its harness still evolves
    assert not evolves_with("upstream", "sft") and evolves_with("upstream", "harness")
    assert evolves_with("embedded", "sft") and evolves_with("vllm", "harness")
