"""Incremental detokenization: token ids in, text safe to stream out (whole characters, no stop strings)."""

from __future__ import annotations

from typing import Any

REPLACEMENT = "\ufffd"


class Detokenizer:
    """Turns one sequence's tokens into text as they arrive.

    Decoding token by token breaks both multi-byte characters (a byte-level token may hold
    half of one) and word boundaries (some tokenizers change a token's text by its left
    neighbour), so each step decodes a short window: the tokens since the last emitted text
    plus a few before them for context, and keeps the text only when it does not end in the
    replacement character. This is the prefix/read-offset scheme of vLLM and TGI.

    Stop strings: text that could still become the start of a stop string is held back, and
    when one appears the text is cut before it and `stopped` is set; held text never leaks.
    """

    def __init__(self, tokenizer: Any, stop: tuple[str, ...] = ()):
        self._tokenizer = tokenizer
        self._stop = stop
        self._ids: list[int] = []
        self._prefix = 0  # window start: context tokens already turned into text
        self._read = 0  # tokens before this index are in `text`
        self.text = ""  # decoded so far (whole characters)
        self._emitted = 0  # len of text already handed out
        self.stopped = False

    def add(self, token_id: int) -> str:
        """Take one token; return the text that may now be sent (possibly empty)."""
        if self.stopped:
            return ""
        self._ids.append(token_id)
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if len(after) > len(before) and not after.endswith(REPLACEMENT):
            self.text += after[len(before) :]
            self._prefix, self._read = self._read, len(self._ids)
        return self._release(final=False)

    def finish(self) -> str:
        """The sequence ended (EOS or length): flush what was held, an incomplete char included."""
        if self.stopped:
            return ""
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if len(after) > len(before):
            self.text += after[len(before) :]
        self._prefix = self._read = len(self._ids)
        return self._release(final=True)

    def _decode(self, ids: list[int]) -> str:
        if not ids:
            return ""
        return self._tokenizer.decode(
            ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
        )

    def _release(self, *, final: bool) -> str:
        end = len(self.text)
        if self._stop:
            # An occurrence can only start in text not yet handed out: anything that could have
            # begun one was held back when it arrived.
            cut = min(
                (i for s in self._stop if (i := self.text.find(s, self._emitted)) >= 0),
                default=-1,
            )
            if cut >= 0:
                self.text = self.text[:cut]
                self.stopped = True
                end = cut
            elif not final:
                end -= _held(self.text, self._stop, self._emitted)
        out = self.text[self._emitted : end]
        self._emitted = end
        return out


def _held(text: str, stops: tuple[str, ...], emitted: int) -> int:
    """Length of the longest tail of `text` (after `emitted`) that begins some stop string."""
    longest = min(max(len(s) for s in stops) - 1, len(text) - emitted)
    for n in range(longest, 0, -1):
        tail = text[-n:]
        if any(s.startswith(tail) for s in stops):
            return n
    return 0


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table mapping each byte to the printable character byte-level BPE stores it as."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_BYTE_OF_CHAR = {c: b for b, c in _bytes_to_unicode().items()}


class TokenText:
    """A token's text and exact bytes, as OpenAI's `logprobs.content[].token` / `.bytes` show them.

    A byte-level token may hold part of a UTF-8 character; its text then shows the replacement
    character but its bytes are the real ones, so a client can join bytes across tokens.
    """

    def __init__(self, tokenizer: Any):
        self._tokenizer = tokenizer
        self._special = set(tokenizer.all_special_ids)
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        self._byte_level = type(decoder).__name__ == "ByteLevel"
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is None:
            text = self._tokenizer.decode([token_id], clean_up_tokenization_spaces=False)
            data = text.encode("utf-8")
            if self._byte_level and token_id not in self._special:
                piece = self._tokenizer.convert_ids_to_tokens(token_id)
                if all(c in _BYTE_OF_CHAR for c in piece):
                    data = bytes(_BYTE_OF_CHAR[c] for c in piece)
            hit = self._cache[token_id] = (text, list(data))
        return hit
