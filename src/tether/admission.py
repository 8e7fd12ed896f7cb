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

    async def acquire(self, on_queued: Callable[[int], None] | None = None) -> bool:
        """Take a slot; returns True if it had to wait in the queue for it."""
        if self.active < self.limit and not self.waiters:
            self.active += 1
            return False
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(future)
        if on_queued is not None:
            on_queued(len(self.waiters))
        try:
            await future  # release() hands its slot over: `active` is unchanged
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # the slot was handed to us as we were cancelled
            else:
                self.waiters.remove(future)
            raise
        return True

    def release(self) -> None:
        while self.waiters:
            future = self.waiters.popleft()
            if not future.done():
                future.set_result(None)
                return
        self.active -= 1

    @asynccontextmanager
    async def slot(self, on_queued: Callable[[int], None] | None = None) -> AsyncIterator[bool]:
        waited = await self.acquire(on_queued)
        try:
            yield waited
        finally:
            self.release()


def endpoint_key(provider: str, base_url: str, api_key: str) -> str:
    """Names a provider endpoint and key without holding the key itself."""
    digest = hashlib.sha256(api_key.encode()).hexdigest()[:12]
    return f"{provider} {base_url} key:{digest}"
