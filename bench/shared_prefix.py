"""What reading a batch's shared prefix once saves (reef.recipes.shared_prefix), on SmolLM2.

Three places, each timed in one process with the prefix read once ("shared") and with every
sequence read whole ("whole", the code before), alternated `--repeat` times:

- replay: the gate's replay log-probs (recipes.evaluate.answer_logprobs) of 32 short exchanges
  under the chat template's default system prompt;
- sft: the sft recipe's training (LoRA r 16, batch 4, 2 epochs: 4 steps) on 8 corrections:
  the whole call (loading the policy, building the trainer, saving) and TRL's `train_runtime`
  (the steps) apart;
- tttd: one TTT-Discover learner step (recipes.tttd.learner.train_grid) on a 2 x 4 grid of
  60-95-token completions of one ~280-token prompt per group.

After one untimed warm-up call per place, prints seconds per arm and run, the ratio shared / whole of the medians, and the largest
difference in what each computes (log-probs; loss; loss and KL). Writes JSON to bench/results/.

    .venv/bin/python bench/shared_prefix.py [--repeat 3] [--threads 2] [--only replay,sft,tttd]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TQDM_DISABLE", "1")  # no progress bars between the timings

import pyarrow as pa  # noqa: E402
import torch  # noqa: E402

from reef.datasets import SCHEMAS  # noqa: E402
from reef.models import resolve_model  # noqa: E402
from reef.recipe import TrainJob, load_recipe  # noqa: E402
from reef.recipes import evaluate as ev  # noqa: E402
from reef.recipes import shared_prefix as sp  # noqa: E402
from reef.recipes.sao.learner import response_logprobs  # noqa: E402
from reef.recipes.tttd import learner  # noqa: E402
from reef.recipes.tttd.grid import grid_metadata  # noqa: E402
from reef.recipes.tttd.params import TTTDParams  # noqa: E402
from reef.settings import Settings  # noqa: E402

THINGS = ["car", "house", "door", "boat", "kite", "hat", "cup", "bike"]


@contextlib.contextmanager
def whole() -> Iterator[None]:
    """Every sequence read whole, as before the shared prefix."""
    saved = (ev.shared_prefix, sp.shared_prefix_training, learner.response_logprobs_after)

    def alone(model: Any, prompt: list[int], completions: Any) -> list[torch.Tensor]:
        return [
            response_logprobs(model, torch.tensor([prompt + list(c)]), len(prompt))
            for c in completions
        ]

    ev.shared_prefix = lambda part: 0
    sp.shared_prefix_training = lambda model: contextlib.nullcontext(False)
    learner.response_logprobs_after = alone
    try:
        yield
    finally:
        ev.shared_prefix, sp.shared_prefix_training, learner.response_logprobs_after = saved


def row(i: int, messages: list[dict[str, Any]], **kind: Any) -> dict[str, Any]:
    sid = f"rec_{i}"
    common = {"sample_id": sid, "scenario": "s", "record_ids": [sid], "release_id": "rel_base"}
    common |= {"staleness": 0, "report_ids": [f"rep_{i}"], "report_id": f"rep_{i}"}
    return common | {"messages": json.dumps(messages)} | kind


def replay(model_dir: Path) -> Callable[[], Any]:
    model, tokenizer = ev.load_model(model_dir, "base", None)
    answers = ("Blue, mostly.", "It is teal.", "Grey when it rains, otherwise blue.", "")
    items = [
        ([{"role": "user", "content": f"What colour is the {t}?"}], a)
        for t in THINGS
        for a in answers
    ]
    return lambda: ev.answer_logprobs(model, tokenizer, items)


def sft(model_dir: Path) -> Callable[[], Any]:
    rows = [
        row(i, [{"role": "user", "content": f"What colour is the {t}?"}], n_tokens=None,
            completion="I don't know.", score=0.0, feedback=json.dumps({"correction": "It is teal."}))
        for i, t in enumerate(THINGS)
    ]  # fmt: skip
    table = pa.Table.from_pylist(rows, schema=SCHEMAS["scored"])
    recipe = load_recipe("sft", {"epochs": 2, "max_length": 128})

    def run() -> tuple[float, float]:
        with tempfile.TemporaryDirectory() as d:
            trained = recipe.train(TrainJob("s", model_dir, table, Path(d) / "c", seed=0))
        return trained.metrics["train_loss"], trained.metrics["train_runtime"]

    return run


def tttd(model_dir: Path) -> Callable[[], Any]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rnd = random.Random(0)
    circles = "\n".join(
        f"circle {i}: x={rnd.random():.4f} y={rnd.random():.4f} r={0.05 + 0.01 * i:.4f}"
        for i in range(6)
    )
    groups, per_group, rows = 2, 4, []
    for g in range(groups):
        ask = (
            "You improve a packing of 6 circles in the unit square. Reply with a JSON list of "
            'edits, each {"op": "move"|"grow", "i": index, ...}. Keep every circle inside the '
            f"square and apart from the others.\n{circles}\nparent {g}: sum of radii 0.7386. "
            "Propose edits that raise it."
        )
        messages = [{"role": "user", "content": ask}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        for r in range(per_group):
            done = [rnd.randrange(100, 40000) for _ in range(rnd.randrange(60, 96))]
            rows.append(
                row(g * per_group + r, messages, n_tokens=len(prompt) + len(done),
                    completion="```json\n[]\n```", score=rnd.random(), prompt_token_ids=prompt,
                    completion_token_ids=done, completion_mask=[1] * len(done),
                    logprobs=[-2.0] * len(done),
                    report_metadata=json.dumps(grid_metadata(0, g, r, groups, per_group)),
                    reported_at=f"2026-01-01T00:00:0{r}+00:00")
            )  # fmt: skip
    params = TTTDParams(groups_per_step=groups, rollouts_per_group=per_group)

    def run() -> tuple[float, float]:
        with tempfile.TemporaryDirectory() as d:
            job = TrainJob("s", model_dir, None, Path(d) / "c", seed=0)  # type: ignore[arg-type]
            trained = learner.train_grid(job, params, 0, rows)
        return trained.metrics["train_loss"], trained.metrics["train_kl_to_base"]

    return run


def differs(a: Any, b: Any) -> float:
    """The largest absolute difference between two results (numbers or sequences of them)."""
    a_, b_ = (list(x) if isinstance(x, (list, tuple)) else [x] for x in (a, b))
    return max(abs(float(x) - float(y)) for x, y in zip(a_, b_, strict=True))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeat", type=int, default=3, help="alternated whole/shared pairs")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--only", default="replay,sft,tttd")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    settings = Settings()
    model_dir = resolve_model(settings.engine.model, settings.engine.model_cache)
    builders = {"replay": replay, "sft": sft, "tttd": tttd}
    result: dict[str, Any] = {"threads": args.threads, "repeat": args.repeat, "places": {}}
    for name in args.only.split(","):
        run = builders[name](model_dir)
        seconds: dict[str, list[float]] = {"whole": [], "shared": []}
        outputs: dict[str, Any] = {}
        runs: dict[str, list[Any]] = {"whole": [], "shared": []}
        run()  # warm-up: the first call of a place pays its imports and first allocations
        for _ in range(args.repeat):
            for arm in ("whole", "shared"):
                with whole() if arm == "whole" else contextlib.nullcontext():
                    started = time.perf_counter()
                    outputs[arm] = run()
                    seconds[arm].append(time.perf_counter() - started)
                runs[arm].append(outputs[arm])
                print(f"{name:6s} {arm:6s} {seconds[arm][-1]:7.3f} s", flush=True)
        ratio = statistics.median(seconds["shared"]) / statistics.median(seconds["whole"])
        place: dict[str, Any] = {"seconds": seconds, "ratio": ratio}
        if name == "sft":  # (loss, train_runtime): the steps' seconds apart from the call's
            steps = {arm: [r[1] for r in runs[arm]] for arm in runs}
            place["train_runtime"] = steps
            place["train_runtime_ratio"] = statistics.median(steps["shared"]) / statistics.median(
                steps["whole"]
            )
            print(f"sft steps (train_runtime): shared / whole {place['train_runtime_ratio']:.2f}x")
            outputs = {arm: out[0] for arm, out in outputs.items()}
        place["largest_difference"] = differs(outputs["whole"], outputs["shared"])
        print(
            f"{name}: shared / whole {ratio:.2f}x, largest difference "
            f"{place['largest_difference']:.2g}\n",
            flush=True,
        )
        result["places"][name] = place
    out = ROOT / "bench" / "results" / f"shared_prefix-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
