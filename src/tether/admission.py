"""Admission control: bounded concurrency with a visible queue.

Overload should delay new work, not slow every run at once. A `Limiter` lets `limit` holders in
and queues the rest in order; whoever waits is told its place, so the wait shows up as events
(`queued`, then `admitted`). Supervisors keep one for concurrent runs and one per provider
endpoint and key for concurrent model calls.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass


class Limiter:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("a limit must be at least 1")
        self.limit = limit
        self.active = 0
        self.waiters: deque[asyncio.Future[None]] = deque()

    @property
    def queued(self) -> int:
        return len(self.waiters)

    def take(self) -> bool:
        """Take a slot if one is free now and nobody waits (no wait, no await)."""
        if self.active < self.limit and not self.waiters:
            self.active += 1
            return True
        return False

    async def acquire(self, on_queued: Callable[[int], None] | None = None) -> bool:
        """Take a slot; returns True if it had to wait in the queue for it."""
        if self.take():
            return False
        turn = self.queue()
        if on_queued is not None:
            on_queued(len(self.waiters))
        try:
            await turn
        except asyncio.CancelledError:
            self.leave(turn)
            raise
        return True

    def queue(self) -> asyncio.Future[None]:
        """A place at the end of the queue: the future `release` hands a slot over by. Its
        waiter awaits it itself (no coroutine to wait: a model call in the queue held one, in
        the rig's 1,000-run scenario three in four calls), and once it is done the slot is
        held (`active` unchanged). A waiter cancelled calls `leave`."""
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(turn)
        return turn

    def leave(self, turn: asyncio.Future[None]) -> None:
        """Give up a place in the queue whose wait was cancelled: the slot too, if it was
        handed over as the wait was cancelled."""
        if turn.done() and not turn.cancelled():
            self.release()
        else:
            self.waiters.remove(turn)

    def release(self) -> None:
        while self.waiters:
            future = self.waiters.popleft()
            if not future.done():
                future.set_result(None)
                return
        self.active -= 1


@dataclass(eq=False)
class Slot:
    """A run's slot among its process's runs (`Limiter`), which it may step aside from while it
    waits for what no slot gives (its account's room, `aside`)."""

    limiter: Limiter
    held: bool = True

    def give_back(self) -> None:
        if self.held:
            self.held = False
            self.limiter.release()

    async def take_again(self) -> None:
        await self.limiter.acquire()  # cancelled: not held, and `give_back` then does nothing
        self.held = True


SLOT: ContextVar[Slot | None] = ContextVar("tether_run_slot", default=None)
"""The running run's slot (set by `run.admitted` for the run's task)."""


@asynccontextmanager
async def aside() -> AsyncIterator[None]:
    """Let other runs have this run's slot meanwhile: a run queued for its account's room held
    one for as long as it waited, so the runs of one account over its limit held every slot
    of a page's server, and no other account's run started."""
    slot = SLOT.get()
    if slot is None or not slot.held:
        yield
        return
    slot.give_back()
    try:
        yield
    finally:
        await slot.take_again()


def endpoint_key(provider: str, base_url: str, api_key: str) -> str:
    """Names a provider endpoint and key without holding the key itself."""
    digest = hashlib.sha256(api_key.encode()).hexdigest()[:12]
    return f"{provider} {base_url} key:{digest}"
