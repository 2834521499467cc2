"""Verifier scorers: plain functions `(completions, **kwargs) -> list[float]`, as TRL takes
reward functions, chosen by dotted path (`recipes.scorers:at_most_five_words`).

TRL passes conversational completions as lists of messages and adds the dataset's other
columns (`prompts`, and in GRPO `correction`: a report's corrected answer or None) as keyword lists; the evaluation flow may pass plain
strings. Every scorer here accepts both and ignores what it does not use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def completion_text(completion: Any) -> str:
    """The answer's text: a string as is, or the content of a list of chat messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence):
        return "".join(
            m["content"]
            for m in completion
            if isinstance(m, dict) and isinstance(m.get("content"), str)
        )
    return str(completion)


def word_limit(limit: int) -> Callable[..., list[float]]:
    """A scorer for "answer in at most `limit` words": 1.0 within the limit, else limit/words,
    so an answer that is almost short enough scores better than a rambling one (a graded
    reward gives GRPO a signal before any sampled answer obeys). An empty answer scores 0:
    else stopping at once would be the easiest way to be brief."""

    def score(completions: Sequence[Any], **_: Any) -> list[float]:
        out = []
        for c in completions:
            words = len(completion_text(c).split())
            out.append(0.0 if words == 0 else 1.0 if words <= limit else limit / words)
        return out

    score.__name__ = score.__qualname__ = f"at_most_{limit}_words"
    return score


# The design guide's running task: base SmolLM2 obeys "answer in at most five words" 0-12 %.
at_most_five_words = word_limit(5)
