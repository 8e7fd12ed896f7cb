"""What a person sees of a runtime's runs: one reading for the page and `tether mcp-serve`.

A run this process holds is summarized from its events as they stream; a run of the store that
executes elsewhere (or nowhere yet) from the store's listing. Both read as `summaries.summarize`
shapes them, so a page of runs, the inbox and an MCP client's `list_runs` agree (each had its
own copy of these rules, and the copies drifted).

    overview = Overview(runtime)
    page = await overview.page(RunFilter(), None, 50)
    run = await overview.describe(run_id)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .dashboard import Ended
from .durable.remote import RemoteRun
from .errors import NoSuchRun
from .memory_view import ENDED_STATES, fold, held_summary
from .run_filter import Cursor, Page, RunFilter
from .summaries import message_dict, row_summary

if TYPE_CHECKING:
    from .runtime import Runtime

SHOWN_FROM_STORE = 500
"""How many of the store's runs executed elsewhere `recent` lists (the most recent); `page`
pages through all of them."""
WAITING = RunFilter(states=frozenset({"waiting"}))


class Overview:
    """The runs of `runtime` as a person reads them: summaries, pages, what waits."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def summary(self, run_id: str) -> dict[str, Any]:
        """A run this process holds, from its events."""
        logs = self.runtime.bus.logs
        return held_summary(run_id, fold(logs[run_id]).summary, self.runtime.runs.get(run_id))

    async def recent(self) -> list[dict[str, Any]]:
        """The runs of this process, then those of its store that execute elsewhere (the most
        recent `SHOWN_FROM_STORE`, oldest first)."""
        here = [self.summary(run_id) for run_id in self.runtime.bus.logs]
        stored = await asyncio.to_thread(self.runtime.stored_runs, SHOWN_FROM_STORE)
        seen = set(self.runtime.bus.logs)
        return here + [row_summary(r) for r in stored if r["id"] not in seen]

    async def page(
        self, flt: RunFilter, after: Cursor | None, limit: int, oldest_first: bool = False
    ) -> Page:
        """A page of the runs (on a store, the runs executing here shown as they stream)."""
        logs = self.runtime.bus.logs
        page = await self.read(self.runtime.view.page, flt, after, limit, oldest_first)
        page.rows = [live(self.summary(r["id"]), r) if r["id"] in logs else row_summary(r)
                     for r in page.rows]  # fmt: skip
        return page

    async def waiting(
        self, after: Cursor | None, limit: int, questions: bool = True
    ) -> tuple[list[dict[str, Any]], Page]:
        """What waits for a person, a page of runs at a time, the oldest run's first: each
        waiting call (`kind` approval) with its run and task, and with `questions`, each
        question its tools asked (`kind` question)."""
        page = await self.page(WAITING, after, limit, oldest_first=True)
        found: list[dict[str, Any]] = []
        for s in page.rows:
            try:
                run = await asyncio.to_thread(self.runtime.get, s["id"])
            except NoSuchRun:
                continue
            of_run = {"run_id": s["id"], "task": s.get("task")}
            for r in await act(run, run.waiting):
                kind = {"kind": "approval"} if questions else {}
                found.append({**r.to_dict(), **of_run, **kind})
            if questions:
                asked = await asyncio.to_thread(self.runtime.asked, s["id"])
                found += [{**q.to_dict(), **of_run, "kind": "question"} for q in asked]
        return found, page

    async def activity(self, since: float) -> tuple[list[float], list[Ended], list[float]]:
        """Since `since`: when runs started, how they ended, and how long their model calls
        took (the dashboard's figures, which keep those in its window)."""
        return await self.read(self.runtime.view.activity, since)

    async def read[T](self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` of the view: in a thread for a store's (it waits on the store), here
        for the runs in memory (their logs and handles are this loop's, read by it alone)."""
        if self.runtime.view.blocking:
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    async def describe(self, run_id: str) -> dict[str, Any] | None:
        """One run's summary with its transcript, the calls that wait for approval and the
        questions its tools asked; None if there is no such run."""
        if run_id in self.runtime.bus.logs:
            summary = self.summary(run_id)
        else:  # a run of the store executed elsewhere, or none
            row = await asyncio.to_thread(self.runtime.stored_run, run_id)
            if row is None:
                return None
            summary = row_summary(row)
        try:
            run: Any = await asyncio.to_thread(self.runtime.get, run_id)
        except NoSuchRun:  # journaled by a server here before, and not in a store
            run = None
        summary["transcript"], summary["approvals"] = None, []
        if run is not None:
            transcript, waiting = await act(run, lambda: (run.transcript, run.waiting()))
            summary["transcript"] = [message_dict(m) for m in transcript]
            summary["approvals"] = [r.to_dict() for r in waiting]
        asked = await asyncio.to_thread(self.runtime.asked, run_id)
        summary["questions"] = [q.to_dict() for q in asked]
        return summary


def live(summary: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """A run executing here as its events say, but `waiting` where the view says it waits for
    a person (a run here says `running` while its calls wait)."""
    if row.get("status") == "waiting" and summary["status"] not in ENDED_STATES:
        summary["status"] = "waiting"
    return summary


async def act[T](run: Any, request: Callable[[], T]) -> T:
    """A request to a run: in a thread for a run of the store executed elsewhere (it reads
    and writes the store), here for one this process executes (its handle lives on this
    loop)."""
    if isinstance(run, RemoteRun):
        return await asyncio.to_thread(request)
    return request()
