"""Reading the tokens every sequence of a batch starts with once, in evaluation and training.

Short exchanges with a chat model are mostly its template: SmolLM2's default system prompt and
turn markers are 30 of the ~50 tokens of a question and a short answer, and an agent's traffic
repeats its own long system prompt in every call. A batch of such sequences is read here with
the shared prefix read once and its keys and values repeated for every sequence of the batch
(transformers' `Cache.batch_repeat_interleave`); the rest of each sequence then attends to them
as it would to its own copy, at the positions it has alone. The numbers are those of reading
each sequence whole, to float rounding. In training the gradient flows back through the
repeated keys and values, summed over the batch, as it would through each sequence's copy.

Measured by bench/shared_prefix.py on SmolLM2-135M, 2 cores (Intel Xeon), three alternated
pairs: the gate's replay of 32 short exchanges 0.63x the time (log-probs within 3e-5), four
SFT LoRA steps on 8 corrections 0.84x (the loss within 4e-7), a TTT-Discover step on a 2 x 4
grid 0.52x (loss and KL within 3e-7).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

# A shared prefix shorter than this is read with each sequence: a separate pass costs more.
MIN_SHARED = 4


def common_prefix(seqs: Sequence[Sequence[int]], limit: int) -> int:
    """How many leading tokens every sequence has in common, at most `limit`; 0 when fewer
    than MIN_SHARED (not worth a pass of their own)."""
    first = seqs[0]
    shared = 0
    while shared < limit and all(s[shared] == first[shared] for s in seqs):
        shared += 1
    return shared if shared >= MIN_SHARED else 0


def repeated_cache(forward: Any, prefix: list[int], batch: int) -> Any:
    """The keys and values of `prefix`, read once by `forward` (a causal LM's forward) and
    repeated for `batch` sequences."""
    ids = torch.tensor([prefix])
    try:
        out = forward(input_ids=ids, use_cache=True, logits_to_keep=1)
    except TypeError:  # a forward without `logits_to_keep`: every position's logits, unused
        out = forward(input_ids=ids, use_cache=True)
    cache = out.cache
    cache.batch_repeat_interleave(batch)
    return cache


@contextmanager
def shared_prefix_training(model: Any) -> Iterator[bool]:
    """While inside, each training forward of `model` (a TRL trainer's: keyword arguments,
    right-padded `input_ids` with `attention_mask` and `labels`) reads the tokens its batch's
    sequences start with, up to the first one any of them learns, once. Yields whether it is
    on: not for a model with active dropout (the shared tokens would share one mask, where
    each sequence draws its own)."""
    if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()):
        yield False
        return
    original = model.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        shared = 0 if args else _trainable_prefix(kwargs)
        if not shared:
            return original(*args, **kwargs)
        # the attention mask stays whole: it covers the shared tokens' keys and the rest's
        ids, labels = kwargs.pop("input_ids"), kwargs.pop("labels")
        rest = ids[:, shared:]
        kwargs["position_ids"] = torch.arange(shared, ids.shape[1]).expand(len(ids), -1)
        cache = repeated_cache(original, ids[0, :shared].tolist(), len(ids))
        return original(input_ids=rest, labels=labels[:, shared:], cache=cache, **kwargs)

    model.forward = forward
    try:
        yield True
    finally:
        del model.forward  # the class's own again


def _trainable_prefix(kwargs: dict[str, Any]) -> int:
    """The tokens a training batch may read once: the same in every sequence, none of them
    padding, none a label (the token after the prefix must not be one either: it is predicted
    from the prefix's last position, which the split pass does not score)."""
    ids, mask, labels = kwargs.get("input_ids"), kwargs.get("attention_mask"), kwargs.get("labels")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or len(ids) < 2:
        return 0
    if mask is None or labels is None or mask.shape != ids.shape or labels.shape != ids.shape:
        return 0
    if any(kwargs.get(k) is not None for k in ("position_ids", "inputs_embeds", "shift_labels")):
        return 0
    if any(kwargs.get(k) is not None for k in ("cache", "past_key_values")):
        return 0
    real = mask.bool().all(0)  # positions that are a token in every sequence
    unlabelled = (labels == -100).all(0)
    same = (ids == ids[0]).all(0)
    ok = (real & same & unlabelled).tolist()
    # the prefix ends before the first position that fails, and before a labelled next token
    limit = next((i for i, good in enumerate(ok) if not good), len(ok)) - 1
    return limit if limit >= MIN_SHARED else 0


def response_logprobs_after(
    model: Any, prompt: list[int], completions: Sequence[Sequence[int]]
) -> list[torch.Tensor]:
    """log π(y_t | x, y_<t) for every token of each completion after the same `prompt`,
    teacher-forced: the prompt (all but its last token, whose logits predict each completion's
    first) read once, the completions in one right-padded batch after it. One 1-D tensor per
    completion, in order, with the gradient when it is on: the same values as reading each
    prompt + completion alone (recipes.sao.learner.response_logprobs), to float rounding."""
    if not completions:
        return []
    shared = len(prompt) - 1 if len(prompt) - 1 >= MIN_SHARED else 0
    rests = [[*prompt[shared:], *c] for c in completions]
    width = max(len(r) for r in rests)
    input_ids = torch.tensor([r + [0] * (width - len(r)) for r in rests])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rests])
    positions = torch.arange(shared, shared + width).expand(len(rests), -1)
    extra: dict[str, Any] = {}
    if shared:
        extra = {"cache": repeated_cache(model, prompt[:shared], len(rests)), "use_cache": True}
        mask = torch.cat([torch.ones(len(rests), shared, dtype=mask.dtype), mask], dim=1)
    before = len(prompt) - shared - 1  # the rest's position whose logits predict token 0
    keep = width - before
    logits = model(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=positions,
        logits_to_keep=keep,
        **extra,
    ).logits
    out = []
    for row, c in enumerate(completions):
        lg = logits[row, : len(c)].float()
        targets = torch.tensor(list(c))
        picked = lg.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        out.append(picked - torch.logsumexp(lg, dim=-1))
    return out
