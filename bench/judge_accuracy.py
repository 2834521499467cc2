"""Judge bench: how well each judge Reef can run on the served model reads reactions, and at what
cost, on a labelled set it was never tuned on.

    python bench/judge_accuracy.py                    # SmolLM2, every judge
    python bench/judge_accuracy.py --generate-n 12    # the generating judge on 12 items only
    python bench/judge_accuracy.py --docs             # also writes docs/judge_bench.json

The set (bench/data/judge_labels.jsonl, 258 turns) holds a turn, what came next (a user's message
or a tool's result) and a label in {-1, 0, +1}, with the kind of reaction (thanks, corrections,
complaints that name no rule, redo requests, sarcasm, topic changes, tool errors, empty and
successful tool results, ...), its style (formal, terse, typos, emoji, French, ...) and whether
the label is clear. It was written for this bench by someone who had not seen the judges' fixed
examples or the probe's seed labels (reef/data/judge_seed.jsonl); a second annotator labelled
every item again without seeing the first labels (judge_labels.annotator_b.jsonl): their
agreement is reported, and "consensus" scores each judge on the items both labelled alike.

Judges:
- likelihood: one forward pass of the served model over a fixed text of labelled reactions and
  the turn's reaction; the verdict is the likeliest of " good", " bad", " unclear" (reef.verdicts);
- likelihood+probe (the shipped default): the same pass, calibrated by a probe fitted on the seed
  labels only (never on this set);
- generate: the judge Reef shipped before: the served model answers the evaluate question m = 3
  times at temperature 0.6 and up to 512 tokens, and the plurality of `\\boxed{v}` votes wins
  (void when no answer has one). Only the evaluate question is asked here; the shipped generating
  judge also asks the hint question m times, which doubles its cost.

Costs are seconds per judged turn on this machine, one thread, and tokens per turn (read for the
likelihood judges, the fixed text excluded since it is read once; written for the generating one).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reef.judge import Exchange, boxed, judge_messages, plurality
from reef.models import resolve_model
from reef.verdicts import LikelihoodJudge, Probe, Reader, seed_labels

DATA = Path(__file__).resolve().parent / "data"
LABELS = (1, -1, 0)


@dataclass(frozen=True)
class Item:
    id: str
    kind: str
    style: str
    exchange: Exchange
    label: int
    clear: bool


@dataclass(frozen=True)
class Outcome:
    verdict: int | None  # None: void
    confidence: float
    seconds: float
    tokens: int


def load_items(path: Path) -> list[Item]:
    items = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        exchange = Exchange(
            messages=tuple(row["messages"]),
            reply=row["reply"],
            next_role=row["next"]["role"],
            next_text=row["next"]["content"],
        )
        items.append(
            Item(row["id"], row["kind"], row["style"], exchange, int(row["label"]), row["clear"])
        )
    return items


def other_labels(path: Path) -> dict[str, dict[str, int]]:
    """Every other annotator's labels: annotator -> item id -> label."""
    out = {}
    for f in sorted(path.parent.glob(path.stem + ".annotator_*.jsonl")):
        rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        out[f.stem.rsplit("_", 1)[-1]] = {r["id"]: int(r["label"]) for r in rows}
    return out


# judges -------------------------------------------------------------------------------------
def likelihood_judges(reader: Reader) -> dict[str, Callable[[Item], Outcome]]:
    plain = LikelihoodJudge(reader, "likelihood")
    probed = LikelihoodJudge(reader, "likelihood+probe")
    t = time.perf_counter()
    probed.fit(seed_labels())
    probe = probed.probe
    assert isinstance(probe, Probe)
    print(f"probe fitted on {probe.n} seed labels in {time.perf_counter() - t:.1f} s")

    def run(judge: LikelihoodJudge) -> Callable[[Item], Outcome]:
        def one(item: Item) -> Outcome:
            j = judge.judge(item.exchange)
            return Outcome(j.verdict, j.confidence, j.seconds, j.tokens)

        return one

    return {"likelihood": run(plain), "likelihood+probe": run(probed)}


def generating_judge(model_dir: Path, max_tokens: int, votes: int) -> Callable[[Item], Outcome]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    written = [0]

    def ask(task: Any, exchange: Exchange, sample: int) -> str:
        text = tok.apply_chat_template(
            judge_messages(task, exchange), tokenize=False, add_generation_prompt=True
        )
        ids = tok(text, return_tensors="pt", add_special_tokens=False)
        torch.manual_seed(sample)
        with torch.inference_mode():
            out = model.generate(
                **ids, max_new_tokens=max_tokens, do_sample=True, temperature=0.6, top_p=1.0
            )
        new = out[0, ids.input_ids.shape[1] :]
        written[0] += int(new.shape[0])
        return str(tok.decode(new, skip_special_tokens=True))

    def one(item: Item) -> Outcome:
        written[0] = 0
        t = time.perf_counter()
        votes_cast = [boxed(ask("evaluate", item.exchange, i)) for i in range(votes)]
        seconds = time.perf_counter() - t
        score = plurality(votes_cast)
        void = all(v not in LABELS for v in votes_cast)
        confidence = sum(v == score for v in votes_cast) / len(votes_cast)
        return Outcome(None if void else score, confidence, seconds, written[0])

    return one


# scoring ------------------------------------------------------------------------------------
def macro_f1(truth: Sequence[int], pred: Sequence[int | None]) -> float:
    f1s = []
    for c in LABELS:
        tp = sum(t == c and p == c for t, p in zip(truth, pred, strict=True))
        fp = sum(t != c and p == c for t, p in zip(truth, pred, strict=True))
        fn = sum(t == c and p != c for t, p in zip(truth, pred, strict=True))
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    return sum(f1s) / len(f1s)


def summarize(
    items: Sequence[Item], outcomes: Sequence[Outcome], consensus: dict[str, int]
) -> dict[str, Any]:
    truth = [i.label for i in items]
    pred = [o.verdict for o in outcomes]
    clear = [(i.label, o.verdict) for i, o in zip(items, outcomes, strict=True) if i.clear]
    agreed = [
        (consensus[i.id], o.verdict)
        for i, o in zip(items, outcomes, strict=True)
        if i.id in consensus
    ]
    by_kind: dict[str, list[bool]] = defaultdict(list)
    for i, o in zip(items, outcomes, strict=True):
        by_kind[f"{i.kind} ({i.label:+d})"].append(o.verdict == i.label)
    seconds = [o.seconds for o in outcomes]
    return {
        "n": len(items),
        "accuracy": sum(t == p for t, p in zip(truth, pred, strict=True)) / len(items),
        "clear_n": len(clear),
        "clear_accuracy": sum(t == p for t, p in clear) / len(clear) if clear else None,
        "macro_f1": macro_f1(truth, pred),
        "consensus_n": len(agreed),
        "consensus_accuracy": sum(t == p for t, p in agreed) / len(agreed) if agreed else None,
        "void_rate": sum(p is None for p in pred) / len(pred),
        "seconds_p50": statistics.median(seconds),
        "seconds_mean": statistics.fmean(seconds),
        "tokens_mean": statistics.fmean(o.tokens for o in outcomes),
        "by_kind": {k: sum(v) / len(v) for k, v in sorted(by_kind.items())},
    }


def annotator_agreement(items: Sequence[Item], others: dict[str, dict[str, int]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, labels in others.items():
        pairs = [(i.label, labels[i.id]) for i in items if i.id in labels]
        if not pairs:
            continue
        po = sum(a == b for a, b in pairs) / len(pairs)
        ca, cb = Counter(a for a, _ in pairs), Counter(b for _, b in pairs)
        pe = sum(ca[c] * cb[c] for c in LABELS) / len(pairs) ** 2
        clear = [(i.label, labels[i.id]) for i in items if i.id in labels and i.clear]
        out[name] = {
            "n": len(pairs),
            "agreement": po,
            "cohen_kappa": (po - pe) / (1 - pe) if pe < 1 else 1.0,
            "clear_agreement": sum(a == b for a, b in clear) / len(clear) if clear else None,
        }
    return out


def consensus_labels(items: Sequence[Item], others: dict[str, dict[str, int]]) -> dict[str, int]:
    """Items every annotator labelled alike, with that label (all items when there is only one
    annotator)."""
    out = {}
    for i in items:
        votes = [i.label] + [labels[i.id] for labels in others.values() if i.id in labels]
        if len(set(votes)) == 1:
            out[i.id] = i.label
    return out


def print_table(results: dict[str, dict[str, Any]]) -> None:
    cols = ["n", "accuracy", "clear_accuracy", "consensus_accuracy", "macro_f1", "void_rate"]
    cols += ["seconds_p50", "tokens_mean"]
    print("| judge | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for name, r in results.items():
        cells = [_cell(r[c]) for c in cols]
        print(f"| {name} | " + " | ".join(cells) + " |")


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="smollm2", help="smollm2, tiny or a model directory")
    p.add_argument("--labels", type=Path, default=DATA / "judge_labels.jsonl")
    p.add_argument("--generate-n", type=int, default=12, help="items the generating judge gets")
    p.add_argument("--generate-max-tokens", type=int, default=512)
    p.add_argument("--votes", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--docs", action="store_true", help="write docs/judge_bench.json")
    args = p.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    cache = Path(os.environ.get("REEF_MODEL_CACHE", Path.home() / ".cache/reef/models"))
    model_dir = resolve_model(args.model, cache)
    items = load_items(args.labels)
    others = other_labels(args.labels)
    consensus = consensus_labels(items, others)
    print(f"{len(items)} items, {sum(i.clear for i in items)} clear; annotators: 1 + {len(others)}")

    reader = Reader(model_dir, threads=args.threads, cache_dir=cache / "judge")
    results: dict[str, dict[str, Any]] = {}
    judges = likelihood_judges(reader)
    for name, judge in judges.items():
        outcomes = [judge(i) for i in items]
        results[name] = summarize(items, outcomes, consensus)
        print(f"{name}: done")
    if args.generate_n > 0:
        # every kth item, so the subset keeps the set's mix of kinds
        step = max(1, len(items) // args.generate_n)
        subset = items[::step][: args.generate_n]
        gen = generating_judge(model_dir, args.generate_max_tokens, args.votes)
        outcomes = []
        for n, item in enumerate(subset, 1):
            outcomes.append(gen(item))
            print(f"generate: {n}/{len(subset)} ({outcomes[-1].seconds:.1f} s)", flush=True)
        results["generate (subset)"] = summarize(subset, outcomes, consensus)
        subset_ids = {i.id for i in subset}
        same = [i for i in items if i.id in subset_ids]
        for name, judge in judges.items():
            results[f"{name} (same subset)"] = summarize(same, [judge(i) for i in same], consensus)

    print_table(results)
    agreement = annotator_agreement(items, others)
    for name, a in agreement.items():
        print(f"annotator {name} vs the set's labels: {json.dumps(a)}")
    for name, r in results.items():
        print(f"\n{name} by kind:")
        for kind, acc in r["by_kind"].items():
            print(f"  {kind}: {acc:.2f}")
    if args.docs:
        out = {
            "command": "python bench/judge_accuracy.py " + " ".join(sys.argv[1:]),
            "machine": platform.processor() or platform.machine(),
            "model": args.model,
            "annotators": agreement,
            "consensus_items": len(consensus),
            "results": results,
        }
        path = Path(__file__).resolve().parents[1] / "docs" / "judge_bench.json"
        path.write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
