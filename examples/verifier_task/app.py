"""A task with a verifier: every answer is scored by a program, and the score is the report.

    PYTHONPATH=examples/verifier_task reef serve -c examples/verifier_task/serve.yaml
    python examples/verifier_task/app.py                       # --model tiny above: offline

The app asks arithmetic questions through the OpenAI SDK, checks each answer exactly
(arithmetic.py) and reports the score on the answer's receipt with `reef.client.Reef`. The
server trains with GRPO and gates with the same verifier (serve.yaml names
`arithmetic:reward`; PYTHONPATH lets the server import it), so a candidate is published only
when it answers more questions right than the head.

Needs `openai` and Reef's client; REEF_API_KEY is sent as the token when the server has tokens.
"""

from __future__ import annotations

import argparse
import os
import random

import openai
from arithmetic import check, expected, task

from reef.client import Reef


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--base-url",
        default=os.environ.get("REEF_BASE_URL", "http://127.0.0.1:8900"),
        help="the reef server (default $REEF_BASE_URL, else http://127.0.0.1:8900)",
    )
    p.add_argument("--scenario", default="arithmetic")
    p.add_argument("--tasks", type=int, default=6, help="questions to ask")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    key = os.environ.get("REEF_API_KEY", "unused")
    chat = openai.OpenAI(
        base_url=f"{args.base_url}/v1",
        api_key=key,
        default_headers={"x-reef-scenario": args.scenario},
    )
    model = chat.models.list().data[0].id
    rng = random.Random(args.seed)
    right = 0
    with Reef(args.base_url, scenario=args.scenario) as reef:
        for _ in range(args.tasks):
            question = task(rng)
            raw = chat.chat.completions.with_raw_response.create(
                model=model, messages=[{"role": "user", "content": question}], max_tokens=16
            )
            answer = raw.parse().choices[0].message.content or ""
            score = check(question, answer)
            right += int(score)
            reef.report(
                raw.headers["x-reef-agent-record-id"],
                score=score,
                metadata={"verifier": "arithmetic", "expected": expected(question)},
            )
            print(f"{question} -> {answer.strip()!r}: {score:.0f}")
    print(f"{right}/{args.tasks} right; every answer reported with its score")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
