"""`python -m demo.reactions_run` (`make demo-reactions`): SmolLM2 learns a user's preference
through Reef from how the user reacts, and nothing else.

    .venv/bin/python -m demo.reactions_run [--rounds 10] [--sessions 8]

A real `reef serve` (SmolLM2, recipe openclaw, the evolve worker on, judge
`demo.reactions:rule_judge`). Each round the app holds `sessions` conversations: a training
question, the model's answer, and the simulated user's next turn ("Too long. Keep it to one
sentence." / "Thanks, that's what I needed."). Nobody calls /reef/report: the worker's judge
reads each answer with the user's next turn, stores its vote and hints as a report, and once a
batch is judged the evolve flow trains, publishes and deploys a release. The held-out
questions are then answered greedily through the engine's admin generate route (unrecorded)
and scored by the user's rule.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
import time
from datetime import datetime
from pathlib import Path

import httpx
import openai

from demo.curve import Step, log_mlflow, plot, save_figures, table
from demo.reactions import messages, passes, questions, react
from demo.server import Server

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = "reactions"


def config(sessions: int, lr: float | None, batch: int) -> dict:
    params: dict = {"batch_size": batch}
    if lr is not None:  # else the recipe's default for its mode
        params["learning_rate"] = lr
    return {
        "engine": {"embedded": {"max_batch_size": 16}},
        "reef": {
            "recipe": "openclaw",
            "batch_size": sessions,
            "params": params,
        },
        # `always`: each round's candidate becomes the head; the demo measures it itself.
        "gate": {"policy": "always"},
        "judge": {"function": "demo.reactions:rule_judge", "poll_s": 1.0},
    }


class Conversations:
    """The app: sessions of (question, answer, the user's reaction) through the openai SDK."""

    def __init__(self, url: str, max_tokens: int):
        headers = {"x-reef-scenario": SCENARIO}
        self.client = openai.OpenAI(
            base_url=f"{url}/v1", api_key="unused", default_headers=headers, max_retries=0
        )
        self.http = httpx.Client(base_url=url, headers=headers, timeout=600.0)
        self.max_tokens = max_tokens

    def session(self, question: str) -> bool:
        """One conversation; whether the first answer suited the user."""
        first = messages(question)
        answer = (
            self.client.chat.completions.create(
                model="smollm2",
                messages=first,  # type: ignore[arg-type]
                max_tokens=self.max_tokens,
                temperature=0.6,
                top_p=0.95,
            )
            .choices[0]
            .message.content
            or ""
        )
        follow = [
            *first,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": react(answer)},
        ]
        # The user's next turn: what the judge reads. Its own answer is not needed.
        self.client.chat.completions.create(model="smollm2", messages=follow, max_tokens=1)  # type: ignore[arg-type]
        return passes(answer)

    def head(self) -> str:
        r = self.http.get(f"/reef/scenarios/{SCENARIO}")
        r.raise_for_status()
        return str(r.json()["head_release_id"])

    def held_out(self, release_id: str) -> tuple[int, int]:
        def one(q: str) -> bool:
            r = self.http.post(
                "/reef/engine/generate",
                json={
                    "scenario": SCENARIO,
                    "release_id": release_id,
                    "messages": messages(q),
                    "max_tokens": self.max_tokens,
                    "temperature": 0.0,
                },
            )
            r.raise_for_status()
            return passes(r.json()["text"])

        qs = questions("held_out")
        with concurrent.futures.ThreadPoolExecutor(len(qs)) as pool:
            return sum(pool.map(one, qs)), len(qs)


def run(args: argparse.Namespace, state_dir: Path) -> list[Step]:
    start = time.monotonic()

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - start:6.1f}s] {msg}", flush=True)

    server = Server(state_dir, "smollm2", config(args.sessions, args.lr, args.batch))
    steps: list[Step] = []
    first_replies: list[bool] = []
    try:
        server.start()
        app = Conversations(server.url, args.max_tokens)
        app.http.post("/reef/scenarios", json={"name": SCENARIO})
        head = app.head()
        passed, asked = app.held_out(head)
        steps.append(Step(0, head, passed / asked, passed, asked, 0.0, 0.0, 0.0))
        say(f"base {head}: held-out one-sentence answers {passed}/{asked}")
        train = questions("train")
        for n in range(1, args.rounds + 1):
            t0 = time.monotonic()
            pool = [train[(args.sessions * (n - 1) + i) % len(train)] for i in range(args.sessions)]
            ok = [app.session(q) for q in pool]
            first_replies += ok
            say(f"round {n}: {args.sessions} sessions, {sum(ok)} first answers suited the user")
            reacted = time.monotonic()
            deadline = reacted + args.round_timeout
            while app.head() == head:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"no release in {args.round_timeout:.0f}s:\n{server.log()[-4000:]}"
                    )
                time.sleep(1.0)
            head = app.head()
            evolve_s = time.monotonic() - reacted
            passed, asked = app.held_out(head)
            steps.append(
                Step(
                    n,
                    head,
                    passed / asked,
                    passed,
                    asked,
                    time.monotonic() - t0,
                    evolve_s,
                    time.monotonic() - start,
                    sum(ok) / len(ok),
                )
            )
            say(f"round {n}: release {head}: held-out {passed}/{asked} ({evolve_s:.0f}s to deploy)")
    finally:
        server.stop()
    print("\n" + table(steps), flush=True)
    print(f"sessions until 3 suited answers in a row: {_until_three(first_replies)}", flush=True)
    png = plot(
        steps,
        state_dir / "reactions-curve.png",
        target=None,
        title="SmolLM2 learns 'one sentence' from reactions alone (openclaw)",
        ylabel="held-out one-sentence answers",
        xlabel=f"release (rounds of {args.sessions} sessions, next-turn reactions only)",
    )
    run_id = log_mlflow(
        server.tracking_uri,
        (state_dir / "artifacts" / "mlflow").resolve().as_uri(),
        SCENARIO,
        steps,
        png,
        {"recipe": "openclaw", "sessions": args.sessions, "lr": args.lr, "batch": args.batch},
    )
    say(f"curve {png}; MLflow run {run_id} in experiment reef/{SCENARIO}")
    save_figures(state_dir / "artifacts", SCENARIO, steps, "python -m demo.reactions_run")
    return steps


def _until_three(passed: list[bool]) -> int | None:
    run_ = 0
    for i, ok in enumerate(passed, start=1):
        run_ = run_ + 1 if ok else 0
        if run_ == 3:
            return i
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m demo.reactions_run", description=__doc__)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--sessions", type=int, default=8, help="sessions per round (= batch)")
    p.add_argument("--batch", type=int, default=4, help="judged turns per optimizer step")
    p.add_argument("--lr", type=float, default=None, help="default: the recipe's (3e-4)")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--round-timeout", type=float, default=900.0)
    p.add_argument("--state-dir", type=Path)
    args = p.parse_args(argv)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    state_dir = (args.state_dir or ROOT / ".reef-demo" / f"reactions-{stamp}").resolve()
    state_dir.parent.mkdir(parents=True, exist_ok=True)
    run(args, state_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
