"""The round planner on its own, without a model or torch: which prompts a round reads, how
much of each, paced or not, fused with a decode step or not."""

from __future__ import annotations

import subprocess
import sys

from reef.engines.planner import Group, Policy, Progress, Read, Unit, plan, split

CHUNK = Policy(chunk_tokens=16)
FUSED = Policy(chunk_tokens=16, fuse=True)


def long(
    key: str = "long",
    rows: int = 1,
    *,
    read: int = 0,
    cancelled: bool = False,
    waiting_since: float | None = None,
) -> Unit:
    """A prompt of 600 columns (per row) in the base model's group."""
    return Unit(key, "base", rows, 600, read, cancelled=cancelled, waiting_since=waiting_since)


def short(key: str = "short", width: int = 10, group: str = "base") -> Unit:
    return Unit(key, group, rows=1, width=width)


def test_the_planner_needs_no_torch() -> None:
    code = "import sys, reef.engines.planner; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_admitted_prompts_split_into_units_that_fit_a_chunk() -> None:
    # Three short prompts fit 16 tokens together; the long one goes alone, and the short one
    # behind it does not wait for all its chunks.
    assert split([5, 5, 5, 40, 5], 0, 16) == [[0, 1, 2], [3], [4]]
    assert split([5, 5, 5, 40, 5], 0, 0) == [[0, 1, 2, 3, 4]]  # nothing decoding: together
    assert split([20, 20], 12, 16) == [[0, 1]]  # what the prefix cache holds is not read
    assert split([20, 20], 0, 16) == [[0], [1]]


def test_a_long_prompt_is_read_a_chunk_a_round_while_rows_decode() -> None:
    round_ = plan([Group("base", 2)], [long(read=32)], CHUNK)
    assert round_.reads == (Read("long", 16, False, True, False, Progress(0, True)),)
    assert round_.decodes == ("base",)  # the running rows take their own pass
    assert not round_.unpaced
    # Its last chunk is what is left of it, and its rows join the batch.
    (last,) = plan([Group("base", 2)], [long(read=590)], CHUNK).reads
    assert (last.columns, last.last) == (10, True)


def test_a_chunk_rides_the_decode_step_of_the_group_it_joins_once_a_round() -> None:
    round_ = plan([Group("base", 2)], [short("a", 4), short("b", 4)], FUSED)
    assert [(r.unit, r.columns, r.fused) for r in round_.reads] == [("a", 4, True), ("b", 4, False)]
    assert round_.decodes == ()  # the group decoded with the first read
    # Separate passes: the group decodes on its own after the reads.
    assert plan([Group("base", 2)], [short("a", 4)], CHUNK).decodes == ("base",)


def test_a_chunk_is_read_apart_where_the_rows_need_other_lora_layers() -> None:
    groups = [Group("base", 2, frozenset({"a1"}))]
    same = Unit("u", "base", 1, 8, lora=frozenset({"a1"}))
    other = Unit("u", "base", 1, 8, lora=frozenset({"a2"}))
    assert plan(groups, [same], FUSED).reads[0].fused
    assert not plan(groups, [other], FUSED).reads[0].fused
    # A checkpoint's prompt does not ride the base model's step; once read it joins its own
    # group, which decodes in the same round.
    joined = plan([Group("base", 2)], [short("c", 4, group="ckpt")], FUSED)
    assert not joined.reads[0].fused
    assert joined.decodes == ("base", "ckpt")


def test_with_nothing_decoding_the_first_prompt_is_read_whole_and_the_next_in_chunks() -> None:
    round_ = plan([], [long("first"), long("second")], FUSED)
    first, second = round_.reads
    assert (first.unit, first.columns, first.last, first.fused) == ("first", 600, True, False)
    # The first one's rows decode now: the second is read a chunk, in their decode pass.
    assert (second.unit, second.columns, second.fused) == ("second", 16, True)
    assert round_.decodes == ()
    # Without a chunk size everything is read whole, and only the first read can ride.
    whole = plan([Group("base", 1)], [long("a"), long("b")], Policy(fuse=True))
    assert [(r.columns, r.fused) for r in whole.reads] == [(600, True), (600, False)]


def test_paced_a_prompt_that_fits_one_chunk_goes_ahead_of_a_long_one() -> None:
    paced = Policy(chunk_tokens=64)
    round_ = plan([Group("base", 1)], [long(), short()], paced, pace=lambda rows: 1)
    assert [(r.unit, r.columns, r.paced) for r in round_.reads] == [
        ("short", 10, False),  # at once, outside the budget
        ("long", 1, True),  # the budget: one token
    ]
    assert round_.unpaced  # such a round says nothing about what paced chunks cost
    # A long prompt's last chunk fits a chunk but is paced too: all of it counts.
    assert plan([Group("base", 1)], [long(read=590)], paced, pace=lambda rows: 4).reads[0].paced


def test_the_pacing_budget_is_split_over_a_units_rows() -> None:
    def pace(rows: int) -> int:
        assert rows == 3  # the rows decoding
        return 9

    (read,) = plan([Group("base", 3)], [long(rows=2)], CHUNK, pace=pace).reads
    assert (read.columns, read.after.budget) == (4, 1)
    # Less budget than rows: a column regardless, so that the prompt progresses.
    (forced,) = plan([Group("base", 3)], [long(rows=2)], CHUNK, pace=lambda rows: 1).reads
    assert (forced.columns, forced.after.budget) == (1, -1)


def test_a_long_prompt_waits_for_room_at_most_itl_max_wait() -> None:
    def paced(since: float | None) -> tuple[int, object]:
        round_ = plan(
            [Group("base", 8)],
            [long(waiting_since=since)],
            Policy(chunk_tokens=64, max_wait_s=10.0),
            pace=lambda rows: 0,
            now=100.0,
        )
        return sum(r.columns for r in round_.reads), round_.waiting

    assert paced(None) == (0, "long")  # its wait starts now
    assert paced(95.0) == (0, "long")
    assert paced(89.0) == (1, "long")  # waited over 10 s: a token a round
    # Once something was read this round, no room means the round reads no more.
    after_short = plan(
        [Group("base", 8)], [long(), short()], Policy(chunk_tokens=64), pace=lambda rows: 0
    )
    assert [r.unit for r in after_short.reads] == ["short"]
    assert after_short.waiting is None


def test_cancelled_units_are_dropped_and_a_replan_goes_on_from_its_progress() -> None:
    round_ = plan([Group("base", 1)], [long("gone", cancelled=True), long()], CHUNK)
    assert round_.drops == ("gone",)
    assert [(r.unit, r.columns) for r in round_.reads] == [("long", 16)]
    # The rest of a round: 5 tokens left and the group stepped already.
    rest = plan(
        [Group("base", 1)],
        [long()],
        FUSED,
        progress=Progress(5, True, frozenset({"base"})),
    )
    assert [(r.columns, r.fused) for r in rest.reads] == [(5, False)]
    assert rest.decodes == ()


def test_when_the_prompt_read_whole_left_no_rows_the_next_is_read_whole_too() -> None:
    """Planned again after the rows of a prompt read whole all finished on their first token:
    nothing decodes, so there is no budget yet; once this one joins, the next gets a chunk."""
    rest = plan([], [long("a"), long("b")], FUSED, progress=Progress(None, True))
    assert [(r.unit, r.columns, r.fused) for r in rest.reads] == [
        ("a", 600, False),
        ("b", 16, True),
    ]
