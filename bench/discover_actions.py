"""Which actions can SmolLM2-135M take in the discovery demo? Its valid-output rate and its
rate of valid outputs that differ from the parent, per action format (demo/discover/actions.py)
and temperature, on the same states.

    .venv/bin/python bench/discover_actions.py [--samples 8] [--n 6,8] [--temperatures 0.7,1.0]
        [--formats program,api,edits,coords,edits+schema] [--out bench/data/discover_actions.json]

For each state (the seeded baseline of each N) and format it samples `--samples` answers to the
format's prompt (the chat template, top-p 1, max_new_tokens per format below) with the model
loaded directly (no server), then judges every answer the way the demo does: strict parsing,
the sandbox for code (`program`, `api`), the exact verifier. "differs" counts valid answers
whose state is not the parent's (the program format returns no state: there, a verified Σr
other than the parent's); "improves" counts valid answers scoring above the parent.

`edits+schema` is the `edits` action with its JSON schema enforced while decoding, as the demo's
`--constrained` asks: its answers come from Reef's embedded engine (in this process, no HTTP)
with `response_format`, since transformers' generate has no such mask.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from demo.discover import actions  # noqa: E402
from demo.discover.sandbox import Limits  # noqa: E402

MAX_TOKENS = {"program": 256, "api": 96, "edits": 160, "coords": 128, "edits+schema": 160}
SCHEMA = "+schema"


def load(threads: int):  # type: ignore[no-untyped-def]
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reef.models import resolve_model

    torch.set_num_threads(threads)
    path = resolve_model("smollm2", Path("~/.cache/reef/models"))
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return tok, model, path


def sample(tok, model, messages, k: int, temperature: float, max_tokens: int, seed: int):  # type: ignore[no-untyped-def]
    import torch

    torch.manual_seed(seed)
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok([text] * k, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(
            **ids,
            do_sample=True,
            temperature=temperature,
            top_p=1.0,
            top_k=0,
            max_new_tokens=max_tokens,
            pad_token_id=tok.pad_token_id or tok.eos_token_id,
        )
    return [tok.decode(o[ids["input_ids"].shape[1] :], skip_special_tokens=True) for o in out]


def sample_constrained(
    path: Path, messages, n: int, k: int, temperature: float, max_tokens: int, seed: int
):  # type: ignore[no-untyped-def]
    """k answers from Reef's embedded engine with the edits schema enforced (response_format)."""
    import asyncio

    from reef.engines.embedded import EmbeddedEngine
    from reef.settings import EmbeddedSettings

    async def run() -> list[str]:
        engine = EmbeddedEngine(path, "smollm2", EmbeddedSettings(max_batch_size=k))
        await engine.start()
        try:
            body = {
                "model": "smollm2",
                "messages": messages,
                "response_format": actions.response_format("edits", n),
                "max_tokens": max_tokens,
                "temperature": temperature,
                "top_p": 1.0,
            }
            done = await asyncio.gather(
                *(engine.complete(body | {"seed": seed * 1000 + i}) for i in range(k))
            )
            return [d.response["choices"][0]["message"]["content"] or "" for d in done]
        finally:
            await engine.aclose()

    return asyncio.run(run())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--samples", type=int, default=8, help="answers per state, format and T")
    p.add_argument("--n", default="6", help="circles of the states (their seeded baselines)")
    p.add_argument("--temperatures", default="0.7,1.0")
    p.add_argument("--formats", default=",".join((*actions.ACTIONS, "edits" + SCHEMA)))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "data" / "discover_actions.json")
    args = p.parse_args()
    tok, model, path = load(args.threads)
    limits = Limits(wall_s=20.0)
    rows, examples = [], {}
    for fmt in args.formats.split(","):
        for t in (float(x) for x in args.temperatures.split(",")):
            counts = {"samples": 0, "valid": 0, "differs": 0, "improves": 0}
            started = time.monotonic()
            lengths = []
            action, constrained = fmt.removesuffix(SCHEMA), fmt.endswith(SCHEMA)
            for n in (int(x) for x in args.n.split(",")):
                parent = actions.seed(action, n)
                seeded = f"```python\n{parent}```" if fmt == "program" else parent
                base = actions.judge(
                    "program" if fmt == "program" else "coords", seeded, n, parent, limits
                )
                messages = actions.prompt(
                    action,
                    n,
                    parent,
                    base.verdict.reward,
                    base.verdict.reason,
                    constrained=constrained,
                )
                answers = (
                    sample_constrained(path, messages, n, args.samples, t, MAX_TOKENS[fmt], n)
                    if constrained
                    else sample(tok, model, messages, args.samples, t, MAX_TOKENS[fmt], seed=n)
                )
                for a in answers:
                    j = actions.judge(action, a, n, parent, limits)
                    lengths.append(len(tok(a)["input_ids"]))
                    same = (
                        abs(j.verdict.reward - base.verdict.reward) < 1e-12
                        if fmt == "program"
                        else j.program == parent
                    )
                    counts["samples"] += 1
                    counts["valid"] += j.verdict.valid
                    counts["differs"] += j.verdict.valid and not same
                    counts["improves"] += j.verdict.reward > base.verdict.reward + 1e-12
                examples[f"{fmt}@T{t}/n{n}"] = [
                    {
                        "answer": a[:600],
                        "verdict": actions.judge(action, a, n, parent, limits).verdict.reason,
                    }
                    for a in answers[:3]
                ]
            row = {
                "format": fmt,
                "temperature": t,
                **counts,
                "mean_tokens": round(statistics.fmean(lengths), 1),
                "seconds": round(time.monotonic() - started, 1),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\n| format | T | samples | valid | differs from parent | improves | mean tokens |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        s = r["samples"]
        print(
            f"| {r['format']} | {r['temperature']} | {s} | {r['valid'] / s:.0%} | "
            f"{r['differs'] / s:.0%} | {r['improves'] / s:.0%} | {r['mean_tokens']} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "examples": examples}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
