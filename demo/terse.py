"""The score-only bench's preference: a terse answer, at most ten words, scored 0/1 by a rule.

A user who only ever presses thumbs up or down (no correction, no text) privately wants short
answers: at most MAX_WORDS words (words counted as in demo/preference.py). The app's prompt
never says so, so unlike the five-word demo (whose system prompt asks for it) the model has to
learn it from the thumbs alone. Measured on SmolLM2-135M-Instruct with this prompt (answers up
to 32 tokens): 4 of the 16 held-out questions pass greedily (25 %), and about 1 sampled answer
in 5 passes at T 0.6 on the training questions, so the signal is sparse but not absent (the
score-only target of issue #14 asks for a base rate of 10-30 %).
"""

from __future__ import annotations

from typing import Any

from demo.preference import completion_text, words
from demo.reactions import SYSTEM_PROMPT, messages, questions

MAX_WORDS = 10
# The same app as the reactions demo's (no rule about length: the preference is the user's
# alone), on the same question pools.
__all__ = ["MAX_WORDS", "SYSTEM_PROMPT", "messages", "questions", "score", "scorer"]


def score(reply: str | None) -> float:
    """The thumb: 1.0 when the reply is non-empty and at most MAX_WORDS words, else 0.0."""
    n = words(reply)
    return 1.0 if 0 < n <= MAX_WORDS else 0.0


def scorer(completions: list[Any], **kwargs: Any) -> list[float]:
    """The same thumb as a TRL-style reward function (completions as strings or chat
    messages): what a harness search and the gate score episodes with (bench/composite.py)."""
    return [score(completion_text(c)) for c in completions]
