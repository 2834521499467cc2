"""The proposer: a model that reads a harness with evidence (low-scored answers and their
feedback, or a user's plain-language ask) and writes the harness's next version as edits.

The proposer answers in a plain block format that small models can follow and that needs no
JSON escaping:

    === FILE: AGENTS.md ===
    <the file's whole new content>
    === END ===
    === DELETE: skills/old/SKILL.md ===

A reply with no blocks is taken as the new AGENTS.md (the rules), the way GEPA reads a bare
instruction. Each edit is validated on its own (paths, layout, front matter, sizes); one that
fails is dropped and logged, so a half-right proposal still yields its valid part.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from reef.errors import BadRequest
from reef.harness import CONFIG_FILE, RULES_FILE, Harness

log = logging.getLogger(__name__)

# chat messages -> the proposer's reply
Ask = Callable[[list[dict[str, Any]]], str]

_BLOCK = re.compile(
    r"^=== FILE: (?P<path>\S+) ===[ \t]*\n(?P<body>.*?)^=== END ===[ \t]*$", re.M | re.S
)
_DELETE = re.compile(r"^=== DELETE: (?P<path>\S+) ===[ \t]*$", re.M)
_FENCE = re.compile(r"^```[\w-]*\n(?P<body>.*?)\n```\s*$", re.S)
INSTRUCTIONS_HEADING = "## Instructions"

SYSTEM = """You maintain the harness of an AI assistant: text files that are given to the \
assistant with every request. The harness layout:
- AGENTS.md: the assistant's rules, in Markdown.
- skills/<name>/SKILL.md: one skill each; it starts with front matter between '---' lines \
holding `name: <name>` and `description: <when to use it>`, then the skill's instructions.
- prompts/<name>.md: prompt templates.

Write only the files you change, each as a block:
=== FILE: <path> ===
<the file's complete new content>
=== END ===
To remove a file write the line: === DELETE: <path> ===
Keep what already works; change what the evidence shows is missing or wrong."""


def render_harness(harness: Harness) -> str:
    if not harness.files:
        return "(the harness is empty: no rules, no skills)"
    return "\n".join(
        f"=== FILE: {path} ===\n{harness.files[path].rstrip()}\n=== END ==="
        for path in sorted(harness.files)
    )


def _prompt_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The last user turn of a conversation, as text."""
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(
                    str(p.get("text", "")) for p in content if isinstance(p, Mapping)
                ).strip()
    return ""


def reflection_messages(
    harness: Harness, examples: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The proposer's request for improving `harness` from answers that scored low."""
    shown = []
    for i, ex in enumerate(examples, 1):
        lines = [f"Example {i}", f"User asked: {ex.get('prompt', '')}"]
        lines.append(f"Assistant answered: {ex.get('answer', '')}")
        lines.append(f"Score: {ex.get('score')}")
        if ex.get("feedback"):
            lines.append(f"Feedback: {ex['feedback']}")
        if ex.get("correction"):
            lines.append(f"The answer the user wanted: {ex['correction']}")
        shown.append("\n".join(lines))
    user = (
        "The current harness:\n\n"
        + render_harness(harness)
        + "\n\nAnswers the assistant gave with this harness, with the feedback they got:\n\n"
        + "\n\n".join(shown)
        + "\n\nWrite the harness changes that make the assistant answer as the feedback asks."
    )
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def instruction_messages(harness: Harness, ask: str) -> list[dict[str, Any]]:
    """The proposer's request for turning a user's plain-language ask into harness changes."""
    user = (
        "The current harness:\n\n"
        + render_harness(harness)
        + f"\n\nThe user asks the assistant, from now on:\n{ask.strip()}\n\n"
        "Write the harness changes that make the assistant do so (a rule in AGENTS.md, or a "
        "skill when it is a procedure)."
    )
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def parse_edits(reply: str, harness: Harness) -> list[dict[str, Any]]:
    """The edits a proposer's reply asks for, relative to `harness` (unvalidated)."""
    edits: list[dict[str, Any]] = []
    for m in _BLOCK.finditer(reply):
        path, body = m["path"], m["body"].rstrip("\n") + "\n"
        if path == CONFIG_FILE:  # the operator's settings, not the proposer's to change
            continue
        op = "update" if path in harness.files else "create"
        edits.append({"op": op, "path": path, "content": body})
    for m in _DELETE.finditer(reply):
        if m["path"] in harness.files and m["path"] != CONFIG_FILE:
            edits.append({"op": "remove", "path": m["path"]})
    if edits or "=== FILE:" in reply:
        return edits
    text = reply.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced["body"].strip()
    if not text:
        return []
    op = "update" if RULES_FILE in harness.files else "create"
    return [{"op": op, "path": RULES_FILE, "content": text + "\n"}]


def apply_valid(harness: Harness, edits: Sequence[Mapping[str, Any]]) -> Harness:
    """`harness` with each edit that validates applied; the others are logged and dropped."""
    current = harness
    for edit in edits:
        try:
            current = current.apply([edit])
        except BadRequest as e:
            log.info("dropping proposed edit of %s: %s", edit.get("path"), e.message)
    return current


def with_instruction(harness: Harness, ask: str) -> Harness:
    """The ask, verbatim, as a rule under "## Instructions" in AGENTS.md: what a user's
    instruction becomes without a proposer model (and when the model's proposal is unusable)."""
    rule = " ".join(ask.split())
    rules = harness.rules().rstrip()
    if INSTRUCTIONS_HEADING not in rules:
        rules = f"{rules}\n\n{INSTRUCTIONS_HEADING}\n" if rules else f"{INSTRUCTIONS_HEADING}\n"
    text = f"{rules.rstrip()}\n- {rule}\n"
    op = "update" if RULES_FILE in harness.files else "create"
    return harness.apply([{"op": op, "path": RULES_FILE, "content": text}])


def served(harness: Harness, head: Harness) -> Harness:
    """`harness` as a candidate on top of `head`. The first harness of a scenario (the head has
    none) gets `harness.json` {"inject": true}: nobody installs it client-side yet, and what
    was evaluated injected is then served injected, to every client. Otherwise the head's
    settings stand (a scenario whose clients install the harness themselves, like pi, has
    injection off)."""
    if head.files or CONFIG_FILE in harness.files:
        return harness
    return harness.apply([{"op": "create", "path": CONFIG_FILE, "content": '{"inject": true}\n'}])


def example_of(task_messages: Sequence[Mapping[str, Any]], columns: Mapping[str, Any]) -> dict:
    """A reflective example: the prompt's text and what the scorer knew about the answer."""
    return {
        "prompt": _prompt_text(task_messages),
        "feedback": columns.get("feedback") or "",
        "correction": columns.get("correction") or "",
    }
