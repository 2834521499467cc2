"""`python -m demo.reactions_run` (`make demo-reactions`): SmolLM2 learns a user's preference
through Reef from how the user reacts, and nothing else.

    .venv/bin/python -m demo.reactions_run [--rounds 10] [--sessions 8]

A real `reef serve` (SmolLM2, recipe openclaw, the evolve worker on, and the judge Reef ships:
the likelihood judge on the served model). Each round the app holds `sessions` conversations:
a training question, the model's answer, and the simulated user's next turn (a complaint or
thanks in one of several wordings, demo/reactions.py). Nobody calls /reef/report: the worker's
judge reads each answer with the user's next turn, stores its verdict and hint as a report, and
once a batch is judged the evolve flow trains, gates, publishes and deploys. The held-out
questions are then answered greedily through the engine's admin generate route (unrecorded)
and scored by the user's rule.

`--judge rule` runs the comparison arm with `demo.reactions:rule_judge`, which is told the
answer (it checks the preference itself); `--gate always` makes every candidate the head (the
default is Reef's default gate, which may refuse a round's candidate: the round then keeps
the head it had).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import httpx
import openai

from demo.curve import Step, log_mlflow, plot, save_figures, table
from demo.reactions import messages, passes, questions, react
from demo.server import Server

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = "reactions"


def config(sessions: int, lr: float | None, batch: int, judge: str, gate: str) -> dict:
    params: dict = {"batch_size": batch}
    if lr is not None:  # else the recipe's default for its mode
        params["learning_rate"] = lr
    out: dict = {
        "engine": {"embedded": {"max_batch_size": 16}},
        "reef": {
            "recipe": "openclaw",
            "batch_size": sessions,
            "params": params,
        },
        "judge": {"poll_s": 1.0},
    }
    if judge == "rule":
        out["judge"]["function"] = "demo.reactions:rule_judge"
    if gate == "always":  # each round's candidate becomes the head; the demo measures it
        out["gate"] = {"policy": "always"}
    return out


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

    def status(self) -> dict:
        r = self.http.get(f"/reef/scenarios/{SCENARIO}/status")
        r.raise_for_status()
        return dict(r.json())

    def decided(self) -> list[dict]:
        """The scenario's candidates the gate has decided (published, rejected, ...)."""
        r = self.http.get(f"/reef/scenarios/{SCENARIO}/candidates")
        r.raise_for_status()
        return [c for c in r.json()["data"] if c["status"] != "pending"]

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

    server = Server(
        state_dir, "smollm2", config(args.sessions, args.lr, args.batch, args.judge, args.gate)
    )
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
            say(f"round {n}: {args.sessions} sessions, {sum(ok)} first answers suited the user")
            reacted = time.monotonic()
            _await_decision(app, server, args, n, ok, len(first_replies), say)
            first_replies += ok
            verdict = app.decided()[0]
            if verdict["status"] != "published":
                say(
                    f"round {n}: candidate {verdict['status']}: {verdict['gate'].get('reason', '')}"
                )
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
        title=f"SmolLM2 learns 'one sentence' from reactions alone ({args.judge} judge)",
        ylabel="held-out one-sentence answers",
        xlabel=f"release (rounds of {args.sessions} sessions, next-turn reactions only)",
    )
    run_id = log_mlflow(
        server.tracking_uri,
        (state_dir / "artifacts" / "mlflow").resolve().as_uri(),
        SCENARIO,
        steps,
        png,
        {
            "recipe": "openclaw",
            "sessions": args.sessions,
            "lr": args.lr,
            "batch": args.batch,
            "judge": args.judge,
            "gate": args.gate,
        },
    )
    say(f"curve {png}; MLflow run {run_id} in experiment reef/{SCENARIO}")
    save_figures(state_dir / "artifacts", SCENARIO, steps, "python -m demo.reactions_run")
    return steps


def _await_decision(
    app: Conversations,
    server: Server,
    args: argparse.Namespace,
    n: int,
    ok: list[bool],
    before: int,
    say: Callable[[str], None],
) -> None:
    """Wait until round `n`'s candidate is accepted or refused, holding one more session at a
    time (its outcome appended to `ok`) while the batch is short; `before`: sessions of the
    earlier rounds."""
    train = questions("train")
    deadline = time.monotonic() + args.round_timeout
    while len(app.decided()) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no decision in {args.round_timeout:.0f}s:\n{server.log()[-4000:]}")
        if _short(app.status(), before + len(ok)):
            # the gate keeps some judged turns for evaluation: the batch needs more
            q = train[(args.sessions * n + len(ok)) % len(train)]
            ok.append(app.session(q))
            say(f"round {n}: one more session for the batch ({len(ok)} in this round)")
        time.sleep(1.0)


def _short(status: dict, sessions: int) -> bool:
    """Every session so far is judged, yet the batch is not full: some judged turns went to
    the gate's evaluation pool (gate.holdout), which never trains."""
    judge = status.get("judge") or {}
    judged = judge.get("judged", 0) + sum(judge.get("dropped", {}).values())
    return judged >= sessions and not status["ready"] and status["eligible"] > 0


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
    p.add_argument(
        "--judge",
        choices=("shipped", "rule"),
        default="shipped",
        help="shipped: Reef's default judge; rule: demo.reactions:rule_judge (told the answer)",
    )
    p.add_argument(
        "--gate",
        choices=("default", "always"),
        default="default",
        help="default: Reef's default gate; always: every candidate becomes the head",
    )
    args = p.parse_args(argv)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    state_dir = (args.state_dir or ROOT / ".reef-demo" / f"reactions-{stamp}").resolve()
    state_dir.parent.mkdir(parents=True, exist_ok=True)
    run(args, state_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
