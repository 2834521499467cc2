"""The reactions demo's simulated user and rule judge: a user who never reports, only reacts.

The user privately prefers answers of ONE short sentence (at most 20 words, one sentence, no
line breaks, no lists) — a preference the five-word demo (demo/preference.py) does not use,
and one the app's prompt never states. After each answer the user says so in the next turn:
"Too long. Keep it to one sentence." or "Thanks, that's what I needed." Deterministic: the
same answer always draws the same reaction.

The user words each reaction one of several ways (picked by a hash of the answer), some of
which name no rule ("Hm, that's a lot. Shorter?"), so whoever judges has to read the reaction.

`rule_judge` is NOT a judge Reef ships: it reads the reply and checks the preference itself
(`passes`), with a small, deterministic vote flip, and answers in the generating judge's format
(`\\boxed{±1}`, hints between [HINT_START]/[HINT_END]). It is told the answer, so a run with it
shows that the recipe can learn from judgments, not that Reef can judge; `make demo-reactions`
uses Reef's shipped judge (the likelihood judge on the served model, reef.verdicts) and
`--judge rule` runs the comparison arm.
"""

from __future__ import annotations

import hashlib
import re

from demo.preference import HELD_OUT, TRAIN
from reef.judge import Exchange

MAX_WORDS = 20
COMPLAINT = "Too long. Keep it to one sentence."
THANKS = "Thanks, that's what I needed."
# The wordings the user reacts with (the first of each is the one above).
COMPLAINTS = (
    COMPLAINT,
    "Hm, that's a lot. Shorter?",
    "Way more than I needed. Just one sentence, please.",
    "Could you say that in a single sentence?",
    "Too wordy for me.",
    "Can you try again, but brief?",
)
THANKS_ALL = (
    THANKS,
    "Perfect, short and clear.",
    "great, thanks",
    "Nice, that's all I wanted to know.",
    "Got it, thank you!",
)
FLIP = 0.15  # chance that one vote of the judge disagrees

# The app's chat: no system rule about length; the user's preference is theirs alone.
SYSTEM_PROMPT = "You are a helpful assistant."

# Hints as a judge would phrase the complaint: several wordings, so de-duplication and the
# shortest-first order matter.
HINTS = (
    "Answer in one short sentence.",
    "Reply with a single sentence of at most twenty words.",
    "Keep it to one sentence, no lists or line breaks.",
)

_SENTENCE_END = re.compile(r"[.!?](\s|$)")


def questions(pool: str = "train") -> list[str]:
    """The question texts of the five-word demo's pools (their reference answers unused)."""
    return [q for q, _ in (TRAIN if pool == "train" else HELD_OUT)]


def messages(question: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": question},
    ]


def passes(reply: str | None) -> bool:
    """One sentence: non-empty, at most MAX_WORDS words, no line break, at most one sentence
    end before the text ends."""
    text = (reply or "").strip()
    if not text or "\n" in text or len(text.split()) > MAX_WORDS:
        return False
    ends = [m.start() for m in _SENTENCE_END.finditer(text)]
    return len([e for e in ends if e < len(text) - 1]) == 0


def react(reply: str | None) -> str:
    """The user's next message after `reply`: thanks or a complaint, worded one of several
    ways (the same reply always draws the same words)."""
    pool = THANKS_ALL if passes(reply) else COMPLAINTS
    return pool[int(_chance("react", reply) * len(pool))]


def report(reply: str | None) -> dict[str, str]:
    """The same reaction as a text-only report's body (`POST /reef/report` with `references`
    and no score): the seed's example `{"feedback": "too long"}` on a failed answer."""
    return {"feedback": THANKS if passes(reply) else "too long"}


def _chance(*parts: object) -> float:
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def rule_judge(task: str, exchange: Exchange, sample: int) -> str:
    """The simulated PRM: +1 when the reaction is thanks (or the reply passes), -1 with a
    hint when it complains; each vote flips with probability FLIP (seeded by the reply)."""
    bad = not passes(exchange.reply)  # told the answer: it checks the preference itself
    flip = _chance(task, exchange.reply, sample) < FLIP
    if task == "evaluate":
        vote = -1 if bad else 1
        return (
            f"The user {'complains' if bad else 'moves on'}. \\boxed{{{-vote if flip else vote}}}"
        )
    if bad != flip:
        hint = HINTS[int(_chance("hint", exchange.reply, sample) * len(HINTS))]
        return f"\\boxed{{1}} [HINT_START] {hint} [HINT_END]"
    return "\\boxed{-1}"
