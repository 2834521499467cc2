"""LoRA training steps on one thread against every core, alternating in one process so that both
see the same machine: what `reef.train_threads` (1 by default, leaving the other cores to the
serving engine) costs a round's training when nothing else runs.

The step is the sft recipe's shape (LoRA r 16 on every linear layer, AdamW, a batch of 4
sequences of `--tokens` tokens) on the base weights; the engine is not running. What a second
thread does to answers served while training runs is not measured here.

    .venv/bin/python bench/train_threads.py [--model smollm2] [--rounds 3] [--steps 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="smollm2", help="tiny, smollm2, or a model directory")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds of each arm")
    p.add_argument("--steps", type=int, default=4, help="optimizer steps per arm and round")
    p.add_argument("--tokens", type=int, default=128, help="sequence length of the batch")
    args = p.parse_args()

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from reef.models import resolve_model
    from reef.settings import EngineSettings

    path = resolve_model(args.model, EngineSettings().model_cache)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    model = get_peft_model(base, lora)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(
        0, model.config.vocab_size, (4, args.tokens), generator=torch.Generator().manual_seed(0)
    )

    def per_step(threads: int) -> float:
        torch.set_num_threads(threads)
        started = time.perf_counter()
        for _ in range(args.steps):
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
        return (time.perf_counter() - started) / args.steps

    cores = os.cpu_count() or 1
    per_step(1)  # warm-up: allocations, kernels
    seconds: dict[int, list[float]] = {1: [], cores: []}
    for r in range(args.rounds):
        for threads in seconds:
            seconds[threads].append(per_step(threads))
            print(f"round {r} threads {threads}: {seconds[threads][-1]:.3f} s a step", flush=True)
    one, every = statistics.median(seconds[1]), statistics.median(seconds[cores])
    print(f"median s a step: 1 thread {one:.3f}, {cores} threads {every:.3f}: {every / one:.2f}x "
          f"the time, load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
