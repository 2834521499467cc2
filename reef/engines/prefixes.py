"""The embedded engine's prefix cache: keys and values of prompts already read, reused by later
prompts that start with the same tokens.

Every request of a scenario repeats the same opening (its system prompt, the harness's
injected instructions and tools); reading it again for each request is most of a short
request's prefill. A key or value at position t depends only on the tokens up to t, so the
columns a prompt left for its first n tokens are what any prompt starting with those n tokens
would compute there (up to the rounding of matrix products of other shapes).

Prompts are matched in blocks of `BLOCK` tokens, each block's hash chained on the one before
(as vLLM's prefix caching does), so a lookup hashes the new prompt once and finds the longest
cached opening it shares, over every stored prompt. Entries are per variant (an adapter's keys
and values differ from the base model's), least recently used first out past a byte budget.
Used by the scheduler thread only.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch

BLOCK = 16  # tokens per hashed block: shorter shared openings are not worth a lookup

# Who computed an entry: the weights module's id and the adapter key (None: the plain weights).
VariantKey = tuple[int, str | None]


@dataclass(eq=False)
class _Entry:
    """One prompt's keys and values per layer, [1, heads, tokens, dim]."""

    variant: VariantKey
    tokens: list[int]  # the token ids the keys and values are of
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    hashes: list[int] = field(default_factory=list)  # of its first 1, 2, ... blocks
    nbytes: int = 0


@dataclass(frozen=True)
class Hit:
    """A cached opening of a prompt: its first `tokens` tokens' keys and values per layer."""

    entry_id: int
    tokens: int
    layers: list[tuple[torch.Tensor, torch.Tensor]]


class PrefixCache:
    """Keys and values of recent prompts, at most `max_bytes` of them."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.hits = 0  # lookups that found an opening
        self.tokens_reused = 0
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # by id, oldest use first
        self._by_hash: dict[tuple[VariantKey, int], _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, variant: VariantKey, prompt: list[int]) -> Hit | None:
        """The longest cached opening of `prompt` (whole blocks, and never the whole prompt:
        its last token must still be read to give the next token's logits)."""
        best: tuple[_Entry, int] | None = None
        for blocks, h in enumerate(_chain(prompt[: len(prompt) - 1]), start=1):
            entry = self._by_hash.get((variant, h))
            if entry is None:
                break
            best = (entry, blocks)
        if best is None:
            return None
        entry, blocks = best
        tokens = blocks * BLOCK
        if entry.tokens[:tokens] != prompt[:tokens]:  # a hash collision: never a wrong answer
            return None
        self._entries.move_to_end(id(entry))
        self.hits += 1
        self.tokens_reused += tokens
        return Hit(
            id(entry), tokens, [(k[:, :, :tokens], v[:, :, :tokens]) for k, v in entry.layers]
        )

    def wants(self, variant: VariantKey, prompt: list[int]) -> bool:
        """Whether `store` would keep anything of `prompt` (a whole block not cached yet)."""
        return any((variant, h) not in self._by_hash for h in _chain(prompt))

    def store(
        self,
        variant: VariantKey,
        prompt: list[int],
        layers: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> None:
        """Keep `prompt`'s keys and values ([1, heads, len(prompt), dim] per layer, copied
        here) for the whole blocks it has, unless every one of them is cached already."""
        hashes = _chain(prompt)
        if not hashes or all((variant, h) in self._by_hash for h in hashes):
            return
        tokens = len(hashes) * BLOCK
        kept = [(k[:, :, :tokens].clone(), v[:, :, :tokens].clone()) for k, v in layers]
        nbytes = sum(k.nbytes + v.nbytes for k, v in kept)
        if nbytes > self.max_bytes:
            return
        entry = _Entry(variant, prompt[:tokens], kept, hashes, nbytes)
        self._entries[id(entry)] = entry
        self.nbytes += nbytes
        for h in hashes:  # the newest entry answers for every opening it has
            self._by_hash[(variant, h)] = entry
        while self.nbytes > self.max_bytes:
            self._evict(next(iter(self._entries.values())))

    def forget(self, variant: VariantKey) -> None:
        """Drop every entry computed by `variant` (it is being unloaded)."""
        for entry in [e for e in self._entries.values() if e.variant == variant]:
            self._evict(entry)

    def _evict(self, entry: _Entry) -> None:
        del self._entries[id(entry)]
        self.nbytes -= entry.nbytes
        for h in entry.hashes:
            if self._by_hash.get((entry.variant, h)) is entry:
                del self._by_hash[(entry.variant, h)]
                # An older entry with the same opening may still be cached: it answers again.
                for other in reversed(self._entries.values()):
                    if other.variant == entry.variant and h in other.hashes:
                        self._by_hash[(entry.variant, h)] = other
                        break


def _chain(tokens: list[int]) -> list[int]:
    """The chained hash of each whole block of `tokens`: the k-th names the first k blocks."""
    out: list[int] = []
    h = 0
    for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
        h = hash((h, tuple(tokens[start : start + BLOCK])))
        out.append(h)
    return out
