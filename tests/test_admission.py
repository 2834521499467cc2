"""reef.admission on its own: first come first served, no slot lost to a caller that leaves."""

from __future__ import annotations

import asyncio

import pytest

from reef.admission import Admission
from reef.errors import EngineBusy


def test_the_line_is_served_in_order_and_bounded() -> None:
    async def run() -> None:
        gate = Admission(1, max_queue=3)
        first = await gate.enter()
        order: list[int] = []

        async def wait(i: int) -> None:
            slot = await gate.enter()
            order.append(i)
            await asyncio.sleep(0)
            slot.release()

        waiters = [asyncio.create_task(wait(i)) for i in range(3)]
        await asyncio.sleep(0.01)
        assert gate.load().busy and gate.load().waiting == 3
        with pytest.raises(EngineBusy) as refused:
            gate.check()
        assert refused.value.reason == "queue_full" and refused.value.status == 429
        with pytest.raises(EngineBusy):
            await gate.enter()
        first.release()
        first.release()  # a second release gives nothing back twice
        await asyncio.gather(*waiters)
        assert order == [0, 1, 2]
        assert (gate.running, gate.load().waiting, gate.refused["queue_full"]) == (0, 0, 2)

    asyncio.run(run())


def test_a_caller_that_leaves_or_times_out_keeps_no_slot() -> None:
    async def run() -> None:
        gate = Admission(1, max_queue=None, max_queue_wait_s=0.05)
        held = await gate.enter()
        leaving = asyncio.create_task(gate.enter())
        await asyncio.sleep(0.01)
        leaving.cancel()  # the client went away while in line
        with pytest.raises(asyncio.CancelledError):
            await leaving
        with pytest.raises(EngineBusy) as late:
            await gate.enter()  # waits 0.05 s, then refused
        assert late.value.reason == "queue_wait"
        assert 1 <= late.value.retry_after_s <= 60
        # a waiter handed the slot in the same instant it is cancelled passes it on
        racing = asyncio.create_task(gate.enter())
        await asyncio.sleep(0.01)
        held.release()
        racing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await racing
        assert gate.running == 0 and gate.load().waiting == 0
        again = await gate.enter()  # at once: the slot is free
        again.release()
        assert gate.running == 0

    asyncio.run(run())
