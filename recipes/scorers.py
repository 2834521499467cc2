"""Verifier scorers: plain functions `(completions, **kwargs) -> list[float]`, as TRL takes
reward functions, chosen by dotted path (`recipes.scorers:at_most_five_words`).

TRL passes conversational completions as lists of messages and adds the dataset's other
columns (`prompts`, and in GRPO `correction`: a report's corrected answer or None) as keyword lists; the evaluation flow may pass plain
strings. Every scorer here accepts both and ignores what it does not use.
"""

from __future__ import annotations

import re
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


def _normal(text: str) -> str:
    """Lower case, punctuation to spaces, single spaces: "Mercury." and "mercury" match."""
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def _answers(answer: Any) -> list[str]:
    """A task's acceptable answers: one string or a list of them."""
    if answer is None:
        return []
    if isinstance(answer, str):
        return [answer]
    return [str(a) for a in answer]


def exact_answer(
    completions: Sequence[Any], answer: Sequence[Any] | None = None, **_: Any
) -> list[float]:
    """1.0 when the answer is one of the task's `answer` values (case and punctuation aside)."""
    if answer is None:
        raise ValueError("the exact scorer needs an `answer` column in the task set")
    out = []
    for c, wanted in zip(completions, answer, strict=True):
        got = _normal(completion_text(c))
        out.append(1.0 if any(got == _normal(a) for a in _answers(wanted)) else 0.0)
    return out


def contains_answer(
    completions: Sequence[Any], answer: Sequence[Any] | None = None, **_: Any
) -> list[float]:
    """1.0 when the answer contains one of the task's `answer` values as whole words: "The
    smallest planet is Mercury." is right for "Mercury", "Jupiter." is not."""
    if answer is None:
        raise ValueError("the contains scorer needs an `answer` column in the task set")
    out = []
    for c, wanted in zip(completions, answer, strict=True):
        got = f" {_normal(completion_text(c))} "
        hit = any(_normal(a) and f" {_normal(a)} " in got for a in _answers(wanted))
        out.append(1.0 if hit else 0.0)
    return out


# The guard scorers a config names by a short word (gate.guards[].scorer).
NAMED: dict[str, Callable[..., list[float]]] = {
    "exact": exact_answer,
    "contains": contains_answer,
}


def scorer_named(name: str) -> Callable[..., list[float]]:
    """A guard's scorer: a short name from NAMED, or a dotted path pkg.module:function."""
    if name in NAMED:
        return NAMED[name]
    from reef.recipe import import_object

    found: Callable[..., list[float]] = import_object(name, "guard scorer")
    if not callable(found):
        raise ValueError(f"guard scorer {name} is not callable")
    return found
