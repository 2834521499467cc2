"""`python -m demo`: teach SmolLM2 a preference through Reef's feedback loop and print the
learning curve.

    .venv/bin/python -m demo [--rounds 10] [--target 0.8] [--docs]

Each round the simulated app asks 8 training questions, scores every answer (1 if it has at
most five words), reports it (a failed one with the reference answer as its correction), waits
until Reef's evolve worker has trained, published and deployed the new release, then measures
the pass rate on 16 held-out questions that are never reported. It stops at the target pass
rate or after the round budget.

Beside the preference it measures correctness (does the held-out answer name the reference
answer?), and by default the gate carries a guard on exactly that (`gate.guards`, scorer
`contains`): a candidate that got shorter by getting wrong is rejected, by name, and the head
stays. `--no-guard` shows the run without it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from datetime import datetime
from pathlib import Path

from demo.app import Answer, App
from demo.curve import Step, log_mlflow, plot, save_figures, table
from demo.preference import HELD_OUT, HELD_OUT_KEYS, SYSTEM_PROMPT, TRAIN, correct, messages
from demo.server import Server

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = "five-words"
BATCH = 8
# The design guide's measured SmolLM2 recipe (LoRA r16/alpha32 on all linear layers, batch 4)
# with 4 epochs instead of 6 (the 2-core budget is per round, and a later round goes on training
# the previous release's adapter on fresh corrections) and lr 3e-4 instead of 1e-3: at 1e-3 (or
# 5e-4) round 1's candidate answers 6-7 of 16 held-out questions right against the base's 11
# and the correctness guard refuses it; at 3e-4 it is 8/16 with 14/16 short, which the guard
# let through only while it asked whether the drop was significant (measured offline and in
# `make demo`, 2026-12-02); as a non-inferiority test it refuses that too (docs/demo.md).
RECIPE_PARAMS = {
    "epochs": 4,
    "batch_size": 4,
    "learning_rate": 3e-4,
    "max_length": 256,
    "lora_r": 16,
    "lora_alpha": 32,
}
# What the worker logs that is worth showing while a round waits for its release.
SHOWN = ("eligible samples", "train step", "gate:", "is the head", "evolve failed", "Traceback")


def guard_tasks(path: Path) -> Path:
    """The correctness guard's task set: the held-out questions with their reference keys."""
    lines = [
        json.dumps({"id": f"held-out-{i}", "messages": messages(q), "answer": keys})
        for i, ((q, _), keys) in enumerate(zip(HELD_OUT, HELD_OUT_KEYS, strict=True))
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def config(params: dict, guard: dict | None = None, max_tokens: int = 24) -> dict:
    gate: dict = {"policy": "always"}
    if guard is not None:
        # Guards hold under every policy: `always` still refuses a candidate that broke one.
        gate |= {"guards": [guard], "max_tokens": max_tokens}
    return {
        # All 16 held-out questions in one batch, on every core (an explicit `threads` beats
        # the OMP_NUM_THREADS the evolve worker gets, see `run`).
        "engine": {"embedded": {"max_batch_size": len(HELD_OUT), "threads": os.cpu_count() or 1}},
        # `always`: every candidate becomes a release (the demo measures it on held-out
        # questions itself); `improve` would gate on the evaluation pool, a few samples at first.
        "reef": {"recipe": "sft", "batch_size": BATCH, "params": params},
        "gate": gate,
    }


class Clock:
    def __init__(self) -> None:
        self.start = time.monotonic()

    def __call__(self) -> float:
        return time.monotonic() - self.start

    def say(self, message: str) -> None:
        print(f"[{self():6.1f}s] {message}", flush=True)


def measure(app: App, release_id: str, clock: Clock) -> tuple[float, int, list[Answer]]:
    """Held-out pass rate of `release_id` (temperature 0, never reported)."""
    for _ in range(20):
        answers = app.ask_all(HELD_OUT)
        served = {a.release_id for a in answers}
        if served == {release_id}:
            passed = sum(int(a.score) for a in answers)
            return passed / len(answers), passed, answers
        clock.say(f"  held-out answers came from {sorted(served)}, not {release_id}: again")
        time.sleep(0.5)
    raise RuntimeError(f"release {release_id} never served the held-out questions")


def right(answers: list[Answer]) -> int:
    """How many held-out answers name their reference answer."""
    return sum(correct(a.text, HELD_OUT_KEYS[i]) for i, a in enumerate(answers))


def rejected_since(app: App, known: set[str]) -> dict | None:
    """A candidate the gate refused that was not there before the round, if any."""
    return next(
        (c for c in app.candidates() if c["release_id"] not in known and c["status"] == "rejected"),
        None,
    )


def wait_for_release(
    app: App, server: Server, previous: str, clock: Clock, timeout_s: float, known: set[str]
) -> dict:
    """The new head, or (a guard refused the round's candidate) {"rejected": reason}."""
    deadline = time.monotonic() + timeout_s
    shown = ""
    while time.monotonic() < deadline:
        for line in server.new_log_lines():
            message = line.split(": ", 1)[-1][:150]
            if any(key in line for key in SHOWN) and message != shown:
                clock.say("  worker: " + message)
                shown = message
            if "evolve failed" in line:
                raise RuntimeError(f"the evolve worker failed:\n{server.log()[-6000:]}")
        if server.proc is not None and server.proc.poll() is not None:
            raise RuntimeError(f"reef serve exited:\n{server.log()[-6000:]}")
        head = app.head()
        if head is not None and head["release_id"] != previous:
            return head
        refused = rejected_since(app, known)
        if refused is not None:
            return {"rejected": refused.get("message") or refused["gate"]["reason"]}
        time.sleep(0.5)
    raise RuntimeError(f"no new release within {timeout_s:.0f}s:\n{server.log()[-6000:]}")


def run(
    state_dir: Path,
    *,
    rounds: int,
    target: float,
    max_tokens: int,
    params: dict,
    round_timeout_s: float,
    train_threads: int = 1,
    docs_png: Path | None = None,
    guard_max_drop: float | None = None,
) -> list[Step]:
    clock = Clock()
    clock.say(f"state in {state_dir}; starting reef serve --model smollm2 (evolve worker on)")
    # The evolve worker inherits the server's environment. On two shared cores one torch thread
    # trains 3-4x faster than two (measured: 2 SFT steps 6 s vs 16-27 s with the machine busy):
    # two OpenMP threads spin against the serving engine's and everyone else's.
    env = {"OMP_NUM_THREADS": str(train_threads)} if train_threads else {}
    guard = correctness_guard(state_dir, guard_max_drop, clock)
    server = Server(state_dir, "smollm2", config(params, guard, max_tokens), env=env)
    steps: list[Step] = []
    try:
        server.start()
        clock.say(f"serving on {server.url}/v1 (log: {server.log_path})")
        app = App(server.url, SCENARIO, "smollm2", max_tokens=max_tokens)
        clock.say(f"app preference (system prompt): {SYSTEM_PROMPT!r}")
        app.create_scenario()
        head = app.head()
        assert head is not None
        base_id = head["release_id"]
        t0 = clock()
        rate, passed, base_answers = measure(app, base_id, clock)
        answers = base_answers
        ok_base = right(base_answers)
        steps.append(
            Step(0, base_id, rate, passed, len(HELD_OUT), clock() - t0, 0.0, clock(), None, ok_base)
        )
        clock.say(
            f"base {base_id}: held-out pass rate {rate:.0%} ({passed}/{len(HELD_OUT)}), "
            f"correct {ok_base}/{len(HELD_OUT)}"
        )
        for n in range(1, rounds + 1):
            if steps[-1].pass_rate >= target:
                break
            step, answers = feedback_round(
                app, server, n, steps[-1].release_id, clock, round_timeout_s
            )
            steps.append(step)
        app.close()
        show_answers(base_answers, answers)
    finally:
        server.stop()
    reached = steps[-1].pass_rate >= target
    clock.say(
        f"{'reached' if reached else 'did not reach'} {target:.0%} after {len(steps) - 1} "
        f"round(s); total {clock():.1f}s"
    )
    print(
        "\nlearning curve (held-out pass rate and correctness per release):\n" + table(steps),
        flush=True,
    )
    logged = {"max_tokens": max_tokens, "target": target, "train_threads": train_threads}
    publish_curve(steps, state_dir, server, clock, target, docs_png, {**logged, **params})
    return steps


def correctness_guard(state_dir: Path, max_drop: float | None, clock: Clock) -> dict | None:
    """The gate guard on held-out correctness (None: no guard), its task set written first."""
    if max_drop is None:
        return None
    state_dir.mkdir(parents=True, exist_ok=True)
    tasks = guard_tasks(state_dir / "guard-correct.jsonl")
    clock.say(f"gate guard 'correct': held-out reference answers, max drop {max_drop}")
    return {"name": "correct", "dataset": str(tasks), "max_drop": max_drop}


def feedback_round(
    app: App, server: Server, n: int, head_id: str, clock: Clock, round_timeout_s: float
) -> tuple[Step, list[Answer]]:
    """Round `n`: the training questions asked and reported, the release that follows (or the
    gate's refusal, the head staying) measured on the held-out questions, and its answers."""
    started = clock()
    pool = [TRAIN[(BATCH * (n - 1) + i) % len(TRAIN)] for i in range(BATCH)]
    answers = app.ask_each(pool)  # in order: the round's training order is fixed
    ok = sum(int(a.score) for a in answers)
    clock.say(f"round {n}: asked {BATCH} training questions, {ok}/{BATCH} kept to 5 words")
    known = {c["release_id"] for c in app.candidates()}
    for a in answers:
        app.report(a)
    reported = clock()
    clock.say(f"round {n}: reported {BATCH} ({BATCH - ok} with a correction)")
    moved = wait_for_release(app, server, head_id, clock, round_timeout_s, known)
    evolve_s = clock() - reported
    refused = moved.get("rejected")
    if refused:
        clock.say(f"round {n}: the gate refused the candidate: {refused}")
    else:
        head_id = moved["release_id"]
        clock.say(f"round {n}: release {head_id} is the head ({evolve_s:.1f}s)")
    rate, passed, answers = measure(app, head_id, clock)
    step = Step(
        n,
        head_id,
        rate,
        passed,
        len(HELD_OUT),
        clock() - started,
        evolve_s,
        clock(),
        ok / BATCH,
        right(answers),
        refused,
    )
    print(
        f"== round {n:2d}  release {step.release_id}  pass rate {rate:4.0%} "
        f"({passed}/{len(HELD_OUT)})  correct {step.correct}/{len(HELD_OUT)}  "
        f"{step.seconds:5.1f}s  (total {step.elapsed:.1f}s)",
        flush=True,
    )
    return step, answers


def show_answers(base_answers: list[Answer], answers: list[Answer]) -> None:
    """The first held-out answers of the base and of the last release, side by side."""
    print("\nheld-out answers, base -> last release:", flush=True)
    for before, after in list(zip(base_answers, answers, strict=True))[:6]:
        keys = HELD_OUT_KEYS[HELD_OUT.index((before.question, before.reference))]
        print(
            f"  {before.question}\n    {before.text.strip()!r} ({int(before.score)}, "
            f"{'right' if correct(before.text, keys) else 'wrong'})"
            f"\n -> {after.text.strip()!r} ({int(after.score)}, "
            f"{'right' if correct(after.text, keys) else 'wrong'})",
            flush=True,
        )


def publish_curve(
    steps: list[Step],
    state_dir: Path,
    server: Server,
    clock: Clock,
    target: float,
    docs_png: Path | None,
    params: dict,
) -> None:
    """The learning curve as a PNG (and in docs/ when asked), an MLflow run with `params`, and
    the dashboard's figures."""
    png = plot(
        steps,
        state_dir / "learning-curve.png",
        target=target,
        title=f"SmolLM2-135M learns 'at most five words' from feedback ({BATCH} reports/round)",
    )
    clock.say(f"curve: {png}")
    if docs_png is not None:
        shutil.copyfile(png, docs_png)
        clock.say(f"curve: {docs_png}")
    run_id = log_mlflow(
        server.tracking_uri,
        (state_dir / "artifacts" / "mlflow").resolve().as_uri(),
        SCENARIO,
        steps,
        png,
        {"batch_size": BATCH, **params},
    )
    clock.say(f"MLflow: run {run_id} 'demo' in experiment reef/{SCENARIO} ({server.tracking_uri})")
    saved = save_figures(state_dir / "artifacts", SCENARIO, steps, "python -m demo")
    clock.say(f"dashboard figures: {', '.join(saved)} (the learning page of {SCENARIO})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m demo", description=__doc__)
    p.add_argument("--rounds", type=int, default=10, help="most rounds of feedback (default 10)")
    p.add_argument("--target", type=float, default=0.8, help="stop at this held-out pass rate")
    p.add_argument("--max-tokens", type=int, default=24, help="max_tokens of the app's calls")
    p.add_argument("--epochs", type=float, default=RECIPE_PARAMS["epochs"])
    p.add_argument("--state-dir", type=Path, help="default: .reef-demo/<timestamp> (fresh)")
    p.add_argument("--round-timeout", type=float, default=600.0, help="seconds per release")
    p.add_argument(
        "--train-threads", type=int, default=1, help="torch threads for training (0: default)"
    )
    p.add_argument("--docs", action="store_true", help="also write docs/learning-curve.png")
    p.add_argument(
        "--guard-max-drop",
        type=float,
        default=0.0,
        help="the correctness guard's allowed drop in held-out correctness (default 0)",
    )
    p.add_argument("--no-guard", action="store_true", help="gate on nothing but the policy")
    args = p.parse_args(argv)
    state_dir = args.state_dir or ROOT / ".reef-demo" / datetime.now().strftime("%Y%m%d-%H%M%S")
    if state_dir.exists() and any(state_dir.iterdir()):
        p.error(f"{state_dir} is not empty: the demo starts from a fresh state")
    state_dir.parent.mkdir(parents=True, exist_ok=True)
    ignore = state_dir.parent / ".gitignore"
    if state_dir.parent.name == ".reef-demo" and not ignore.exists():
        ignore.write_text("*\n")  # runs' state never shows up in git status
    params = {**RECIPE_PARAMS, "epochs": args.epochs}
    steps = run(
        state_dir.resolve(),
        rounds=args.rounds,
        target=args.target,
        max_tokens=args.max_tokens,
        params=params,
        round_timeout_s=args.round_timeout,
        train_threads=args.train_threads,
        docs_png=ROOT / "docs" / "learning-curve.png" if args.docs else None,
        guard_max_drop=None if args.no_guard else args.guard_max_drop,
    )
    # Success is the loop doing its job: the preference learned, or a guard that kept a
    # candidate which bought it with wrong answers from becoming the head.
    guarded = any(s.rejected and "guard" in s.rejected for s in steps)
    return 0 if steps[-1].pass_rate >= args.target or guarded else 1


if __name__ == "__main__":
    sys.exit(main())
