"""The likelihood judge (reef.verdicts): one pass of a real model over a reaction, a verdict with
a confidence and never a void vote; its probe; the seed labels it ships with."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from reef.judge import Exchange
from reef.models import resolve_model
from reef.verdicts import (
    LABELS,
    LikelihoodJudge,
    Probe,
    Reader,
    reaction_line,
    seed_labels,
)

CACHE = Path(os.environ.get("REEF_MODEL_CACHE", Path.home() / ".cache/reef/models"))


@pytest.fixture(scope="module")
def reader() -> Reader:
    return Reader(resolve_model("tiny", CACHE))


def _exchange(role: str, text: str) -> Exchange:
    return Exchange(
        messages=({"role": "user", "content": "What is Rust?"},),
        reply="Rust is a systems programming language focused on safety.",
        next_role=role,
        next_text=text,
    )


def test_the_seed_labels_ship_with_every_verdict() -> None:
    seed = seed_labels()
    assert len(seed) >= 100
    assert {s.label for s in seed} == {1, -1, 0}
    assert {s.role for s in seed} == {"user", "tool"}


def test_a_probe_learns_labelled_rows_and_refuses_a_missing_verdict() -> None:
    rng = np.random.default_rng(0)
    centers = {1: np.array([3.0, 0.0]), -1: np.array([-3.0, 0.0]), 0: np.array([0.0, 3.0])}
    labels = [1, -1, 0] * 30
    x = np.stack([centers[v] + rng.normal(0, 0.5, 2) for v in labels])
    probe = Probe().fit(x, labels)
    p = probe.proba(np.array([[3.0, 0.0], [-3.0, 0.0], [0.0, 3.0]]))
    assert p.shape == (3, len(LABELS))
    # rows follow LABELS' order: good, bad, unclear
    assert [int(np.argmax(row)) for row in p] == [0, 1, 2]
    assert np.allclose(p.sum(axis=1), 1.0)
    with pytest.raises(ValueError, match="every verdict"):
        Probe().fit(x[:60], [1, -1] * 30)


def test_a_reaction_is_read_once_with_no_void_vote(reader: Reader) -> None:
    judge = LikelihoodJudge(reader, "likelihood:tiny")
    j = judge.judge(_exchange("user", "Thanks, that helped."))
    assert j.method == "likelihood" and j.judge == "likelihood:tiny"
    assert not j.void and j.verdict in (1, -1, 0) and j.score == j.verdict
    assert 1 / 3 <= j.confidence <= 1.0
    # only the reaction's own tokens are read per turn: the fixed examples are read once
    assert (
        0
        < j.tokens
        == len(reader.tokenizer(reaction_line("user", "Thanks, that helped.")).input_ids)
    )
    assert "likelihood" in j.raw


def test_a_probe_on_the_seed_labels_gives_their_verdicts_and_a_complaint_is_its_own_hint(
    reader: Reader,
) -> None:
    judge = LikelihoodJudge(reader, "likelihood:tiny")
    seed = seed_labels()
    judge.fit(seed)
    complaint = next(s for s in seed if s.label == -1 and s.role == "user" and len(s.text) > 20)
    j = judge.judge(_exchange("user", complaint.text))
    assert j.verdict == -1 and j.score == -1
    assert j.hints == (complaint.text,)
    thanks = next(s for s in seed if s.label == 1 and s.role == "user")
    j = judge.judge(_exchange("user", thanks.text))
    assert j.verdict == 1 and j.hints == ()
    tool_error = next(s for s in seed if s.label == -1 and s.role == "tool")
    j = judge.judge(_exchange("tool", tool_error.text))
    assert j.verdict == -1 and j.hints == ()  # a tool's output is no instruction to follow


def test_a_verdict_below_min_confidence_is_kept_but_scores_nothing(reader: Reader) -> None:
    judge = LikelihoodJudge(reader, "likelihood:tiny", min_confidence=1.0)
    judge.fit(seed_labels())
    j = judge.judge(_exchange("user", "No, that is wrong, Rust is not a database."))
    assert j.confidence < 1.0
    assert j.verdict in (1, -1, 0) and j.score == 0 and j.hints == ()
    assert not j.trains


def test_reading_many_at_once_equals_reading_one_by_one(reader: Reader) -> None:
    reactions = [(s.role, s.text) for s in seed_labels()[:7]] + [("user", "x" * 2000)]
    many = reader.read_many(reactions, batch=3)
    for (role, text), got in zip(reactions, many, strict=True):
        one = reader.read(role, text)
        assert got.tokens == one.tokens
        assert np.allclose(got.features(), one.features(), atol=1e-4)


def test_readings_are_kept_for_the_next_reader_in_the_cache_dir(tmp_path: Path) -> None:
    model = resolve_model("tiny", CACHE)
    pairs = [(s.role, s.text) for s in seed_labels()[:6]]
    first = Reader(model, cache_dir=tmp_path).features(pairs)
    (cached,) = tmp_path.glob("*.npz")
    written = cached.stat().st_mtime_ns
    again = Reader(model, cache_dir=tmp_path).features(pairs)
    assert np.array_equal(first, again)
    assert cached.stat().st_mtime_ns == written  # nothing new was read, nothing written
    cached.write_bytes(b"not a cache")  # a broken cache is read again, not trusted
    assert np.allclose(Reader(model, cache_dir=tmp_path).features(pairs), first, atol=1e-4)
