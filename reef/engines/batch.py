"""The running batch: sequences decoded together over one left-padded KV cache.

Rows are left-padded so every row's newest token sits in the last column and one forward
pass of shape [rows, 1] advances them all. Each row keeps its own length, which gives its
position ids (padding does not count), and the attention mask hides the padding. Rows can
join (a freshly prefilled batch is merged in: the shorter cache gets more left padding) and
leave (finished or cancelled rows are dropped, and columns that became padding in every row
are trimmed), which is what lets requests enter and exit between decode steps. New rows'
prompts are read by a `Prefill`, whole or a chunk of columns at a time, optionally on top of
keys and values a prefix cache kept of their opening.

Each layer's keys and values live in a buffer with room for more columns (`_RoomyLayer`): a
decode step writes its token into place. transformers' DynamicCache grows by `torch.cat`
instead, copying the whole cache of every layer at every step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

# Spare columns a layer's buffer is given when it is (re)allocated: the cache is copied once
# per ROOM decode steps rather than at each (and when rows join or leave, as before).
ROOM = 128


class Batch:
    """Rows in flight: their KV cache [rows, heads, cols, dim] per layer, mask [rows, cols], lengths."""

    def __init__(self, cache: DynamicCache, mask: torch.Tensor, lengths: torch.Tensor):
        self.cache = cache
        self.mask = mask
        self.lengths = lengths

    def __len__(self) -> int:
        return int(self.mask.shape[0])

    @property
    def columns(self) -> int:
        return int(self.mask.shape[1])

    @classmethod
    def prefill(
        cls, model: torch.nn.Module, prompts: list[list[int]], pad_id: int, **forward: Any
    ) -> tuple[Batch, torch.Tensor]:
        """Run the prompts through the model together; return the batch and next-token logits.

        `forward` goes to the model's forward as is (PEFT's `adapter_names`, one per row).
        """
        reading = Prefill(prompts, pad_id)
        logits = reading.step(model, reading.remaining, **forward)
        assert logits is not None and reading.batch is not None
        return reading.batch, logits

    def step(self, model: torch.nn.Module, tokens: list[int], **forward: Any) -> torch.Tensor:
        """Feed each row its newest token; return next-token logits [rows, vocab]."""
        mask = self.next_mask()
        out = model(
            input_ids=torch.tensor(tokens, dtype=torch.long).unsqueeze(1),
            attention_mask=mask,
            position_ids=self.lengths.unsqueeze(1),
            cache=self.cache,
            use_cache=True,
            **forward,
        )
        self.stepped(out.cache, mask)
        return out.logits[:, -1, :]

    def next_mask(self) -> torch.Tensor:
        """The attention mask [rows, cols + 1] of the next step: every row's new token counts."""
        return torch.cat([self.mask, torch.ones((len(self), 1), dtype=torch.long)], dim=1)

    def stepped(self, cache: DynamicCache, mask: torch.Tensor) -> None:
        """Take the state after a step fed each row one token (`mask`: its `next_mask`)."""
        # The cache grows in place layer by layer: after a failed pass the batch is unusable,
        # and the caller drops it with every row it held.
        self.cache, self.mask, self.lengths = cache, mask, self.lengths + 1

    def select(self, rows: list[int]) -> Batch | None:
        """Keep only `rows` (in that order); None when none are left."""
        if not rows:
            return None
        index = torch.tensor(rows, dtype=torch.long)
        mask = self.mask.index_select(0, index)
        # Columns that were padding for every remaining row (the dropped rows were longer).
        start = int((mask.sum(0) > 0).nonzero()[0])
        return Batch(
            _map_cache(self.cache, lambda t: t.index_select(0, index)[:, :, start:]),
            mask[:, start:],
            self.lengths.index_select(0, index),
        )

    def merge(self, other: Batch) -> Batch:
        """One batch with this one's rows first, then `other`'s, padded on the left to one width."""
        width = max(self.columns, other.columns)
        a_pad, b_pad = width - self.columns, width - other.columns
        layers = []
        for (ak, av, *_), (bk, bv, *_) in zip(self.cache, other.cache, strict=True):
            layers.append(
                (
                    torch.cat([_left_pad(ak, a_pad), _left_pad(bk, b_pad)], dim=0),
                    torch.cat([_left_pad(av, a_pad), _left_pad(bv, b_pad)], dim=0),
                )
            )
        mask = torch.cat(
            [
                torch.nn.functional.pad(self.mask, (a_pad, 0)),
                torch.nn.functional.pad(other.mask, (b_pad, 0)),
            ],
            dim=0,
        )
        return Batch(_cache(layers), mask, torch.cat([self.lengths, other.lengths]))


class Prefill:
    """Prompts read into a new batch a chunk of columns at a time (chunked prefill).

    The prompts are left-padded to one width up front; each `step` feeds the next columns of
    every row through the model on top of the cache the earlier steps left, which is what a
    single pass over the whole width computes (the same keys, values and positions), only
    split so that a long prompt does not hold the scheduler for its whole length: the running
    batch decodes between the steps.
    """

    def __init__(
        self,
        prompts: list[list[int]],
        pad_id: int,
        prefix: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ):
        """`prefix`: keys and values [1, heads, n, dim] per layer of n tokens that every
        prompt follows (a prefix cache hit); `prompts` are then what follows them, and the
        padding of the shorter ones sits between the prefix and their tokens, masked out."""
        width = max(len(p) for p in prompts)
        self.input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        self.mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, prompt in enumerate(prompts):
            self.input_ids[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            self.mask[i, width - len(prompt) :] = 1
        self.batch: Batch | None = None  # the columns read so far
        if prefix:
            rows, n = len(prompts), int(prefix[0][0].shape[-2])
            self.batch = Batch(
                _cache((k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in prefix),
                torch.ones((rows, n), dtype=torch.long),
                torch.full((rows,), n, dtype=torch.long),
            )
        self.read = 0

    def __len__(self) -> int:
        return int(self.mask.shape[0])

    @property
    def remaining(self) -> int:
        """Columns not read yet."""
        return int(self.mask.shape[1]) - self.read

    def step(self, model: torch.nn.Module, columns: int, **forward: Any) -> torch.Tensor | None:
        """Read the next `columns` columns (at least one); the next-token logits [rows, vocab]
        once the last column is read, else None. `forward` as in `Batch.prefill`."""
        chunk = self.next_chunk(columns)
        out = model(
            input_ids=chunk.input_ids,
            attention_mask=chunk.mask,
            position_ids=chunk.positions,
            cache=chunk.cache,
            use_cache=True,
            logits_to_keep=1,  # the prompt's other positions need no vocabulary projection
            **forward,
        )
        done = self.took(chunk, out.cache)
        return out.logits[:, -1, :] if done else None

    def next_chunk(self, columns: int) -> Chunk:
        """What a pass reading the next `columns` columns (at least one) feeds the model."""
        start = self.read
        end = min(start + max(1, columns), int(self.mask.shape[1]))
        new = self.mask[:, start:end]
        if self.batch is None:
            cache, mask, lengths = _cache([]), new, torch.zeros(len(self), dtype=torch.long)
        else:
            cache, lengths = self.batch.cache, self.batch.lengths
            mask = torch.cat([self.batch.mask, new], dim=1)
        # Padding does not count: a row's positions start at 0 on its first real token.
        positions = (lengths.unsqueeze(1) + new.cumsum(-1) - 1).clamp(min=0)
        return Chunk(self.input_ids[:, start:end], new, mask, positions, lengths, cache, end)

    def took(self, chunk: Chunk, cache: DynamicCache) -> bool:
        """Take the state after a pass read `chunk` into `cache`; True once the prompts are
        read to their end (the pass's logits at the last column are then the next token's)."""
        self.batch = Batch(cache, chunk.mask, chunk.lengths + chunk.new.sum(-1))
        self.read = chunk.end
        if self.remaining:
            # Room for the rest of the prompt now, rather than a copy of the cache per chunk.
            for layer in cache.layers:
                if isinstance(layer, _RoomyLayer):
                    layer.reserve(self.remaining + ROOM)
            return False
        return True


@dataclass(frozen=True)
class Chunk:
    """The columns one prefill pass reads: their tokens [rows, n], which of them are prompt
    (1) or padding (0) [rows, n], the attention mask over everything read with them
    [rows, read + n], their positions [rows, n], the rows' lengths before them, the cache they
    go on top of, and the column the prompts are read to after them."""

    input_ids: torch.Tensor
    new: torch.Tensor
    mask: torch.Tensor
    positions: torch.Tensor
    lengths: torch.Tensor
    cache: DynamicCache
    end: int


class _RoomyLayer(DynamicLayer):
    """A DynamicLayer whose keys and values [rows, heads, cols, dim] are views of buffers with
    spare columns on the right, where new tokens are written in place. The views hold the
    same values DynamicLayer's tensors would, so attention reads exactly what it read before."""

    _key_buffer: torch.Tensor | None = None
    _value_buffer: torch.Tensor | None = None

    def reserve(self, columns: int) -> None:
        """Make room for at least `columns` more columns after those in use."""
        used = self.get_seq_length()
        keys, values = self.keys, self.values
        if self._key_buffer is None or keys is None or values is None or not used:
            return
        if used + columns > self._key_buffer.shape[-2]:
            self._key_buffer = _roomy(keys, keys, used + columns)
            self._value_buffer = _roomy(values, values, used + columns)
            self.keys = self._key_buffer[:, :, :used]
            self.values = self._value_buffer[:, :, :used]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        used = self.get_seq_length()
        end = used + key_states.shape[-2]
        if (
            self._key_buffer is None
            or self._value_buffer is None
            or end > self._key_buffer.shape[-2]
        ):
            self._key_buffer = _roomy(self.keys if used else None, key_states, end + ROOM)
            self._value_buffer = _roomy(self.values if used else None, value_states, end + ROOM)
        self._key_buffer[:, :, used:end] = key_states
        self._value_buffer[:, :, used:end] = value_states
        self.keys = self._key_buffer[:, :, :end]
        self.values = self._value_buffer[:, :, :end]
        self.device, self.is_initialized = key_states.device, True
        return self.keys, self.values


def _roomy(old: torch.Tensor | None, like: torch.Tensor, columns: int) -> torch.Tensor:
    """A buffer of `columns` columns shaped and typed like `like`, starting with `old`'s."""
    rows, heads, _, dim = like.shape
    buffer = like.new_empty((rows, heads, columns, dim))
    if old is not None:
        buffer[:, :, : old.shape[-2]] = old
    return buffer


def _cache(layers: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    """A DynamicCache of `_RoomyLayer`s holding `layers`' keys and values (one per layer;
    none: layers are added as the model's forward pass fills them)."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = _RoomyLayer
    for i, (keys, values) in enumerate(layers):
        cache.update(keys, values, i)
    return cache


def _left_pad(states: torch.Tensor, n: int) -> torch.Tensor:
    """Zero columns in front of [rows, heads, cols, dim] states: masked out, and never NaN."""
    return torch.nn.functional.pad(states, (0, 0, n, 0)) if n else states


def _map_cache(cache: DynamicCache, fn: Callable[[torch.Tensor], torch.Tensor]) -> DynamicCache:
    return _cache((fn(k), fn(v)) for k, v, *_ in cache)
