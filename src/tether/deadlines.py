"""Time limits of work in flight, on one timer: a tool call's, and an HTTP attempt's wait for bytes.

Every tool call has a time limit, and almost every call ends long before it. `asyncio.timeout`
per call made, for each call, a `Timeout`, a `TimerHandle` and a copy of the task's context,
and pushed the handle on the loop's heap of timers, each comparison a Python `__lt__`; at the
end of the call the handle was cancelled and stayed on the heap until the loop swept it. In the
benchmark rig's 1,000-run scenario (three calls a model turn) that was 7% of Tether's CPU a turn
(pinned pairs against the bare loop: 1.53x with a timeout per call, 1.43x with none).

Here a call's limit is one small object, found by its number in a dict of the limits in force,
and its deadline is a (deadline, number) pair on one heap, compared in C, with one loop timer for
the earliest deadline. A call that ends takes its limit out of the dict (the limit goes with the
call) and leaves its pair on the heap, to be swept when half of the heap is stale: a pair of a
float and an int is untracked by the collector at its first collection, where a (deadline,
number, limit) triple kept each ended call's limit, and itself, for the collector to walk until
the sweep (three of each a model turn in the rig's 1,000-run scenario, most of them moved to the
oldest generation). Since calls of one tool have one timeout, deadlines come in order: the timer
is set again only when the earliest is reached, about once a timeout.

A limit that fires cancels its call's task, as `asyncio.timeout` does, and the call tells its
own cancellation from one from outside by `Limit.timed_out` (the task's count of cancellation
requests, as the standard library keeps it). A limit can be stopped and restarted
(`reschedule(None)`, then a deadline): a call waiting for a person (`CallTime`).

An HTTP attempt's read limit (`providers.http`) is one too: nothing may fail to come for the
read timeout. Each read moves it later by an attribute (`extend`), and the timer, when it comes,
puts a limit that moved back on the heap instead of firing it. aiohttp's own read timeout
cancelled a `TimerHandle` and made a new one, with a bound method and a copy of the context,
at every read, each pushed on the loop's heap by Python comparisons: in the rig's 1,000-run
scenario, 3% of Tether's CPU a turn over the bare loop, which sets none.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools


class Limit:
    """One call's time limit: `when` it ends (None while stopped), whether it `fired`."""

    __slots__ = ("cancelling", "deadline", "done", "fired", "number", "owner", "task")

    def __init__(self, owner: Deadlines, task: asyncio.Task[object], deadline: float) -> None:
        self.owner = owner
        self.task: asyncio.Task[object] | None = task
        """The call's task, let go when the call ends: a limit that ended stays on the heap
        until a sweep, and held its task (its coroutine, its context) as long: some 3,000
        finished calls' tasks at once in the 1,000-run benchmark, for the collector to walk."""
        self.cancelling = task.cancelling()
        self.deadline: float | None = deadline
        self.number = 0
        """The heap entry that is this limit's now (its key among `Deadlines.live`); 0: none,
        and any older entry is stale."""
        self.fired = False
        self.done = False

    def when(self) -> float | None:
        return self.deadline

    def expired(self) -> bool:
        return self.fired

    def reschedule(self, when: float | None) -> None:
        """End at `when` (loop time) instead; None: not before it is rescheduled again."""
        if self.fired or self.done:
            return
        if self.deadline is not None:
            self.owner.forget(self)
        self.deadline = when
        if when is not None:
            self.owner.push(self, when)

    def extend(self, seconds: float) -> None:
        """End no sooner than `seconds` from now (work that goes on: bytes that came). Only
        the deadline moves: the timer, when it comes, finds it later and waits again."""
        if self.deadline is not None:
            self.deadline = self.owner.clock() + seconds

    def timed_out(self) -> bool:
        """Whether the CancelledError the call got is this limit's (and no one else's): then
        the cancellation is taken back and the call ends as timed out."""
        return self.fired and self.task is not None and self.task.uncancel() <= self.cancelling

    def close(self) -> None:
        """The call ended. A limit that fired on a call that ended anyway takes its
        cancellation back, so it does not reach the task's next await."""
        if self.done:
            return
        self.done = True
        task, self.task = self.task, None
        if self.fired:
            if task is not None and task.cancelling() > self.cancelling:
                task.uncancel()
        elif self.deadline is not None:
            self.owner.forget(self)


class Deadlines:
    """The limits of the calls in flight on one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.heap: list[tuple[float, int]] = []
        """(deadline, number): when each limit in force ends, and stale pairs of limits that
        ended or moved, until a sweep."""
        self.live: dict[int, Limit] = {}
        """The limits in force by the number of their pair on the heap."""
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0
        """When `timer` is set for (a `TimerHandle`'s `when()` is a Python call)."""
        self.clock = loop.time
        self.numbers = itertools.count(1)

    def start(self, seconds: float) -> Limit:
        """A limit of `seconds` from now for the current task's call."""
        task = asyncio.current_task(self.loop)
        if task is None:
            raise RuntimeError("a tool call's time limit needs a running task")
        deadline = self.clock() + seconds
        limit = Limit(self, task, deadline)
        self.push(limit, deadline)
        return limit

    def push(self, limit: Limit, deadline: float) -> None:
        """Put `limit` on the heap to end at `deadline`, which is its `deadline` now."""
        number = limit.number = next(self.numbers)
        self.live[number] = limit
        heapq.heappush(self.heap, (deadline, number))
        if self.timer is None or deadline < self.timer_at:
            if self.timer is not None:
                self.timer.cancel()
            self.timer = self.loop.call_at(deadline, self.fire)
            self.timer_at = deadline

    def forget(self, limit: Limit) -> None:
        """`limit` is in force no more (its pair on the heap is stale); sweep the heap when
        half of it is."""
        del self.live[limit.number]
        limit.number = 0
        heap, live = self.heap, self.live
        if len(heap) > 64 + 2 * len(live):
            self.heap = [e for e in heap if e[1] in live]
            heapq.heapify(self.heap)

    def fire(self) -> None:
        """Cancel every call whose deadline has come; set the timer for the next one."""
        self.timer = None
        now = self.clock()
        heap, live = self.heap, self.live
        while heap and heap[0][0] <= now:
            deadline, number = heapq.heappop(heap)
            limit = live.get(number)
            if limit is None:  # stale
                continue
            if limit.deadline is not None and limit.deadline > deadline:  # extended
                heapq.heappush(heap, (limit.deadline, number))
                continue
            del live[number]
            limit.number = 0
            limit.fired = True
            if limit.task is not None:
                limit.task.cancel()
        while heap and heap[0][1] not in live:  # stale pairs first: not worth a wake
            heapq.heappop(heap)
        if heap:
            self.timer_at = heap[0][0]
            self.timer = self.loop.call_at(self.timer_at, self.fire)


def on_loop(limits: Deadlines | None) -> Deadlines:
    """`limits` if they are the running loop's, else new ones for it: an owner (a toolbox, an
    HTTP client) outlives `asyncio.run`, and a second loop's work is limited too."""
    loop = asyncio.get_running_loop()
    if limits is None or limits.loop is not loop:
        return Deadlines(loop)
    return limits
