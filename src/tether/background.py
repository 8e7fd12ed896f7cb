"""Work of a runtime's own, beside its runs: the tasks that keep MCP servers connected, follow
a store, beat for a worker. `Background` owns them for the runtime's life: each runs in a fresh
context (inside a durable workflow's, DBOS would take what it does for part of that workflow,
and a replay would no longer match), a failure is logged with its traceback once (it was an
exception nobody retrieved: "Task exception was never retrieved", at a garbage collection),
and closing cancels what is left and waits for it, a bounded time.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable
from typing import Any

log = logging.getLogger("tether")


class Background:
    """The tasks of one runtime (in memory, or of a store's process), until `close`."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, work: Awaitable[Any]) -> asyncio.Task[Any]:
        """Run `work` in a task of its own, in a fresh context. A coroutine is the task's own
        (a wrapper around it, cancelled before it began, left it never awaited: a warning)."""

        async def go() -> Any:
            return await work

        coroutine = work if asyncio.iscoroutine(work) else go()
        task = asyncio.get_running_loop().create_task(coroutine, context=contextvars.Context())
        self.tasks.add(task)
        task.add_done_callback(self.ended)
        return task

    def ended(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a background task of Tether failed", exc_info=task.exception())

    async def close(self, within: float = 5.0) -> None:
        """Cancel what is left, and wait `within` seconds at most for it to end."""
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=within)
