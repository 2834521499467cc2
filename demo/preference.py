"""The demo app's preference (answers of at most five words), its scorer, and its questions.

The question pool is fixed: 44 training questions the app asks and reports on, and 16
held-out questions that are only ever used to measure, never reported. Every reference answer
obeys the preference, since it becomes the training target of a failed answer.
"""

from __future__ import annotations

import re
from typing import Any

MAX_WORDS = 5
SYSTEM_PROMPT = (
    "You are a helpful assistant. Always answer in at most five words. "
    "No explanations, no full sentences."
)

# A word is a whitespace-separated token with at least one letter or digit, so stray
# punctuation ("-", "...") does not count against an answer.
_WORD = re.compile(r"\w")


def words(text: str | None) -> int:
    """How many words `text` has."""
    return sum(1 for token in (text or "").split() if _WORD.search(token))


def score(text: str | None) -> float:
    """1.0 when the answer is non-empty and at most MAX_WORDS words long, else 0.0."""
    n = words(text)
    return 1.0 if 0 < n <= MAX_WORDS else 0.0


def completion_text(completion: Any) -> str | None:
    """A TRL completion's text: a string, or the last message of a conversational one."""
    if isinstance(completion, list):  # conversational: [{"role": "assistant", "content": ...}]
        completion = completion[-1].get("content", "") if completion else ""
    return completion if isinstance(completion, str) else None


def scorer(completions: list[Any], **kwargs: Any) -> list[float]:
    """The same check as a TRL-style reward function: completions as strings or chat messages."""
    return [score(completion_text(c)) for c in completions]


def messages(question: str) -> list[dict[str, str]]:
    """The chat the app sends for one question."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": question},
    ]


# (question, reference answer) ------------------------------------------------------------
TRAIN: list[tuple[str, str]] = [
    ("What is the capital of France?", "Paris."),
    ("How many legs does a spider have?", "Eight legs."),
    ("What color is the sky on a clear day?", "Blue."),
    ("Who wrote Romeo and Juliet?", "William Shakespeare."),
    ("What is the largest planet in our solar system?", "Jupiter."),
    ("What is the boiling point of water in Celsius?", "100 degrees Celsius."),
    ("How many days are in a week?", "Seven days."),
    ("What gas do plants absorb from the air?", "Carbon dioxide."),
    ("What is the capital of Japan?", "Tokyo."),
    ("What is the chemical symbol for gold?", "Au."),
    ("Which animal is known as the king of the jungle?", "The lion."),
    ("How many continents are there?", "Seven continents."),
    ("What is the freezing point of water in Fahrenheit?", "32 degrees Fahrenheit."),
    ("Who painted the Mona Lisa?", "Leonardo da Vinci."),
    ("What is the largest ocean on Earth?", "The Pacific Ocean."),
    ("What is the square root of 81?", "Nine."),
    ("Which planet is known as the Red Planet?", "Mars."),
    ("What is the capital of Italy?", "Rome."),
    ("How many hours are in a day?", "Twenty-four hours."),
    ("What do bees make?", "Honey."),
    ("What is the tallest mountain in the world?", "Mount Everest."),
    ("What language is spoken in Brazil?", "Portuguese."),
    ("How many sides does a triangle have?", "Three sides."),
    ("What is the main ingredient in guacamole?", "Avocado."),
    ("Who was the first person to walk on the Moon?", "Neil Armstrong."),
    ("What is the capital of Canada?", "Ottawa."),
    ("What is the hardest natural substance?", "Diamond."),
    ("How many minutes are in an hour?", "Sixty minutes."),
    ("What is the largest mammal?", "The blue whale."),
    ("What currency is used in the United Kingdom?", "The pound sterling."),
    ("What is the capital of Germany?", "Berlin."),
    ("Which organ pumps blood through the body?", "The heart."),
    ("What is 7 times 8?", "Fifty-six."),
    ("What is the longest river in Africa?", "The Nile."),
    ("Which season comes after winter?", "Spring."),
    ("What is the chemical formula for water?", "H2O."),
    ("Who invented the telephone?", "Alexander Graham Bell."),
    ("What is the capital of Australia?", "Canberra."),
    ("How many strings does a standard guitar have?", "Six strings."),
    ("What is the smallest prime number?", "Two."),
    ("What do caterpillars turn into?", "Butterflies or moths."),
    ("Which instrument has 88 keys?", "The piano."),
    ("What is the capital of Spain?", "Madrid."),
    ("What is the closest star to Earth?", "The Sun."),
]

HELD_OUT: list[tuple[str, str]] = [
    ("What is the capital of Egypt?", "Cairo."),
    ("How many legs does an insect have?", "Six legs."),
    ("What color are ripe bananas?", "Yellow."),
    ("Who wrote Pride and Prejudice?", "Jane Austen."),
    ("What is the smallest planet in our solar system?", "Mercury."),
    ("How many months are in a year?", "Twelve months."),
    ("What is the chemical symbol for iron?", "Fe."),
    ("What is the capital of Russia?", "Moscow."),
    ("Which animal is the largest land animal?", "The African elephant."),
    ("What is 9 times 9?", "Eighty-one."),
    ("Who discovered penicillin?", "Alexander Fleming."),
    ("What is the largest desert in the world?", "Antarctica."),
    ("How many players are on a soccer team on the field?", "Eleven players."),
    ("What language is spoken in Mexico?", "Spanish."),
    ("Which planet has the most famous rings?", "Saturn."),
    ("What do cows drink?", "Water."),
]

# What makes each held-out answer right, for the correctness guard (recipes.scorers:
# contains_answer: any of these as whole words, case and punctuation aside). Aligned with
# HELD_OUT: "Jupiter." is wrong for the smallest planet however short it is.
HELD_OUT_KEYS: list[list[str]] = [
    ["Cairo"],
    ["six", "6"],
    ["yellow"],
    ["Austen"],
    ["Mercury"],
    ["twelve", "12"],
    ["Fe"],
    ["Moscow"],
    ["elephant"],
    ["eighty-one", "eighty one", "81"],
    ["Fleming"],
    ["Antarctica"],
    ["eleven", "11"],
    ["Spanish"],
    ["Saturn"],
    ["water"],
]


def correct(text: str | None, keys: list[str]) -> bool:
    """Whether an answer names one of `keys` as whole words (the guard's scorer, here)."""
    got = f" {_normal(text or '')} "
    return any(f" {_normal(k)} " in got for k in keys)


def _normal(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())
