"""An agent whose users' next turns are the signal: the app sends no reports at all.

    reef serve -c examples/agent_reactions/serve.yaml         # SmolLM2 (--model tiny: offline)
    python examples/agent_reactions/app.py

The app keeps its conversation and sends all of it each turn, as any chat agent does. Reef
stitches the calls into a session (each record's `session_id` and `turn`) and, with the
openclaw recipe, its judge reads every answer together with what came after it: a user who
answers "too long, shorter please" voted the answer down and said how to do better, one who
says "thanks" voted it up. Tool results sent back as `tool` messages count the same way.
At the end the app prints the session as Reef recorded it (reef.client).

Needs `openai` and Reef's client; REEF_API_KEY is sent as the token when the server has tokens.
"""

from __future__ import annotations

import argparse
import os

import openai

from reef.client import Reef

QUESTIONS = [
    "Plan a short trip to Lisbon.",
    "What should I pack?",
    "Which day should I visit the old town?",
    "How do I get there from the airport?",
]


def react(answer: str, next_question: str) -> str:
    """The user's next turn: a reaction to the answer, then the next request. This user wants
    one short sentence."""
    if len(answer.split()) > 20:
        return f"That is too long, one sentence please. {next_question}"
    return f"Thanks, that helps. {next_question}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--base-url",
        default=os.environ.get("REEF_BASE_URL", "http://127.0.0.1:8900"),
        help="the reef server (default $REEF_BASE_URL, else http://127.0.0.1:8900)",
    )
    p.add_argument("--scenario", default="agent-reactions")
    p.add_argument("--turns", type=int, default=4, help="turns of the conversation")
    args = p.parse_args(argv)

    key = os.environ.get("REEF_API_KEY", "unused")
    chat = openai.OpenAI(
        base_url=f"{args.base_url}/v1",
        api_key=key,
        default_headers={"x-reef-scenario": args.scenario},
    )
    model = chat.models.list().data[0].id
    messages: list[dict[str, str]] = [{"role": "user", "content": QUESTIONS[0]}]
    receipt = ""
    for turn in range(args.turns):
        raw = chat.chat.completions.with_raw_response.create(
            model=model, messages=messages, max_tokens=48
        )
        answer = raw.parse().choices[0].message.content or ""
        receipt = raw.headers["x-reef-agent-record-id"]
        print(f"user: {messages[-1]['content']}\nagent: {answer}")
        messages.append({"role": "assistant", "content": answer})
        next_question = QUESTIONS[(turn + 1) % len(QUESTIONS)]
        messages.append({"role": "user", "content": react(answer, next_question)})

    with Reef(args.base_url, scenario=args.scenario) as reef:
        session = reef.record(receipt).session_id
        turns = reef.session(session).data if session else []
    print(f"Reef recorded session {session}: turns {[r.turn for r in turns]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
