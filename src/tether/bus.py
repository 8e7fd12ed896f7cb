"""The event bus: every run's events in order, for any number of subscribers.

A run only appends to its `EventLog`; it never waits for a subscriber. A subscriber joins by run
id from any offset (0 replays the whole run) and reads at its own pace from the log. One that
lags more than `max_lag` events behind the head is told so with a `fell_behind` notice and goes
on re-reading from where it was: slow readers cost the run nothing, and lose nothing.

A log keeps each event as JSON, `[type, seq, ts, data]` (the run's id is the log's), read back
when someone asks (a page, a follower): bytes are objects the host's garbage collector never
walks. As `Event` objects, a run's events lived as long as the process kept the run (10,000
ended runs by default), each with its data's dicts and lists: in the rig's 1,000-run scenario
(K=3, T=3) 148,000 objects stayed after the runs ended, and the live runs' events were a tenth
of what every young collection found. An array is half the cost of `Event.to_json`'s object
(0.2 µs against 0.5 µs an event). The arrays are copied one after another into one `bytearray`:
kept as orjson returned them, each held the 4 KB buffer it was written in (the 1,000-run
scenario's peak RSS went from 94 MB to 247 MB). An event is written with no `default` first:
orjson asked with one took 0.14 µs more an event, of 0.35 µs, though no event of the rig's
runs needs it; one that does (a value JSON has no type for) is written again with `str`.
"""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import AsyncIterator, Iterable
from typing import Any

import orjson

from .events import Event

DEFAULT_MAX_LAG = 1000


class EventLog:
    __slots__ = ("closed", "ends", "memo", "run_id", "text", "waiters")

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.text = bytearray()
        """Each event's JSON array, one after another."""
        self.ends = array("q")
        """Where each event's JSON ends in `text`."""
        self.waiters: set[asyncio.Event] | None = None
        """Who follows the log (made when the first one joins; most logs are never followed)."""
        self.closed = False
        self.memo: Any = None
        """What a reader derived from the events, kept with them (`memory_view.fold`)."""

    def __len__(self) -> int:
        return len(self.ends)

    def at(self, position: int) -> Event:
        """The event at `position` (0 is the first; -1 the last)."""
        if position < 0:
            position += len(self.ends)
        start = self.ends[position - 1] if position else 0
        type_, seq, ts, data = orjson.loads(self.text[start : self.ends[position]])
        return Event(type_, self.run_id, seq, data, ts)

    @property
    def events(self) -> list[Event]:
        """Every event so far, read back: a list of the caller's own (`append` adds)."""
        return [self.at(i) for i in range(len(self.ends))]

    def append(self, event: Event) -> None:
        self.add(event.type, event.seq, event.ts, event.data)

    def add(self, type: str, seq: int, ts: float, data: dict[str, Any]) -> None:
        """An event by its parts (`events.Record`: a run's emitter writes its log so)."""
        try:
            self.text += orjson.dumps((type, seq, ts, data))
        except TypeError:  # a value JSON has no type for: as its str, as before
            self.text += orjson.dumps((type, seq, ts, data), default=str)
        self.ends.append(len(self.text))
        if self.waiters:
            for w in self.waiters:
                w.set()

    def extend(self, events: Iterable[Event]) -> None:
        for event in events:
            self.append(event)

    def close(self) -> None:
        """No more events will come (the run ended for good)."""
        self.closed = True
        for w in self.waiters or ():
            w.set()

    async def follow(self, offset: int = 0, max_lag: int = DEFAULT_MAX_LAG) -> AsyncIterator[Event]:
        """Events from `offset` on, then live ones as they come, until the log is closed."""
        wake = asyncio.Event()
        waiters = self.waiters = self.waiters or set()
        waiters.add(wake)
        position = max(0, offset)
        joined = len(self.ends)  # the backlog at joining is catch-up, not lag
        behind = False
        try:
            while True:
                while position < len(self.ends):
                    lag = len(self.ends) - max(position, joined)
                    if lag > max_lag and not behind:
                        behind = True
                        yield Event(
                            "fell_behind",
                            self.run_id,
                            -1,
                            {"position": position, "head": len(self.ends)},
                        )
                    elif behind and lag <= max_lag // 2:
                        behind = False
                    yield self.at(position)
                    position += 1
                if self.closed:
                    return
                wake.clear()
                await wake.wait()
        finally:
            waiters.discard(wake)


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
