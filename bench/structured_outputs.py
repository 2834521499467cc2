"""What enforcing `response_format` costs the embedded engine: decode time per completion token,
constrained against plain, on the same prompts in the same process.

    .venv/bin/python bench/structured_outputs.py [--model smollm2] [--concurrency 8]
        [--max-tokens 64] [--reps 3]

Each rep runs the same batch of `--concurrency` requests (one short prompt, seeds 0..c-1,
temperature 1.0) two ways, interleaved: plain, and constrained by a JSON schema no answer can
finish within `--max-tokens` (an array of at least 64 digits), so both arms decode exactly
`--max-tokens` tokens a request (checked) and their times compare step for step. It reports the
wall time per completion token of each arm (the prompt is short: decoding dominates), its ratio
to plain (median over reps), and the mask's own cost per token measured alone
(`Constraint.allowed` + `accept`) for that schema, for `json_object` and for a small object
schema (an enum, a bounded integer, a short string).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCHEMA = {
    "type": "object",
    "properties": {
        "mood": {"enum": ["happy", "sad", "calm"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 30},
        "name": {"type": "string", "maxLength": 24},
    },
    "required": ["mood", "age", "name"],
    "additionalProperties": False,
}
LONG = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 64}
ARMS = {
    "plain": None,
    "json_schema": {"type": "json_schema", "json_schema": {"name": "digits", "schema": LONG}},
}
MASKS = {
    "digits array": ARMS["json_schema"],
    "json_object": {"type": "json_object"},
    "small object": {"type": "json_schema", "json_schema": {"name": "cat", "schema": SCHEMA}},
}
PROMPT = [{"role": "user", "content": "Describe a cat as a JSON object."}]


async def batch(engine, fmt, n: int, max_tokens: int) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    body = {"model": engine.model_id, "messages": PROMPT, "max_tokens": max_tokens}
    body |= {"temperature": 1.0, "top_p": 1.0}
    if fmt is not None:
        body["response_format"] = fmt
    started = time.perf_counter()
    done = await asyncio.gather(*(engine.complete(body | {"seed": s}) for s in range(n)))
    tokens = sum(d.response["usage"]["completion_tokens"] for d in done)
    return time.perf_counter() - started, tokens


ANSWERS = {
    "digits array": json.dumps(list(range(10)) * 7),
    "json_object": json.dumps({"mood": "calm", "age": 7, "name": "Tom"}),
    "small object": json.dumps({"mood": "calm", "age": 7, "name": "Tom"}),
}


def mask_cost(engine, name: str, tokens: int = 400) -> float:  # type: ignore[no-untyped-def]
    """Milliseconds per token of the mask alone: a valid answer's tokens fed to a matcher."""
    grammars, fmt = engine._grammars, MASKS[name]
    ids = engine._tokenizer.encode(ANSWERS[name], add_special_tokens=False)
    spent, fed = 0.0, 0
    while fed < tokens:
        c = grammars.constraint(fmt)
        for i in ids:
            t = time.perf_counter()
            c.allowed()
            c.accept(i)
            spent += time.perf_counter() - t
            fed += 1
    return spent / fed * 1000


async def run(args: argparse.Namespace) -> dict:
    from reef.engines.embedded import EmbeddedEngine
    from reef.models import resolve_model
    from reef.settings import EmbeddedSettings

    path = resolve_model(args.model, Path("~/.cache/reef/models").expanduser())
    engine = EmbeddedEngine(path, args.model, EmbeddedSettings(max_batch_size=args.concurrency))
    await engine.start()
    try:
        for fmt in MASKS.values():  # warm-up: the first matcher builds llguidance's tokenizer
            await batch(engine, fmt, 2, 8)
        per_token: dict[str, list[float]] = {arm: [] for arm in ARMS}
        for rep in range(args.reps):
            for arm, fmt in ARMS.items():
                seconds, tokens = await batch(engine, fmt, args.concurrency, args.max_tokens)
                if tokens != args.concurrency * args.max_tokens:
                    raise SystemExit(f"{arm}: {tokens} tokens, not all to --max-tokens")
                per_token[arm].append(seconds / tokens * 1000)
                print(f"rep {rep} {arm}: {tokens} tokens, {seconds:.2f} s", flush=True)
        masks = {name: mask_cost(engine, name) for name in MASKS}
    finally:
        await engine.aclose()
    plain = statistics.median(per_token["plain"])
    return {
        "ms_per_token": {a: round(statistics.median(v), 2) for a, v in per_token.items()},
        "ratio_to_plain": {a: round(statistics.median(v) / plain, 3) for a, v in per_token.items()},
        "mask_ms_per_token": {a: round(v, 3) for a, v in masks.items()},
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    result = asyncio.run(run(p.parse_args()))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
