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
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .dashboard import Ended
from .durable.remote import RemoteRun
from .errors import NoSuchRun
from .run_filter import Cursor, Page, RunFilter, page_of
from .summaries import activity, first_ms, message_dict, row_summary, summarize

if TYPE_CHECKING:
    from .runtime import Runtime

SHOWN_FROM_STORE = 500
"""How many of the store's runs executed elsewhere `recent` lists (the most recent); `page`
pages through all of them."""
ENDED_STATES = ("done", "halted", "failed", "cancelled", "interrupted")
"""A run in one of these waits for nobody: the inbox does not ask it."""
WAITING = RunFilter(states=frozenset({"waiting"}))


class Overview:
    """The runs of `runtime` as a person reads them: summaries, pages, what waits."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def summary(self, run_id: str) -> dict[str, Any]:
        """A run this process holds, from its events."""
        run = self.runtime.runs.get(run_id)
        s = summarize(self.runtime.bus.logs[run_id].events)
        s["id"] = run_id
        if run is not None:
            s["status"] = run.status
        elif s["status"] in ("queued", "running", "idle"):
            s["status"] = "interrupted"  # its server stopped before it ended
        return s

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
        """The store's page (the runs executing here shown as they stream), or in memory the
        page of this process's runs."""
        logs = self.runtime.bus.logs
        view = self.runtime.view
        if view is not None:
            page = await asyncio.to_thread(view.page, flt, after, limit, oldest_first)
            page.rows = [
                self.summary(r["id"]) if r["id"] in logs else row_summary(r) for r in page.rows
            ]
            return page
        keyed = self.keyed_here()
        page = page_of(keyed, flt, after, limit, oldest_first)
        page.counts = dict(Counter(s["status"] for _, s in keyed))
        return page

    def keyed_here(self) -> list[tuple[Cursor, dict[str, Any]]]:
        """This process's runs in memory, each with its key in a page's order."""
        logs = self.runtime.bus.logs
        return [(Cursor(first_ms(logs[i].events), i), self.summary(i)) for i in list(logs)]

    def waiting_here(self) -> list[tuple[Cursor, dict[str, Any]]]:
        """`keyed_here`, those waiting for a person as `waiting` (a run in memory says
        `running` while its calls wait)."""
        keyed = self.keyed_here()
        for _, s in keyed:
            run = self.runtime.runs.get(s["id"])
            asks = run is not None and (run.waiting() or self.runtime.asked(s["id"]))
            if asks and s["status"] not in ENDED_STATES:
                s["status"] = "waiting"
        return keyed

    async def waiting(
        self, after: Cursor | None, limit: int, questions: bool = True
    ) -> tuple[list[dict[str, Any]], Page]:
        """What waits for a person, a page of runs at a time, the oldest run's first: each
        waiting call (`kind` approval) with its run and task, and with `questions`, each
        question its tools asked (`kind` question)."""
        if self.runtime.view is not None:
            page = await self.page(WAITING, after, limit, oldest_first=True)
        else:
            page = page_of(self.waiting_here(), WAITING, after, limit, oldest_first=True)
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
        took (the dashboard's figures, which keep those in its window), of the store's runs,
        or in memory of every run of this process."""
        view = self.runtime.view
        if view is not None:
            found: tuple[list[float], list[Ended], list[float]]
            found = await asyncio.to_thread(view.activity, since)
            return found
        started: list[float] = []
        ended: list[Ended] = []
        took: list[float] = []
        for log in list(self.runtime.bus.logs.values()):
            created, end, seconds = activity(log.events)
            started += [created] if created is not None else []
            ended += [end] if end is not None else []
            took += seconds
        return started, ended, took

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


async def act[T](run: Any, request: Callable[[], T]) -> T:
    """A request to a run: in a thread for a run of the store executed elsewhere (it reads
    and writes the store), here for one this process executes (its handle lives on this
    loop)."""
    if isinstance(run, RemoteRun):
        return await asyncio.to_thread(request)
    return request()
