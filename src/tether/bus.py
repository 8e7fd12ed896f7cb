"""The event bus: every run's events in order, for any number of subscribers.

A run only appends to its `EventLog`; it never waits for a subscriber. A subscriber joins by run
id from any offset (0 replays the whole run) and reads at its own pace from the log. One that
lags more than `max_lag` events behind the head is told so with a `fell_behind` notice and goes
on re-reading from where it was: slow readers cost the run nothing, and lose nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from .events import Event

DEFAULT_MAX_LAG = 1000


class EventLog:
    __slots__ = ("closed", "events", "run_id", "waiters")

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.events: list[Event] = []
        self.waiters: set[asyncio.Event] = set()
        self.closed = False

    def append(self, event: Event) -> None:
        self.events.append(event)
        for w in self.waiters:
            w.set()

    def close(self) -> None:
        """No more events will come (the run ended for good)."""
        self.closed = True
        for w in self.waiters:
            w.set()

    async def follow(self, offset: int = 0, max_lag: int = DEFAULT_MAX_LAG) -> AsyncIterator[Event]:
        """Events from `offset` on, then live ones as they come, until the log is closed."""
        wake = asyncio.Event()
        self.waiters.add(wake)
        position = max(0, offset)
        joined = len(self.events)  # the backlog at joining is catch-up, not lag
        behind = False
        try:
            while True:
                while position < len(self.events):
                    lag = len(self.events) - max(position, joined)
                    if lag > max_lag and not behind:
                        behind = True
                        yield Event(
                            "fell_behind",
                            self.run_id,
                            -1,
                            {"position": position, "head": len(self.events)},
                        )
                    elif behind and lag <= max_lag // 2:
                        behind = False
                    yield self.events[position]
                    position += 1
                if self.closed:
                    return
                wake.clear()
                await wake.wait()
        finally:
            self.waiters.discard(wake)


class Bus:
    """Event logs by run id."""

    def __init__(self) -> None:
        self.logs: dict[str, EventLog] = {}

    def log(self, run_id: str) -> EventLog:
        log = self.logs.get(run_id)
        if log is None:
            log = self.logs[run_id] = EventLog(run_id)
        return log

    def subscribe(
        self, run_id: str, offset: int = 0, max_lag: int = DEFAULT_MAX_LAG
    ) -> AsyncIterator[Event]:
        if run_id not in self.logs:
            raise KeyError(f"no run {run_id!r}")
        return self.logs[run_id].follow(offset, max_lag)
