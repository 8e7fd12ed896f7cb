"""The limiter behind `max_runs` and the per-endpoint bound on model calls: never more holders
than its limit, a place in line for the rest, and no slot lost when a waiter is cancelled."""

from __future__ import annotations

import asyncio

from tether.admission import Limiter, endpoint_key


async def test_a_free_slot_is_taken_at_once_and_the_rest_wait_in_order() -> None:
    limiter = Limiter(2)
    places: list[int] = []
    assert await limiter.acquire(places.append) is False  # no wait: nothing to announce
    assert await limiter.acquire(places.append) is False
    third = asyncio.ensure_future(limiter.acquire(places.append))
    fourth = asyncio.ensure_future(limiter.acquire(places.append))
    await asyncio.sleep(0)
    assert places == [1, 2] and limiter.queued == 2 and not third.done()
    limiter.release()
    assert await third is True and not fourth.done()  # first in line, first in
    limiter.release()
    assert await fourth is True
    assert limiter.active == 2


async def test_a_slot_given_back_with_nobody_waiting_admits_one_more_not_two() -> None:
    limiter = Limiter(2)
    await limiter.acquire()
    await limiter.acquire()
    limiter.release()
    assert await limiter.acquire() is False
    waiting = asyncio.ensure_future(limiter.acquire())
    await asyncio.sleep(0)
    assert not waiting.done() and limiter.active == 2
    limiter.release()
    assert await waiting is True


async def test_a_waiter_cancelled_in_line_leaves_the_count_as_it_was() -> None:
    limiter = Limiter(1)
    await limiter.acquire()
    waiting = asyncio.ensure_future(limiter.acquire())
    await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert limiter.queued == 0 and limiter.active == 1
    later = asyncio.ensure_future(limiter.acquire())
    await asyncio.sleep(0)
    assert not later.done()  # the holder still holds the only slot
    limiter.release()
    assert await later is True


async def test_a_waiter_cancelled_as_its_slot_is_handed_over_passes_it_on() -> None:
    """The slot was given to a waiter whose task was cancelled before it resumed: the waiter
    gives the slot back, so it is not lost."""
    limiter = Limiter(1)
    await limiter.acquire()
    handed = asyncio.ensure_future(limiter.acquire())
    await asyncio.sleep(0)
    limiter.release()  # hands the slot to `handed`...
    handed.cancel()  # ...which is cancelled before it runs again
    results = await asyncio.gather(handed, return_exceptions=True)
    assert isinstance(results[0], asyncio.CancelledError)
    assert limiter.active == 0 and limiter.queued == 0
    assert await limiter.acquire() is False


def test_an_endpoint_is_named_without_its_key() -> None:
    name = endpoint_key("openai-chat", "https://api.example/v1", "sk-secret-key")
    assert "sk-secret" not in name
    assert name.startswith("openai-chat https://api.example/v1 key:")
    assert name != endpoint_key("openai-chat", "https://api.example/v1", "sk-other-key")
