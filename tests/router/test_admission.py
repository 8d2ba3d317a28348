"""The router's admission queue on plain asyncio: order, limits, deadlines, no lost slot."""

from __future__ import annotations

import asyncio

import pytest

from router.admission import Admission, Ticket
from router.errors import APIError
from router.metrics import RouterMetrics


def _admission(max_inflight: int = 1, max_queued: int = 8) -> Admission:
    return Admission(max_inflight, max_queued, retry_after_s=2, metrics=RouterMetrics())


async def _queued(admission: Admission, count: int) -> None:
    async with asyncio.timeout(30):
        while admission.queued != count:
            await asyncio.sleep(0)


async def test_waiters_are_served_by_priority_then_arrival() -> None:
    admission = _admission()
    first = await admission.admit()
    order: list[str] = []
    tickets: dict[str, Ticket] = {}

    async def request(name: str, priority: int) -> None:
        tickets[name] = await admission.admit(priority)
        order.append(name)

    tasks = []
    for name, priority in [("a5", 5), ("b5", 5), ("c0", 0), ("d-1", -1), ("e0", 0)]:
        tasks.append(asyncio.create_task(request(name, priority)))
        await _queued(admission, len(tasks))
    first.release()
    while len(order) < len(tasks):  # each served request hands its slot to the next
        served = len(order)
        async with asyncio.timeout(30):
            while len(order) == served:
                await asyncio.sleep(0)
        assert admission.inflight == 1
        tickets[order[-1]].release()
    await asyncio.gather(*tasks)
    assert order == ["d-1", "c0", "e0", "a5", "b5"]
    assert admission.inflight == 0 and admission.queued == 0


async def test_a_full_queue_answers_429_with_retry_after() -> None:
    admission = _admission(max_inflight=1, max_queued=1)
    held = await admission.admit()
    waiting = asyncio.create_task(admission.admit())
    await _queued(admission, 1)
    with pytest.raises(APIError) as refused:
        await admission.admit()
    assert refused.value.status == 429 and refused.value.retry_after_s == 2
    held.release()
    (await waiting).release()
    assert admission.inflight == 0 and admission.queued == 0


async def test_a_wait_past_its_deadline_is_429_and_leaves_the_queue() -> None:
    admission = _admission()
    held = await admission.admit()
    with pytest.raises(APIError) as late:
        await admission.admit(wait_s=0.05)
    assert late.value.status == 429
    assert admission.queued == 0
    held.release()
    assert admission.inflight == 0


async def test_a_cancelled_waiter_takes_no_slot() -> None:
    admission = _admission()
    held = await admission.admit()
    gone = asyncio.create_task(admission.admit())
    later = asyncio.create_task(admission.admit())
    await _queued(admission, 2)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    held.release()
    ticket = await asyncio.wait_for(later, 30)
    assert admission.inflight == 1 and admission.queued == 0
    ticket.release()
    ticket.release()  # idempotent
    assert admission.inflight == 0


async def test_a_waiter_cancelled_after_its_slot_was_granted_hands_it_back() -> None:
    admission = _admission()
    held = await admission.admit()
    waiter = asyncio.create_task(admission.admit())
    await _queued(admission, 1)
    held.release()  # grants the slot to the waiter...
    waiter.cancel()  # ...which is cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert admission.inflight == 0 and admission.queued == 0


async def test_the_limit_follows_what_the_pools_hold() -> None:
    held: list[int | None] = [2]
    admission = Admission(8, 8, retry_after_s=2, metrics=RouterMetrics(), capacity=lambda: held[0])
    first, second = await admission.admit(), await admission.admit()
    third = asyncio.create_task(admission.admit())
    await _queued(admission, 1)  # the pools hold 2: the third waits, before any work
    assert admission.limit == 2 and admission.inflight == 2
    held[0] = 3  # a node joined: the next arrival lets the head of the queue in
    fourth = asyncio.create_task(admission.admit())
    (await asyncio.wait_for(third, 30)).release()
    (await asyncio.wait_for(fourth, 30)).release()
    held[0] = None  # unknown (an older node): max_inflight alone
    assert admission.limit == 8
    held[0] = 100
    assert admission.limit == 8
    first.release()
    second.release()
    assert admission.inflight == 0 and admission.queued == 0
