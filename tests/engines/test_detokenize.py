"""Incremental detokenization with the tiny model's byte-level tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from reef.engines.detokenize import REPLACEMENT, Detokenizer, TokenText

TEXT = "Café 🙂 東京 — the capital of France is Paris."


@pytest.fixture(scope="module")
def tok(tiny_dir: Path):
    return AutoTokenizer.from_pretrained(tiny_dir)


def feed(tok, text: str, stop: tuple[str, ...] = ()) -> tuple[list[str], Detokenizer]:
    detok = Detokenizer(tok, stop)
    pieces = []
    for token_id in tok.encode(text, add_special_tokens=False):
        pieces.append(detok.add(token_id))
        if detok.stopped:
            break
    else:
        pieces.append(detok.finish())
    return pieces, detok


def test_pieces_are_whole_characters(tok) -> None:
    ids = tok.encode("🙂", add_special_tokens=False)
    assert len(ids) > 1  # the emoji's four bytes span several tokens: the case under test
    pieces, _ = feed(tok, TEXT)
    assert "".join(pieces) == TEXT
    assert not any(REPLACEMENT in p for p in pieces)


def test_a_stop_string_is_cut_and_never_leaks(tok) -> None:
    pieces, detok = feed(tok, TEXT, stop=("capital of F",))
    assert detok.stopped
    assert "".join(pieces) == "Café 🙂 東京 — the "
    assert not any("cap" in p for p in pieces)


def test_a_partial_stop_match_is_released(tok) -> None:
    # "capital of G" starts like the text, then differs: the held text must come out.
    pieces, detok = feed(tok, TEXT, stop=("capital of G", "Parisian"))
    assert not detok.stopped
    assert "".join(pieces) == TEXT


def test_the_earliest_stop_wins(tok) -> None:
    pieces, _ = feed(tok, TEXT, stop=("Paris", "the"))
    assert "".join(pieces) == "Café 🙂 東京 — "


def test_an_incomplete_character_is_flushed_at_the_end(tok) -> None:
    ids = tok.encode("🙂", add_special_tokens=False)
    detok = Detokenizer(tok)
    assert [detok.add(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.finish() == tok.decode(ids[:-1])  # what decoding the ids gives: a U+FFFD


def test_token_text_has_the_exact_bytes(tok) -> None:
    text = TokenText(tok)
    ids = tok.encode("🙂", add_special_tokens=False)
    assert b"".join(bytes(text(i)[1]) for i in ids) == "🙂".encode()
    assert text(tok.eos_token_id) == ("<|im_end|>", list(b"<|im_end|>"))
