"""Evaluation: score a model (the head or a candidate) sample by sample on the same evaluation
set, so the gate can compare the two pairwise.

Two ways, chosen by what the scenario has:

- replay (default): held-out reported samples. A sample's value is the model's mean per-token
  log-prob of the answer it should give, signed by the report: + for an answer scored at or
  above the recipe's threshold (or a correction from structured feedback, which is the answer
  the user wanted), − for one scored below. A model that moved towards what users rewarded and
  away from what they did not scores higher. Cheap (one forward pass per sample), deterministic,
  and needs no verifier.
- tasks: prompts with a scorer (a verifier `(completions, **columns) -> list[float]`): the model
  answers each prompt greedily and the scorer scores the answers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from reef import cores
from reef.recipe import Scorer
from reef.recipes.shared_prefix import common_prefix, repeated_cache
from reef.recipes.training import correction, shared_base

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalSample:
    """One evaluation item: the prompt and, for replay, the answer with its sign."""

    sample_id: str
    messages: list[dict[str, Any]]
    answer: str | None = None  # replay: the recorded answer or the user's correction
    sign: float = 0.0  # replay: +1 rewarded / corrected, -1 not
    columns: dict[str, Any] | None = None  # tasks: extra columns the scorer gets


# The models evaluation reads, kept between rounds: a round's candidate is, once released, the
# next round's head, and the tokenizer is the base's every time (together ~0.5 s a round on
# SmolLM2 + LoRA, measured: tokenizer 0.12 s, adapter 0.2-0.45 s). Keyed by what they are read
# from: the base's files' stamps and an adapter's content. Evaluation never writes them.
_LOADED: OrderedDict[tuple[Any, ...], tuple[Any, Any]] = OrderedDict()
_TOKENIZER: list[Any] = []  # [its key, the tokenizer]
_LOADED_LOCK = threading.Lock()
MODELS_KEPT = 3


def load_model(base_model: Path, kind: str, path: Path | None) -> tuple[Any, Any]:
    """A release's model for evaluation (the base, base + adapter, or a checkpoint) and the
    tokenizer; the base and adapters as this process last read them when their files are
    the same."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    key = _load_key(base_model, kind, path)
    with _LOADED_LOCK:
        if key is not None and key in _LOADED:
            _LOADED.move_to_end(key)
            return _LOADED[key]
    tokenizer = _tokenizer(base_model, AutoTokenizer)
    model: Any
    if kind == "checkpoint":
        assert path is not None
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    else:
        model = shared_base(base_model)
        if kind == "adapter":
            from peft import PeftModel

            assert path is not None
            model = PeftModel.from_pretrained(model, path)
    model.eval()
    if key is not None:
        with _LOADED_LOCK:
            _LOADED[key] = (model, tokenizer)
            while len(_LOADED) > MODELS_KEPT:
                _LOADED.popitem(last=False)
    return model, tokenizer


def _tokenizer(base_model: Path, auto: Any) -> Any:
    """The base's tokenizer, read again only when its files change."""
    key = _files_stamp(base_model)
    with _LOADED_LOCK:
        if _TOKENIZER and _TOKENIZER[0] == key:
            return _TOKENIZER[1]
    tokenizer = auto.from_pretrained(base_model)
    with _LOADED_LOCK:
        _TOKENIZER[:] = [key, tokenizer]
    return tokenizer


def _load_key(base_model: Path, kind: str, path: Path | None) -> tuple[Any, ...] | None:
    """What a loaded model is the same for: the base's files, and an adapter's bytes; None for
    a checkpoint (whole models are not kept)."""
    if kind == "base":
        return (kind, *_files_stamp(base_model))
    if kind == "adapter" and path is not None and path.is_dir():
        digest = hashlib.sha256()
        for f in sorted(path.iterdir()):
            if f.is_file():
                digest.update(f.name.encode() + b"\0" + f.read_bytes())
        return (kind, *_files_stamp(base_model), digest.hexdigest())
    return None


def _files_stamp(path: Path) -> tuple[Any, ...]:
    """A directory's path with its files' modification times (a hub id: the id alone)."""
    resolved = path.resolve()
    if not resolved.is_dir():
        return (str(path),)
    return (
        str(resolved),
        *(f.stat().st_mtime_ns for f in sorted(resolved.iterdir()) if f.is_file()),
    )


def replay_samples(rows: Sequence[dict[str, Any]], threshold: float) -> list[EvalSample]:
    """Held-out "scored" rows as replay samples (rows of other kinds are skipped)."""
    out = []
    for row in rows:
        if "completion" not in row or "score" not in row:
            continue
        fixed = correction(row.get("feedback"))
        answer, sign = (fixed, 1.0) if fixed else (row["completion"], 0.0)
        if not fixed:
            sign = 1.0 if row["score"] >= threshold else -1.0
        out.append(EvalSample(row["sample_id"], json.loads(row["messages"]), answer, sign))
    return out


def task_samples(path: Path) -> list[EvalSample]:
    """A JSONL task set: each line {"messages": [...], "id"?, ...other columns for the scorer}."""
    from reef.recipes.harness.episodes import task_set

    return [EvalSample(t.task_id, t.messages, columns=t.columns) for t in task_set(path)]


# Answers scored in one forward pass (replay): on the CPU a batch of short sequences costs
# little more than one of them, so the gate's pool (up to gate.pool_max samples, for the head
# and the candidate) is read in a few passes instead of one per sample.
REPLAY_BATCH = 16


@torch.inference_mode()
def answer_logprobs(
    model: Any, tokenizer: Any, items: Sequence[tuple[list[dict[str, Any]], str]]
) -> list[float]:
    """Per (messages, answer): the mean log-prob per token of `answer` (and the end of turn) as
    the assistant's reply to `messages`, REPLAY_BATCH at a time, with the vocabulary
    projection and its softmax computed only where answer tokens are predicted (the prompt's
    positions are most of a sequence, and the projection onto 49k tokens a fifth of the model's
    work). The tokens every sequence of a batch starts with (the chat template's system
    prompt and turn markers: a third to a half of a short exchange) are read once and their
    keys and values shared by the batch. The rest is padded on the left, after that prefix,
    with an attention mask and each token's own position, so each token sees what it sees
    alone at the position it has alone (the same numbers, to float rounding); every answer
    then ends at the last position."""
    encoded = encode_answers(tokenizer, items)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    out: list[float] = []
    for lo in range(0, len(encoded), REPLAY_BATCH):
        cores.adapt()  # reef.train_threads for this batch (auto: the cores left idle)
        part = encoded[lo : lo + REPLAY_BATCH]
        shared = shared_prefix(part)
        keep = max(1, max(n for _, n in part) + 1)
        logits = _batch_logits(model, [ids for ids, _ in part], shared, pad, keep)
        logp = torch.log_softmax(logits[:, :-1], dim=-1)  # predicts the last keep-1 tokens
        for row, (ids, n) in enumerate(part):
            if n <= 0:
                out.append(0.0)
                continue
            target = torch.tensor(ids[-n:])
            token_lp = logp[row, -n:].gather(1, target.unsqueeze(1)).squeeze(1)
            out.append(float(token_lp.mean()))
    return out


def encode_answers(
    tokenizer: Any, items: Sequence[tuple[list[dict[str, Any]], str]]
) -> list[tuple[list[int], int]]:
    """Per (messages, answer): the token ids of the prompt, answer and end of turn, and how many
    of them are the answer's."""
    encoded = []
    for messages, answer in items:
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        full = prompt + answer + (tokenizer.eos_token or "")
        p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        ids = tokenizer(full, add_special_tokens=False)["input_ids"]
        encoded.append((ids, len(ids) - len(p_ids)))
    return encoded


def shared_prefix(part: Sequence[tuple[list[int], int]]) -> int:
    """How many leading tokens every sequence of the batch has in common (recipes.shared_prefix),
    leaving each at least its prompt's last token (whose logits predict the answer's first) to
    read with the batch."""
    limit = min(len(ids) - max(n, 0) - 1 for ids, n in part)
    return common_prefix([ids for ids, _ in part], limit)


def _batch_logits(model: Any, seqs: list[list[int]], shared: int, pad: int, keep: int) -> Any:
    """The logits of the last `keep` positions of each sequence: the first `shared` tokens
    (the same in every one) read once, their keys and values repeated for the batch."""
    rests = [ids[shared:] for ids in seqs]
    width = max(len(r) for r in rests)
    input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rests])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rests])
    positions = (mask.cumsum(-1) - 1).clamp(min=0) + shared
    past = None
    if shared:
        past = repeated_cache(model, seqs[0][:shared], len(seqs))
        mask = torch.cat([torch.ones(len(seqs), shared, dtype=mask.dtype), mask], dim=1)
    return _last_logits(model, input_ids, mask, positions, keep, past)


def _last_logits(
    model: Any, input_ids: Any, mask: Any, positions: Any, keep: int, past: Any = None
) -> Any:
    """The logits of the last `keep` positions; a model whose forward does not take
    `logits_to_keep` computes them all, then they are cut (the same numbers, more work)."""
    extra = {"cache": past, "use_cache": True} if past is not None else {}
    try:
        out = model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            logits_to_keep=keep,
            **extra,
        )
    except TypeError:
        out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, **extra)
    return out.logits[:, -keep:].float()


def replay_scores(model: Any, tokenizer: Any, samples: Sequence[EvalSample]) -> list[float]:
    """Per sample: sign × (mean log-prob of its answer − the model's center).

    With both rewarded and unrewarded answers held out, the center is the midpoint of the two
    groups' mean log-probs, so a candidate that merely made every answer likelier (training on
    anything does that) gains nothing, whatever the balance of the groups: the paired
    difference averages to (gain on rewarded − gain on unrewarded) / 2. With one group only,
    the center is 0 and a gain on the wanted answers is the improvement.
    """
    return centered(replay_logprobs(model, tokenizer, samples), samples)


def replay_logprobs(model: Any, tokenizer: Any, samples: Sequence[EvalSample]) -> list[float]:
    """Each replay sample's answer's mean log-prob under `model` (answer_logprobs)."""
    items = []
    for s in samples:
        assert s.answer is not None
        items.append((s.messages, s.answer))
    return answer_logprobs(model, tokenizer, items)


def replay_key(sample: EvalSample) -> str:
    """What a replay sample's log-prob depends on besides the model: its prompt and answer."""
    body = json.dumps([sample.messages, sample.answer], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(body.encode()).hexdigest()


def centered(lps: Sequence[float], samples: Sequence[EvalSample]) -> list[float]:
    """replay_scores from the samples' log-probs (see there)."""
    pos = [lp for lp, s in zip(lps, samples, strict=True) if s.sign > 0]
    neg = [lp for lp, s in zip(lps, samples, strict=True) if s.sign < 0]
    center = (sum(pos) / len(pos) + sum(neg) / len(neg)) / 2 if pos and neg else 0.0
    return [s.sign * (lp - center) for lp, s in zip(lps, samples, strict=True)]


@torch.inference_mode()
def generate(model: Any, tokenizer: Any, messages: list[dict[str, Any]], max_tokens: int) -> str:
    """A greedy answer (what the gate compares: no sampling noise between the two models)."""
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")
    cores.adapt()
    out = model.generate(
        **ids,
        max_new_tokens=max_tokens,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
    )
    return str(tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True))


def task_scores(
    model: Any, tokenizer: Any, samples: Sequence[EvalSample], scorer: Scorer, max_tokens: int
) -> tuple[list[float], list[str]]:
    """Per sample: the scorer's score of the model's greedy answer; also the answers."""
    answers = [generate(model, tokenizer, s.messages, max_tokens) for s in samples]
    columns: dict[str, list[Any]] = {"prompts": [s.messages for s in samples]}
    for key in sorted({k for s in samples for k in (s.columns or {})}):
        columns[key] = [(s.columns or {}).get(key) for s in samples]
    scores = [float(x) for x in scorer(answers, **columns)]
    if len(scores) != len(samples) or not all(math.isfinite(x) for x in scores):
        raise ValueError(f"the scorer must return one finite float per answer, got {scores!r}")
    return scores, answers
