"""The marker writer's slots (`broker.txn.marker_writer._Slots`): at most `size` holders, the
others served in arrival order, a slot never lost to a waiter cancelled on the way."""
from __future__ import annotations

import asyncio

from oncelog.broker.txn.marker_writer import _Slots


async def test_at_most_size_hold_a_slot_and_waiters_are_served_in_order():
    slots, order, holding, most = _Slots(2), [], [0], [0]

    async def hold(i: int) -> None:
        await slots.acquire()
        try:
            holding[0] += 1
            most[0] = max(most[0], holding[0])
            order.append(i)
            await asyncio.sleep(0)
        finally:
            holding[0] -= 1
            slots.release()

    await asyncio.gather(*(hold(i) for i in range(10)))
    assert most[0] == 2 and order == list(range(10))


async def test_a_cancelled_waiter_loses_no_slot():
    slots = _Slots(1)
    await slots.acquire()
    waiters = [asyncio.ensure_future(slots.acquire()) for _ in range(3)]
    await asyncio.sleep(0)
    waiters[0].cancel()                  # cancelled while waiting
    slots.release()                      # handed to waiters[1] (waiters[0] is passed over)
    await asyncio.sleep(0)
    assert waiters[0].cancelled() and waiters[1].done() and not waiters[2].done()
    waiters[2].cancel()
    slots.release()                      # waiters[1] done: the slot is free again
    await asyncio.sleep(0)
    await asyncio.wait_for(slots.acquire(), 1)


async def test_a_waiter_cancelled_after_it_was_handed_the_slot_passes_it_on():
    slots = _Slots(1)
    await slots.acquire()
    first = asyncio.ensure_future(slots.acquire())
    second = asyncio.ensure_future(slots.acquire())
    await asyncio.sleep(0)
    slots.release()                      # handed to `first` ...
    first.cancel()                       # ... which is cancelled before it runs
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert first.cancelled() and second.done()
