"""Prompt chunks sized from measured round times (`engine.embedded.itl_target_ms`): the cost
model on its own, and the embedded engine reading a long prompt paced by it."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from reef.engines.pacing import FLOOR, Pacer
from reef.errors import ConfigError
from tests.engines.conftest import running_engine
from tests.engines.test_chunked_prefill import LONG, answers, body


def test_nothing_measured_reads_one_token() -> None:
    assert Pacer(0.06).budget(8) == 1


def test_a_prompt_token_is_first_priced_as_a_decoding_row() -> None:
    pacer = Pacer(0.060)
    for _ in range(5):
        pacer.observe(8, 0, 0.040)
    # 20 ms of room at 5 ms a token (40 ms over 8 rows).
    assert pacer.budget(8) == 4


def test_rounds_that_read_a_prompt_price_its_tokens() -> None:
    pacer = Pacer(0.060)
    pacer.observe(8, 0, 0.040)
    for _ in range(40):
        pacer.observe(8, 10, 0.050)  # 10 tokens added 10 ms
    assert pacer.per_token_s(8) == pytest.approx(0.001, rel=0.01)
    assert pacer.budget(8) == pytest.approx(20, abs=1)


def test_the_budget_is_capped_and_none_where_no_token_fits() -> None:
    pacer = Pacer(10.0, most=128)
    pacer.observe(4, 0, 0.040)
    assert pacer.budget(4) == 128
    slow = Pacer(0.010)
    slow.observe(4, 0, 0.040)  # a plain round already takes longer than the target
    assert slow.budget(4) == 0
    costly = Pacer(headroom=0.15)
    costly.observe(8, 0, 0.080)
    assert costly.budget(8) == 1  # 12 ms of room; a token first priced as a row's 10 ms
    costly.observe(8, 1, 0.096)  # one token cost 16 ms: the fused round's fixed cost
    assert costly.budget(8) == 0


def test_a_fast_round_does_not_make_the_next_chunk_unbounded() -> None:
    pacer = Pacer(0.060)
    pacer.observe(8, 0, 0.040)
    for _ in range(100):
        pacer.observe(8, 4, 0.030)  # faster than a plain round: noise
    # The floor: a twentieth of a decoding row's 5 ms, so 20 ms of room holds 80 tokens.
    assert pacer.per_token_s(8) == pytest.approx(FLOOR * 0.040 / 8)
    assert pacer.budget(8) == 80


def test_an_unseen_row_count_uses_the_nearest_measured() -> None:
    pacer = Pacer(0.060)
    pacer.observe(2, 0, 0.020)
    pacer.observe(8, 0, 0.040)
    # 7 rows: 8's plain round (40 ms), a token priced as one of 7 rows (5.7 ms): 20 ms of room.
    assert pacer.budget(7) == 3
    assert pacer.budget(1) == 2  # 2's round (20 ms), 20 ms a token: 40 ms of room
    pacer.observe(0, 0, 5.0)  # nothing decoded: says nothing about gaps
    assert pacer.budget(1) == 2


def test_on_a_noisy_machine_rounds_settle_within_the_target() -> None:
    """Rounds cost 40 ms + 3 ms a prompt token, ±10 % noise: after a few rounds the chunks sit
    where the target leaves room for ((60 - 40) / 3 ≈ 6 tokens) and the rounds within it."""
    rng = random.Random(0)
    pacer = Pacer(0.060, most=128)

    def round_s(tokens: int) -> float:
        return (0.040 + 0.003 * tokens) * rng.uniform(0.9, 1.1)

    for _ in range(8):  # plain decode rounds before the prompt arrives
        pacer.observe(8, 0, round_s(0))
    times, chunks = [], []
    for _ in range(200):
        chunk = pacer.budget(8)
        took = round_s(chunk)
        pacer.observe(8, chunk, took)
        times.append(took)
        chunks.append(chunk)
    settled = sorted(times[20:])
    assert settled[int(0.5 * len(settled))] <= 0.060
    assert settled[int(0.99 * len(settled))] <= 0.060 * 1.15
    assert 4 <= sorted(chunks[20:])[len(chunks[20:]) // 2] <= 7


def test_a_headroom_targets_a_share_over_a_plain_round() -> None:
    relative = Pacer(headroom=0.5)
    assert relative.target(8) == float("inf")  # nothing measured: nothing to go by
    relative.observe(8, 0, 0.040)
    relative.observe(2, 0, 0.020)
    assert relative.target(8) == pytest.approx(0.060)
    assert relative.budget(8) == 4  # 20 ms of room at 5 ms a token, as with a 60 ms target
    assert relative.target(2) == pytest.approx(0.030)  # each row count against its own round
    both = Pacer(0.050, headroom=0.5)
    both.observe(8, 0, 0.040)
    assert both.target(8) == pytest.approx(0.050)  # the tighter of the two
    assert both.budget(8) == 2


def test_a_round_that_read_a_prompt_before_any_plain_one_is_not_taken_as_decode() -> None:
    """The first paced round of a batch may read a prompt whole (one that fits a chunk): a
    312-token round of 8 rows took 1 s. Taken as a plain round, it made every later round's
    excess negative and held the per-token price at its floor, so chunks came out several times
    too large. Guessed as 320 rows' worth of decoding, it prices the tokens about right, and
    the first plain round replaces the guess."""
    rng = random.Random(0)
    pacer = Pacer(0.060, most=128)

    def round_s(tokens: int) -> float:
        return (0.040 + 0.003 * tokens) * rng.uniform(0.9, 1.1)

    pacer.observe(8, 312, round_s(312))
    assert pacer.per_token_s(8) == pytest.approx(0.003, rel=0.3)
    times = []
    for i in range(60):
        chunk = 0 if i % 10 == 5 else pacer.budget(8)  # a plain round now and then
        took = round_s(chunk)
        pacer.observe(8, chunk, took)
        if chunk:
            times.append(took)
    # The guess prices a row as a token, so the first chunk overshoots a little (a row costs
    # 5 ms here, a token 3); then the rounds keep within the target's noise.
    assert max(times[:2]) <= 0.060 * 1.3, times
    assert max(times[2:]) <= 0.060 * 1.15, times
    assert pacer.target(8) == 0.060
    assert 4 <= pacer.budget(8) <= 8


def test_a_target_must_be_positive() -> None:
    from reef.settings import load_settings

    for bad in ({"target_s": 0}, {"headroom": 0.0}, {"headroom": -0.1}, {}):
        with pytest.raises(ValueError):
            Pacer(**bad)  # type: ignore[arg-type]
    for key, value in (("itl_target_ms", -1), ("itl_headroom", 0), ("itl_max_wait_ms", -1)):
        with pytest.raises(ConfigError, match=rf"engine\.embedded\.{key}"):
            load_settings(engine={"embedded": {key: value}})


def test_the_headroom_is_a_setting_checked_at_load() -> None:
    from pydantic import ValidationError

    from reef.settings import EmbeddedSettings

    assert EmbeddedSettings(itl_headroom=0.15).itl_headroom == 0.15
    with pytest.raises(ValidationError, match="itl_headroom"):
        EmbeddedSettings(itl_headroom=0)


def test_paced_reading_gives_what_fixed_chunks_give(tiny_dir: Path) -> None:
    """A target no round can meet, with no time to wait for room, reads one prompt token a
    round while a row decodes (the long prompt's ~600 tokens take a pass each while the
    running row decodes its 200), and so it does once the time to wait has run out; with time
    to wait, the long prompt waits for the running row to end and is then read whole. A target
    every round meets reads chunks of prefill_chunk_tokens, as many passes as fixed chunks.
    Every way, the tokens and log-probs are those of a prompt read in fixed chunks."""
    fixed, fixed_stats = answers(tiny_dir, 16)
    tight, tight_stats = answers(tiny_dir, 16, itl_target_ms=0.001, itl_max_wait_ms=0)
    loose, loose_stats = answers(tiny_dir, 16, itl_target_ms=1e6, itl_headroom=1e6)
    relative, relative_stats = answers(tiny_dir, 16, itl_headroom=0.5)
    waited, waited_stats = answers(tiny_dir, 16, itl_target_ms=0.001)
    expired, expired_stats = answers(tiny_dir, 16, itl_target_ms=0.001, itl_max_wait_ms=5)
    assert tight_stats.prefills > fixed_stats.prefills + 100, (tight_stats, fixed_stats)
    assert expired_stats.prefills > fixed_stats.prefills + 100, (expired_stats, fixed_stats)
    assert loose_stats.prefills <= fixed_stats.prefills + 3, (loose_stats, fixed_stats)
    # With time to wait, the long prompt waits out the running row and is then read whole.
    assert waited_stats.prefills <= fixed_stats.prefills, (waited_stats, fixed_stats)
    for stats in (tight_stats, loose_stats, relative_stats, waited_stats, expired_stats):
        assert stats.prompt_tokens == fixed_stats.prompt_tokens
        assert stats.failed == 0 and stats.active == 0
    for paced in (tight, loose, relative, waited, expired):
        for a, b in zip(fixed, paced, strict=True):
            assert a.completion_token_ids == b.completion_token_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_a_prompt_that_fits_one_chunk_is_not_paced_behind_a_long_one(tiny_dir: Path) -> None:
    """Paced to a target no round can meet, a long prompt is read a token a round while a row
    decodes; a question arriving behind it fits one chunk, so it is read at once, ahead of the
    long one's rest, and answered while the long one is still being read."""
    with running_engine(
        tiny_dir,
        max_batch_size=8,
        prefill_chunk_tokens=64,
        prefix_cache_mb=0,
        itl_target_ms=0.001,
        itl_max_wait_ms=0,
    ) as engine:

        async def scenario() -> tuple[int, int]:
            running = asyncio.create_task(engine.complete(body("hi", max_tokens=200)))
            while not engine.stats.tokens_generated:
                await asyncio.sleep(0.001)
            long = asyncio.create_task(engine.complete(body(LONG, max_tokens=2)))
            while engine.stats.prefills < 5:  # the long prompt's first tokens, one a round
                await asyncio.sleep(0.001)
            before = engine.stats.prefills
            short = await engine.complete(body("What is the capital of France?", max_tokens=3))
            passes = engine.stats.prefills - before
            assert not long.done()
            assert len(short.completion_token_ids or []) == 3
            await long, await running
            return passes, engine.stats.prefills

        passes, total = asyncio.run(scenario())
        # The question: one pass; the long prompt: a token in each of the few rounds its three
        # tokens took, and a pass a round in all while the running row decoded its 200 (the
        # rest whole once nothing decoded).
        assert passes <= 8, passes
        assert total >= 190, total
        assert engine.stats.failed == 0
