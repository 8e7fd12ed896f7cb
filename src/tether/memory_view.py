"""The runs of a runtime in memory, read as a store's runs are read (`durable.remote.StoreView`):
found by id, followed, listed a page at a time, counted for the dashboard. With it a Runtime
always has a view of its runs (`Runtime.view`), and whoever reads runs (the page, `mcp-serve`,
`Overview`) asks one interface instead of asking first whether there is a store.

A run here is summarized from its events; one whose calls or tools wait for a person is
`waiting`, as a store lists it (a run in memory says `running` while it waits).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from .bus import EventLog
from .dashboard import Ended
from .errors import NoSuchRun
from .questions import Question, Questions
from .run_filter import Cursor, Page, RunFilter, page_of
from .summaries import activity, first_us, summarize
from .supervisor import Supervisor

ENDED_STATES = ("done", "halted", "failed", "cancelled", "interrupted")
"""A run in one of these waits for nobody."""


@dataclass(frozen=True, slots=True)
class Fold:
    """What a run's events fold to, for a log of `length` events."""

    length: int
    summary: dict[str, Any]
    created_us: int
    activity: tuple[float | None, Ended | None, list[float]]


def fold(log: EventLog) -> Fold:
    """What a run's events fold to, computed again only when its log has grown: a log holds
    its events as JSON (`bus`), and a page lists every run again each time it is read."""
    found = log.memo
    if not isinstance(found, Fold) or found.length != len(log):
        events = log.events
        found = Fold(len(log), summarize(events), first_us(events), activity(events))
        log.memo = found
    return found


def held_summary(run_id: str, folded: dict[str, Any], run: Any) -> dict[str, Any]:
    """A run this process holds (its events' summary, its handle if it still has one)."""
    s = dict(folded)
    s["id"] = run_id
    if run is not None:
        s["status"] = run.status
    elif s["status"] in ("queued", "running", "idle"):
        s["status"] = "interrupted"  # its server stopped before it ended
    return s


class MemoryView:
    """This process's runs, as a store's view reads its own."""

    blocking = False  # read on the loop that runs them: no thread touches their logs

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self.asked = Questions()
        """What the runs' tools asked (the Runtime's, given when it opens)."""

    def has(self, run_id: str) -> bool:
        return run_id in self.supervisor.bus.logs

    def questions(self, run_id: str) -> list[Question]:
        return self.asked.of_run(run_id)

    def log(self, run_id: str) -> EventLog:
        found = self.supervisor.bus.logs.get(run_id)
        if found is None:
            raise NoSuchRun(f"no run {run_id!r}")
        return found

    def rows(self, limit: int | None = None) -> list[dict[str, Any]]:
        """A store's records of runs: in memory there are none (each run's events are all)."""
        return []

    def row(self, run_id: str) -> dict[str, Any] | None:
        return None

    def page(
        self, flt: RunFilter, after: Cursor | None, limit: int, oldest_first: bool = False
    ) -> Page:
        """A page of this process's runs, newest first (or oldest), with the counts by state."""
        keyed = self.keyed()
        found = page_of(keyed, flt, after, limit, oldest_first)
        found.counts = dict(Counter(s["status"] for _, s in keyed))
        return found

    def keyed(self) -> list[tuple[Cursor, dict[str, Any]]]:
        """Each run here, summarized, with its key in a page's order."""
        logs, runs = self.supervisor.bus.logs, self.supervisor.runs
        keyed = []
        for run_id in list(logs):
            run = runs.get(run_id)
            folded = fold(logs[run_id])
            s = held_summary(run_id, folded.summary, run)
            asks = run is not None and (run.waiting() or self.asked.of_run(run_id))
            if asks and s["status"] not in ENDED_STATES:
                s["status"] = "waiting"
            keyed.append((Cursor(folded.created_us, run_id), s))
        return keyed

    def activity(self, since: float) -> tuple[list[float], list[Ended], list[float]]:
        """When the runs here started, how they ended, how long their model calls took (the
        dashboard keeps those of its window)."""
        started: list[float] = []
        ended: list[Ended] = []
        took: list[float] = []
        for log in list(self.supervisor.bus.logs.values()):
            created, end, seconds = fold(log).activity
            started += [created] if created is not None else []
            ended += [end] if end is not None else []
            took += seconds
        return started, ended, took
