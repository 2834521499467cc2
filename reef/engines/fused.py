"""One forward pass that advances the running batch by a token and reads a chunk of a prompt.

Why: with chunked prefill and separate passes, every chunk costs the running rows a whole
extra forward pass — it reads every weight again, and a decode step of a small model on a CPU
is mostly that. Fused, a chunk lengthens the running rows' gap by what its tokens add to the
matrix products, not by a second pass (SmolLM2-135M, 8 streams, one thread, a 1,500-token
prompt in chunks of 16: their inter-token latency p50 79 ms fused against 103 ms apart, 43 ms
without the prompt; README, "Fused prefill"). vLLM schedules this way (decode tokens and
prefill chunks in one batch of tokens).

How: the decode rows' newest tokens and the chunk's tokens go through the model as one
sequence [1, rows + chunk rows x columns], so every layer's projections and MLP run once over
all of them. Only attention must keep them apart: the `_Split` cache puts each layer's new
keys and values into the two caches they belong to (the running `Batch`'s and the `Prefill`'s),
and the `reef_split` attention implementation lets each part's queries attend to its own cache
under the mask its own pass would have used, through transformers' SDPA attention. Each part
computes what its separate pass computes (the same keys, values, positions and masks), up to
the rounding of matrix products over more rows.

The implementation is set on the model's config only for the fused call (the scheduler thread
owns the model); `supported` checks once per model that a fused pass gives what the separate
passes give, so a model whose layers do not route keys and values through the cache this way
keeps separate passes.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from reef.engines.batch import Batch, Chunk, Prefill

log = logging.getLogger(__name__)

IMPLEMENTATION = "reef_split"


class _Split:
    """The cache a fused pass gives the model: the first `rows` tokens of the sequence are the
    running batch's (one per row), the rest the chunk's ([chunk rows, columns] flattened)."""

    def __init__(self, rows: int, decode: Batch, chunk: Chunk, decode_mask: torch.Tensor):
        self.rows = rows
        self.chunk_rows, self.columns = (int(n) for n in chunk.input_ids.shape)
        self.decode_cache = decode.cache
        self.chunk_cache = chunk.cache
        # SDPA's boolean masks (True: attend): [rows, 1, 1, cols + 1] for the decode rows;
        # [chunk rows, 1, columns, read + columns] for the chunk: its real columns, causally.
        self.decode_mask = decode_mask.bool()[:, None, None, :]
        width = int(chunk.mask.shape[1])
        offset = width - self.columns
        causal = torch.arange(width)[None, :] <= (offset + torch.arange(self.columns))[:, None]
        self.chunk_mask = chunk.mask.bool()[:, None, None, :] & causal[None, None]
        self.layers: dict[int, tuple[torch.Tensor, ...]] = {}

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        *_: Any,
        **__: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = key_states[0], value_states[0]  # [heads, tokens, dim]
        dk, dv = self.decode_cache.update(
            self.decode_part(keys), self.decode_part(values), layer_idx
        )
        ck, cv = self.chunk_cache.update(self.chunk_part(keys), self.chunk_part(values), layer_idx)
        self.layers[layer_idx] = (dk, dv, ck, cv)
        return key_states, value_states

    def decode_part(self, states: torch.Tensor) -> torch.Tensor:
        """[heads, tokens, dim] -> the decode rows' [rows, heads, 1, dim]."""
        return states[:, : self.rows].transpose(0, 1).unsqueeze(2)

    def chunk_part(self, states: torch.Tensor) -> torch.Tensor:
        """[heads, tokens, dim] -> the chunk's [chunk rows, heads, columns, dim]."""
        heads, _, dim = states.shape
        part = states[:, self.rows :].reshape(heads, self.chunk_rows, self.columns, dim)
        return part.transpose(0, 1)


def _split_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    reef_split: _Split | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention over a fused pass's sequence: each part over its own cache. Without a split
    (a call that is not a fused pass) it is plain SDPA attention."""
    if reef_split is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    split = reef_split
    dk, dv, ck, cv = split.layers[module.layer_idx]  # type: ignore[index]
    q = query[0]  # [heads, tokens, dim]
    decoded, _ = sdpa_attention_forward(
        module, split.decode_part(q), dk, dv, split.decode_mask, scaling=scaling
    )  # [rows, 1, heads, dim]
    chunk, _ = sdpa_attention_forward(
        module, split.chunk_part(q), ck, cv, split.chunk_mask, scaling=scaling
    )  # [chunk rows, columns, heads, dim]
    return torch.cat([decoded.flatten(0, 1), chunk.flatten(0, 1)]).unsqueeze(0), None


AttentionInterface.register(IMPLEMENTATION, _split_attention)


def step(
    model: torch.nn.Module, batch: Batch, tokens: list[int], prefill: Prefill, columns: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Feed each row of `batch` its newest token and read the next `columns` columns of
    `prefill`, in one forward pass. Returns the batch's next-token logits [rows, vocab] and,
    once the prompts are read to their end, theirs [prompt rows, vocab] (else None).

    As with separate passes, both caches grow in place layer by layer: after a failed pass
    both the batch and the prefill are unusable."""
    rows = len(batch)
    decode_mask = batch.next_mask()
    chunk = prefill.next_chunk(columns)
    split = _Split(rows, batch, chunk, decode_mask)
    input_ids = torch.cat([torch.tensor(tokens, dtype=torch.long), chunk.input_ids.flatten()])
    positions = torch.cat([batch.lengths, chunk.positions.flatten()])
    last = chunk.end == int(prefill.mask.shape[1])
    keep = torch.arange(rows)
    if last:  # the next-token logits of each prompt row: its last column
        keep = torch.cat([keep, rows + torch.arange(1, split.chunk_rows + 1) * split.columns - 1])
    config: Any = model.config
    before = config._attn_implementation
    config._attn_implementation = IMPLEMENTATION
    try:
        out = model(
            input_ids=input_ids.unsqueeze(0),
            position_ids=positions.unsqueeze(0),
            cache=split,
            use_cache=True,
            logits_to_keep=keep,
            reef_split=split,
        )
    finally:
        config._attn_implementation = before
    logits = out.logits[0]
    batch.stepped(batch.cache, decode_mask)
    done = prefill.took(chunk, chunk.cache)
    assert done == last
    return logits[:rows], (logits[rows:] if done else None)


def supported(model: torch.nn.Module, pad_id: int) -> bool:
    """Whether a fused pass over `model` gives what separate passes give: two rows decoding a
    token while two padded prompts are read in two chunks, compared logit for logit."""
    config: Any = getattr(model, "config", None)
    if (
        config is None
        or getattr(config, "sliding_window", None)
        or getattr(config, "use_sliding_window", False)
    ):
        return False  # the split masks know no sliding window
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    if vocab < 4:
        return False
    gen = torch.Generator().manual_seed(0)

    def ids(n: int) -> list[int]:
        return torch.randint(1, vocab, (n,), generator=gen).tolist()

    running, prompts = [ids(5), ids(3)], [ids(6), ids(4)]
    try:
        with torch.inference_mode():
            results = []
            for fuse in (False, True):
                batch, first = Batch.prefill(model, running, pad_id)
                tokens = first.argmax(-1).tolist()
                prefill = Prefill(prompts, pad_id)
                if fuse:
                    d1, p1 = step(model, batch, tokens, prefill, 3)
                    d2, p2 = step(model, batch, d1.argmax(-1).tolist(), prefill, 3)
                else:
                    d1, p1 = batch.step(model, tokens), prefill.step(model, 3)
                    d2 = batch.step(model, d1.argmax(-1).tolist())
                    p2 = prefill.step(model, 3)
                assert p1 is None and p2 is not None
                results.append(torch.cat([d1, d2, p2]))
    except Exception as exc:  # any model whose layers do not work this way
        log.info("embedded engine: fused prefill unsupported for this model (%r)", exc)
        return False
    agree = torch.allclose(results[0], results[1], rtol=1e-3, atol=1e-3)
    if not agree:
        log.info("embedded engine: fused prefill disagrees with separate passes; not used")
    return agree
