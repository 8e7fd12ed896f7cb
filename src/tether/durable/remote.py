"""A store's runs acted on and followed from a process that does not execute them: an approval
answered, a message sent, a question answered, runs queued for the workers (`tether approve`,
`send`, `answer`, `Runtime.enqueue`), and a run executed elsewhere followed as a handle
(`RemoteRun`, through `StoreView`, which the page and `Runtime.get` use).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import orjson

from ..approvals import ApprovalRequest, check_answer
from ..bus import EventLog
from ..dashboard import Ended
from ..errors import ApprovalError, ConfigError, NoSuchRun, QuestionError, RunEnded
from ..messages import Message, ToolCall
from ..questions import Answer, Question, fitted
from ..result import RunResult
from ..run_filter import Cursor, Page, RunFilter
from .accounts import release_in
from .activity import ended_since, model_seconds_since, started_since
from .dbos_private import (
    all_events,
    engine,
)
from .formats import WORKFLOW_VERSION, RunRecord
from .ledger import Ledger
from .retold import events_of
from .versions import home_of, queue_for, record_in, wanted
from .view import (
    ENDED,
    MAIL,
    WORKFLOW,
    check_url,
    client,
    decision_in,
    executor_alive,
    list_runs,
    listing,
    messages_of,
    page_runs,
    questions_waiting,
    state_counts,
    status_of,
    waiting_state,
)

T = TypeVar("T")


def answer_approval(
    store: Any, run_id: str, approval_id: str, reply: dict[str, Any], args_hash: str | None
) -> None:
    """Answer a durable run's approval request from outside (`tether approve`): only one
    that is waiting now, and with `args_hash`, only for the arguments it showed."""
    status = status_of(store, run_id)
    if status.status in ENDED:
        raise RunEnded(f"run {run_id} has ended ({status.status.lower()})")
    asked = store.get_event(run_id, approval_id, timeout_seconds=0)
    waiting = isinstance(asked, dict) and asked.get("state") == "waiting"
    shown = str(asked.get("args_hash")) if waiting else None
    check_answer(approval_id, shown, decision_in(asked), args_hash)
    store.send(run_id, reply, approval_id)


# -- the queue --------------------------------------------------------------------------------


def enqueue(url: str, runs: list[tuple[str, str]], record: RunRecord, store: Any = None) -> None:
    """Put runs (id, task) of one record (agent, options, context) on the shared queue for
    whichever workers are free, in one transaction: all of them are recorded, or, when one
    cannot be (an id the store has already), none is. A thousand take about a second.
    `store`: the process's reader of the store, if it has one open (else one is opened for
    this and closed after: a reader per call, never closed, kept its connections open)."""
    if store is None:
        opened = client(url, create=True)
        try:
            return enqueue(url, runs, record, opened)
        finally:
            opened.close()
    ids = [run_id for run_id, _ in runs]
    if len(set(ids)) != len(ids):
        raise ConfigError("two runs to queue have the same id")
    taken = sorted(w.workflow_id for w in store.list_workflows(workflow_ids=ids, load_input=False))
    if taken:
        shown = ", ".join(taken[:5]) + (f" and {len(taken) - 5} more" if len(taken) > 5 else "")
        raise ConfigError(f"the store has runs with these ids already: {shown}; nothing queued")
    queue = {
        "queue_name": home_of(record, None),
        "workflow_name": WORKFLOW,
        "app_version": WORKFLOW_VERSION,
    }
    with engine(store).begin() as conn:
        for run_id, task in runs:
            options: Any = {**queue, "workflow_id": run_id}
            store.enqueue_in_transaction(conn, options, run_id, record.to_dict(), task)


def answer_question(ledger: Ledger, run_id: str, question_id: str, answer: Answer) -> None:
    """Keep the answer to a question a run asked, checked against it, for the process that
    waits on it (or the one that resumes the run): QuestionError if it asked no such question,
    it has an answer, or this one does not fit."""
    found = ledger.question(run_id, question_id)
    if found is None:
        raise QuestionError(f"run {run_id} asked no question {question_id}")
    if found[1] is not None:
        raise QuestionError(f"question {question_id} of run {run_id} was answered already")
    checked = fitted(Question.from_dict(orjson.loads(found[0]), run_id), answer)
    if not ledger.give_answer(run_id, question_id, orjson.dumps(checked.to_dict()).decode()):
        raise QuestionError(f"question {question_id} of run {run_id} was answered already")


def cancel_run(store: Any, ledger: Ledger, run_id: str) -> None:
    """Cancel a run in the store, wherever it executes, and count what its calls in flight
    hold against its account as spent: a run whose worker died is never taken over once
    cancelled, and its reservations would hold its account's room for good."""
    store.cancel_workflow(run_id)
    release_in(ledger, run_id)


def upgrade_run(store: Any, ledger: Ledger, run_id: str, to: str | None) -> tuple[str, str]:
    """Move a run waiting for its version (queued, or left by a dead worker) to version `to`
    of its agent (None: the one other version live workers execute): one UPDATE of its row,
    onto that version's queue (`versions.py`). Its (from, to) versions; a ConfigError that
    says why for a run that cannot be (ended, running, built from options, no such version
    served), with nothing changed."""
    found = store.list_workflows(workflow_ids=[run_id], load_input=True, load_output=False)
    if not found:
        raise NoSuchRun(f"no run {run_id} in the store")
    status, record = found[0], record_in(found[0])
    agent, now = str(record.agent), wanted(record, found[0].queue_name)
    if status.status in ENDED:
        raise RunEnded(f"run {run_id} has ended ({status.status.lower()}): fork it instead")
    if now is None:
        raise ConfigError(
            f"run {run_id} is of an agent built from its recorded options, which any worker "
            "builds again: it has no version to upgrade"
        )
    workers = ledger.workers()
    executor = status.executor_id or ""
    if status.status == "PENDING" and workers.get(executor, ([], executor_alive(executor)))[1]:
        raise ConfigError(
            f"run {run_id} is running on {status.executor_id}: an upgrade moves a run that "
            "waits for its version (its worker gone)"
        )
    named = [v.rpartition("@") for vs, alive in workers.values() if alive for v in vs]
    served = sorted({version for name, _, version in named if name == agent})
    to = to or upgrade_target(run_id, agent, now, served)
    if to == now:
        raise ConfigError(f"run {run_id} is of version {now} already")
    if to not in served:
        raise ConfigError(
            f"no live worker executes version {to} of agent {agent} (they execute "
            f"{', '.join(served) or 'none of it'}): start one first"
        )
    store.resume_workflow(run_id, queue_name=queue_for(agent, to))
    return now, to


def upgrade_target(run_id: str, agent: str, now: str, served: list[str]) -> str:
    """The version an upgrade goes to when none is named: the one other that is served."""
    others = [v for v in served if v != now]
    if len(others) == 1:
        return others[0]
    if not others:
        raise ConfigError(
            f"no live worker executes a version of agent {agent} other than {now}: start one first"
        )
    raise ConfigError(
        f"live workers execute versions {', '.join(others)} of agent {agent}: name one (--to)"
    )


def send_message(store: Any, ledger: Ledger, run_id: str, text: str) -> None:
    """A user message for a run that has not ended, executed wherever: it waits in the
    store's inbox for the run's next model call, and a DBOS message wakes the run if it idles."""
    status = status_of(store, run_id)
    if status.status in ENDED:
        raise RunEnded(f"run {run_id} has ended ({status.status.lower()}); start a new one")
    seq = ledger.send(run_id, text)
    store.send(run_id, seq, MAIL)


# -- runs executed elsewhere, followed from here ------------------------------------------------

POLL_S = 0.5
"""How often a run followed from its store is read again. A page shows a step of a run on
another machine within this (one read of its steps and approvals, about 1 ms on Postgres)."""


class StoreView:
    """The runs of a store that this process does not execute (workers elsewhere do, or none
    has yet): found by id, followed live, and asked what a run here can be asked. It owns the
    process's one client of the store (a process that executes runs reads through it too),
    and the tasks that follow runs; closing the view ends those. Its followers read in a
    thread; its other methods are plain calls, which the page makes in a thread."""

    blocking = True  # its reads wait on the store

    def __init__(self, url: str, ledger: Ledger | None = None) -> None:
        """`ledger`: the store's ledger where this process has one open already."""
        check_url(url)
        self.url = url
        self._client: Any = None
        self._ledger = ledger
        self.logs: dict[str, EventLog] = {}  # runs followed now, by id
        self.followers: set[asyncio.Task[None]] = set()

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = client(self.url, create=True, ledger=self._ledger)
        return self._client

    @property
    def ledger(self) -> Ledger:
        ledger: Ledger = self.client.ledger  # the reader's: one per process
        return ledger

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(client, *args)` in a thread."""
        return await asyncio.to_thread(fn, self.client, *args)

    def has(self, run_id: str) -> bool:
        try:
            status_of(self.client, run_id)
        except NoSuchRun:
            return False
        return True

    def get(self, run_id: str) -> RemoteRun:
        """The run's handle (NoSuchRun when the store has no such run)."""
        if not self.has(run_id):
            raise NoSuchRun(f"no run {run_id!r}")
        return RemoteRun(self, run_id)

    def log(self, run_id: str) -> EventLog:
        """The run's events from its store, read again every `POLL_S` until the run ends
        (NoSuchRun when the store has no such run)."""
        log = self.logs.get(run_id)
        if log is None:
            if not self.has(run_id):
                raise NoSuchRun(f"no run {run_id!r}")
            log = self.logs[run_id] = EventLog(run_id)
            task = asyncio.get_running_loop().create_task(self.follow(log))
            self.followers.add(task)
            task.add_done_callback(self.followers.discard)
        return log

    async def follow(self, log: EventLog) -> None:
        try:
            while True:
                events = await self.read(events_of, log.run_id)
                log.extend(events[len(log) :])
                if events and events[-1].type == "run_finished":
                    return
                await asyncio.sleep(POLL_S)
        except (ConfigError, NoSuchRun):  # the run is gone from the store: the follow ends
            return  # (NoSuchRun was left to the task, an exception nobody retrieved)
        finally:
            log.close()
            if self.logs.get(log.run_id) is log:  # read again from the store if asked again
                del self.logs[log.run_id]

    def rows(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The store's runs as `tether runs` lists them (with `limit`, the most recent)."""
        return list_runs(self.client, limit=limit)

    def page(
        self, flt: RunFilter, after: Cursor | None, limit: int, oldest_first: bool = False
    ) -> Page:
        """A page of the store's runs, newest first (or oldest), with the store's counts by
        state (not for the inbox's pages, oldest first)."""
        found = page_runs(self.client, flt, after, limit, oldest_first)
        if not oldest_first:
            found.counts = state_counts(self.client)
        return found

    def activity(self, since: float) -> tuple[list[float], list[Ended], list[float]]:
        """What the store's runs did since `since`, for the dashboard (`activity.py`)."""
        return (
            started_since(self.client, since),
            ended_since(self.client, since),
            model_seconds_since(self.client, since),
        )

    def questions(self, run_id: str) -> list[Question]:
        """The questions a run of the store waits on, wherever it executes."""
        return questions_waiting(self.ledger, run_id)

    def row(self, run_id: str) -> dict[str, Any] | None:
        try:
            found = listing(status_of(self.client, run_id))
        except NoSuchRun:
            return None
        return waiting_state(self.client, found)

    async def close(self) -> None:
        for task in list(self.followers):
            task.cancel()
        if self.followers:
            await asyncio.wait(self.followers, timeout=5.0)
        if self._client is not None:
            self._client.destroy()
            self._client = None


class RemoteRun:
    """A run of the store executed elsewhere, or queued: the same surface as a run executed
    here (`runtime.RunHandle`), each request made through the store. A message waits in its
    inbox; an approval answers the request the run recorded (only one still waiting, and for
    the arguments shown); a cancel stops it in the store, and the worker that executes it
    stops it at once (`DurableRuns.watch_cancels`)."""

    def __init__(self, view: StoreView, run_id: str) -> None:
        self.view = view
        self.id = run_id

    @property
    def status(self) -> str:
        """Its state as `tether runs` shows it (queued, running, waiting, then its outcome)."""
        row = self.view.row(self.id)
        if row is None:
            raise NoSuchRun(f"run {self.id!r} is gone from its store")
        return str(row["state"])

    @property
    def version(self) -> str | None:
        """The agent's version the run started with, as the store recorded it."""
        row = self.view.row(self.id)
        if row is None:
            raise NoSuchRun(f"run {self.id!r} is gone from its store")
        version = row.get("version")
        return version if isinstance(version, str) else None

    @property
    def alive(self) -> bool:
        return status_of(self.view.client, self.id).status not in ENDED

    @property
    def transcript(self) -> list[Message]:
        return messages_of(self.view.client, self.id)

    def send(self, text: str) -> None:
        send_message(self.view.client, self.view.ledger, self.id, text)

    def cancel(self) -> bool:
        if not self.alive:
            return False
        cancel_run(self.view.client, self.view.ledger, self.id)
        return True

    def approve(
        self, approval_id: str, args_hash: str | None = None, reason: str = "approved by the user"
    ) -> None:
        self.answer(approval_id, {"approved": True, "reason": reason}, args_hash)

    def deny(self, approval_id: str, reason: str = "denied by the user") -> None:
        self.answer(approval_id, {"approved": False, "reason": reason}, None)

    def answer(self, approval_id: str, reply: dict[str, Any], args_hash: str | None) -> None:
        try:
            answer_approval(self.view.client, self.id, approval_id, reply, args_hash)
        except ConfigError as e:
            raise ApprovalError(str(e)) from None

    def waiting(self) -> list[ApprovalRequest]:
        found = all_events(self.view.client, self.id)
        return [
            ApprovalRequest(
                key,
                ToolCall(key.removeprefix("ap_"), v.get("name", ""), v.get("arguments"), ""),
                str(v.get("args_hash")),
            )
            for key, v in found.items()
            if isinstance(v, dict) and v.get("state") == "waiting"
        ]

    async def wait(self) -> RunResult:
        """Wait for the run to end, wherever it executes; its result."""
        async for event in self.view.log(self.id).follow(0):
            if event.type == "run_finished":
                messages = await self.view.read(messages_of, self.id)
                return RunResult.from_dict(self.id, {**event.data, "messages": messages})
        raise NoSuchRun(f"run {self.id!r} is gone from its store")
