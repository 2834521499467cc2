"""The verifier of the arithmetic task: exact, so every answer gets a score without a person.

`check(question, answer)` is what the application calls before it reports; `reward` is the
same check in the form Reef calls it (grpo's `reward`, the gate's `scorer`):
`(completions, prompts=..., **columns) -> list[float]`, where completions and prompts are
strings or lists of chat messages."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

_QUESTION = re.compile(r"What is (-?\d+) ([+*-]) (-?\d+)\?")
_NUMBER = re.compile(r"-?\d+")


def task(rng: random.Random) -> str:
    a, b = rng.randint(2, 60), rng.randint(2, 60)
    op = rng.choice("+-*")
    return f"What is {a} {op} {b}? Answer with the number only."


def expected(question: str) -> int | None:
    found = _QUESTION.search(question)
    if not found:
        return None
    a, op, b = int(found[1]), found[2], int(found[3])
    return a + b if op == "+" else a - b if op == "-" else a * b


def check(question: str, answer: str) -> float:
    """1.0 when the first number in the answer is the result, else 0.0."""
    want = expected(question)
    got = _NUMBER.search(answer)
    return 1.0 if want is not None and got is not None and int(got[0]) == want else 0.0


def _text(value: Any) -> str:
    """A string as is; a list of chat messages as its last user message (a prompt) or its
    text (a completion)."""
    if isinstance(value, str):
        return value
    messages = [m for m in value if isinstance(m, dict) and isinstance(m.get("content"), str)]
    users = [m["content"] for m in messages if m.get("role") == "user"]
    return users[-1] if users else "".join(m["content"] for m in messages)


def reward(
    completions: Sequence[Any], prompts: Sequence[Any] | None = None, **_: Any
) -> list[float]:
    if prompts is None:
        raise ValueError("the arithmetic verifier needs the prompts")
    return [check(_text(p), _text(c)) for c, p in zip(completions, prompts, strict=True)]
