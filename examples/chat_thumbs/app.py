"""A chat app on the OpenAI SDK whose users' thumbs go to Reef as reports.

    reef serve -c examples/chat_thumbs/serve.yaml             # SmolLM2 (--model tiny: offline)
    python examples/chat_thumbs/app.py                        # a simulated user gives thumbs
    python examples/chat_thumbs/app.py --interactive          # you do

The app keeps each answer's receipt (the `x-reef-agent-record-id` header) with the message it
shows; a thumbs up or down is reported on that receipt as a score of 1 or 0 with
`reef.client.Reef`. Reef learns from the thumbs (serve.yaml: the openclaw recipe in RL mode,
which docs/recipes.md measured as the fastest learner on thumbs alone).

Needs `openai` and Reef's client; REEF_API_KEY is sent as the token when the server has tokens.
"""

from __future__ import annotations

import argparse
import os

import openai

from reef.client import Reef

QUESTIONS = [
    "What is the capital of France?",
    "Which planet is the largest?",
    "How many legs does a spider have?",
    "What language is spoken in Brazil?",
]


def simulated_thumb(answer: str) -> bool:
    """This user likes short answers: thumbs up for at most twelve words."""
    return 0 < len(answer.split()) <= 12


def ask(chat: openai.OpenAI, model: str, question: str) -> tuple[str, str]:
    """(the answer, its receipt)."""
    raw = chat.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": question}], max_tokens=48
    )
    answer = raw.parse().choices[0].message.content or ""
    return answer, raw.headers["x-reef-agent-record-id"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--base-url",
        default=os.environ.get("REEF_BASE_URL", "http://127.0.0.1:8900"),
        help="the reef server (default $REEF_BASE_URL, else http://127.0.0.1:8900)",
    )
    p.add_argument("--scenario", default="chat-thumbs")
    p.add_argument("--rounds", type=int, default=4, help="questions to ask")
    p.add_argument("--interactive", action="store_true", help="give the thumbs yourself")
    args = p.parse_args(argv)

    key = os.environ.get("REEF_API_KEY", "unused")
    chat = openai.OpenAI(
        base_url=f"{args.base_url}/v1",
        api_key=key,
        default_headers={"x-reef-scenario": args.scenario},
    )
    model = chat.models.list().data[0].id  # what the server serves: smollm2, tiny, ...
    with Reef(args.base_url, scenario=args.scenario) as reef:
        for i in range(args.rounds):
            question = QUESTIONS[i % len(QUESTIONS)]
            answer, receipt = ask(chat, model, question)
            print(f"Q: {question}\nA: {answer}")
            if args.interactive:
                up = input("thumbs up? [y/n] ").strip().lower().startswith("y")
            else:
                up = simulated_thumb(answer)
            # One thumb per answer: the report id makes sending it again harmless.
            report = reef.report(receipt, score=1.0 if up else 0.0, report_id=f"thumb-{receipt}")
            print(f"   thumbs {'up' if up else 'down'}: report {report.id}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
