"""A store seen from outside: its runs read, listed, queued and messaged by a process that
executes none of them (`tether runs`, `send`, `approve`, `show`, `run --queue`, and the page
of `tether serve` for runs that workers elsewhere execute).

Such a process must not launch DBOS: DBOS would make it an executor, and it would pick up
pending runs and then exit in the middle of them. It reads through a `DBOSClient`, which
executes nothing. What a store holds of a run is what completed (`durable.py` says what
each step records), so a run followed from here shows its steps as they are recorded, not
its token deltas.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import orjson

from ..agent import RunResult
from ..approvals import ApprovalRequest
from ..bus import EventLog
from ..errors import ApprovalError, ConfigError, NoSuchRun, QuestionError, RunEnded
from ..events import Event, images_data, model_response_data, tool_result_data
from ..journal import private_file
from ..loop import close_open_calls
from ..messages import ImagePart, Message, ToolCall, Usage
from ..pricing import Price, price_for
from ..questions import Answer, Question, fitted
from .dbos_private import (
    all_events,
    engine,
    make_schema,
    no_such_workflow_error,
    refuse_pickles,
)
from .ledger import Ledger
from .outage import cannot_open, said_by_us
from .records import RecordSerializer
from .sqlite import scoped_sqlite, sqlite_dbapi
from .steps import KINDS, ContextStep, ModelStep, Step, ToolsStep
from .steps import built as step_of
from .steps import read as read_step

T = TypeVar("T")

WORKFLOW = "tether.durable_run"
QUEUE = "tether"
VERSION = "tether-4"  # the workflow's shape: a run recorded by another cannot resume


MAIL = "tether.mail"
"""The topic of the DBOS message that wakes an idle (permanent) run when its inbox gets one."""


def check_url(url: str) -> None:
    if not url.startswith(("sqlite:///", "postgresql://", "postgres://")):
        raise ConfigError(f"--store: {url!r} is not sqlite:///PATH or postgresql://...")


def messages_of(store: Any, run_id: str) -> list[Message]:
    """A run's conversation as far as its store has it: the history and task it started with,
    then each recorded reply and tool result; calls left open are closed as cancelled."""
    status = status_of(store, run_id)
    inputs = status.input.get("args") if isinstance(status.input, dict) else None
    if not isinstance(inputs, (list, tuple)) or len(inputs) < 3:
        return []
    history = inputs[3] if len(inputs) > 3 and inputs[3] else []
    record = inputs[1] if isinstance(inputs[1], dict) else {}
    messages: list[Message] = [*history, Message.user(inputs[2], task_images(record))]
    for step, _ in store.steps(status):
        if isinstance(step, ModelStep):
            messages.extend(Message.user(text) for _, text in step.arrived)
            messages.append(step.response.message)
            messages.extend(Message.user(text) for _, text in step.late)
        elif isinstance(step, ToolsStep):
            messages.append(Message("tool", tuple(step.results)))
        elif isinstance(step, ContextStep):
            messages = list(step.messages)
    close_open_calls(messages, "Cancelled before the tool finished.")
    return messages


def task_images(record: dict[str, Any]) -> tuple[ImagePart, ...]:
    """The images a run's task came with, as its record names them (without their bytes)."""
    return tuple(map(ImagePart.from_ref, record.get("images", ())))


class Reader:
    """A store read from a process that executes none of its runs: DBOS's client (runs, their
    status, approvals, messages) and the store's ledger (each run's recorded steps). It
    answers for the client's own methods too."""

    def __init__(self, dbos_client: Any, url: str, ledger: Ledger | None = None) -> None:
        self.client = dbos_client
        self.url = url
        self._ledger = ledger

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            self._ledger = ledger_for(self.url)
        return self._ledger

    def steps(self, status: Any) -> list[tuple[Step, float]]:
        """The recorded steps of the run with this DBOS `status`, in order, each with when it
        completed (Unix time); a run that an earlier version recorded (tether-3, before the
        ledger kept steps) has them among DBOS's."""
        run_id = status.workflow_id
        if status.app_version not in (None, VERSION):
            return [
                (
                    step_of(s["function_name"], s["output"], f"run {run_id}'s step"),
                    (s.get("completed_at_epoch_ms") or 0) / 1000,
                )
                for s in self.client.list_workflow_steps(run_id)
                if s.get("function_name") in KINDS
            ]
        return [
            (read_step(kind, out, f"run {run_id}'s step {n}"), at)
            for n, kind, out, at in self.ledger.steps_of(run_id)
        ]


def client(url: str, create: bool = False, ledger: Ledger | None = None) -> Any:
    """A reader of the store (`Reader`) for reading and messaging runs without executing any
    (a process that only lists or approves must not pick up pending runs and then exit in the
    middle of them). A SQLite file that is not there is an error, unless `create` (runs are
    being queued). `ledger`: the store's, where this process has it open already."""
    check_url(url)
    if url.startswith("sqlite"):
        path = url.removeprefix("sqlite:///")
        if create:
            try:
                private_file(path)  # transcripts: this user's only
            except OSError as e:
                raise ConfigError(f"cannot create the store {path}: {e.strerror}") from None
        elif not Path(path).exists():
            raise ConfigError(f"no store at {path}")
        sqlite_dbapi()  # a store's SQLite is there, or one line says what to install
    from dbos import DBOSClient

    # a client fails at once when the store does not answer, where DBOS's default waits for it
    # without end: a page or a `tether runs` says so instead of hanging
    store: Any = None
    try:
        with said_by_us():
            refuse_pickles()
            with scoped_sqlite():
                store = DBOSClient(
                    system_database_url=url,
                    retry_connection_errors=False,
                    serializer=RecordSerializer(),  # type: ignore[arg-type]
                )
            # DBOS's client never creates its schema; a fresh database gets it here, so runs
            # can be queued before any worker has started (one query when it is there
            # already; concurrent migrations are serialised by DBOS under an advisory lock)
            make_schema(store)
    except Exception as e:
        if store is not None:
            store.destroy()
        raise cannot_open(e) from None
    return Reader(store, url, ledger)


def status_of(store: Any, run_id: str) -> Any:
    """A run's DBOS status, read through a client; an unknown id is NoSuchRun."""
    try:
        return store.retrieve_workflow(run_id).get_status()
    except no_such_workflow_error():
        raise NoSuchRun(f"no run {run_id} in the store") from None


def events_of(store: Any, run_id: str) -> list[Event]:
    """A durable run's persisted history as events: its completed model replies and tool
    results (step outputs), the approvals it asked a person for, and its end (the workflow's
    result, or how it was stopped).

    Read again while the run goes on, the list only grows: what a new step adds comes after
    what was there (a page follows a run executed elsewhere by reading this again). So an
    approval is shown once its reply's step is read, and its decision only with the results
    of its calls; the steps are read before the approvals, which were set after them."""
    out: list[Event] = []

    def add(type: str, ts: float, **data: Any) -> None:
        out.append(Event(type, run_id, len(out), data, ts))

    status = status_of(store, run_id)
    inputs = status.input.get("args") if isinstance(status.input, dict) else None
    task = inputs[2] if isinstance(inputs, (list, tuple)) and len(inputs) > 2 else ""
    record = inputs[1] if isinstance(inputs, (list, tuple)) and len(inputs) > 1 else {}
    steps = store.steps(status)
    approvals = all_events(store, run_id)
    first = next((s.response for s, _ in steps if isinstance(s, ModelStep)), None)
    add(
        "run_started",
        (status.created_at or 0) / 1000,
        task=task,
        provider=record.get("provider") if isinstance(record, dict) else None,
        model=first.model if first is not None else None,
        agent=record.get("agent") if isinstance(record, dict) else None,
        **images_data(task_images(record) if isinstance(record, dict) else ()),
    )
    for step, at in steps:
        if isinstance(step, ModelStep):
            ts, calls = step.ended, step.response.message.tool_calls
            for _, text in step.arrived:
                add("user_message", ts, text=text)
            add("model_response", ts, **model_response_data(step.response))
            for c in calls:
                add("tool_call", ts, id=c.id, name=c.name, arguments=c.arguments or {})
            for _, text in step.late:
                add("user_message", ts, text=text)
            for c in calls:
                asked = approvals.get(approval_id(c.id))
                if isinstance(asked, dict) and "args_hash" in asked:
                    add("approval_requested", ts, **requested(c.id, asked))
        elif isinstance(step, ContextStep):
            for type_, data in step.happened:
                add(type_, at, **data)
        elif isinstance(step, ToolsStep):
            results, ts = step.results, step.ended
            for result in results:
                asked = approvals.get(approval_id(result.call_id))
                if isinstance(asked, dict) and asked.get("state") == "decided":
                    add("approval_decided", ts, **decided(result.call_id, asked))
            for result in results:
                add("tool_result", ts, **tool_result_data(result))
    end = ending(status, out)
    if end is not None:
        add("run_finished", (status.updated_at or 0) / 1000, **end)
    return out


def approval_id(call_id: str) -> str:
    """The id of the approval a call waits for (one call, one approval)."""
    return f"ap_{call_id}"


def requested(call_id: str, asked: dict[str, Any]) -> dict[str, Any]:
    """An `approval_requested` event's data from what the run recorded when it asked."""
    return {
        "approval_id": approval_id(call_id),
        "id": call_id,
        "name": asked.get("name", ""),
        "arguments": asked.get("arguments") or {},
        "args_hash": asked.get("args_hash"),
        "expires_at": None,
    }


def decided(call_id: str, asked: dict[str, Any]) -> dict[str, Any]:
    return {
        "approval_id": approval_id(call_id),
        "id": call_id,
        "approved": bool(asked.get("approved")),
        "reason": str(asked.get("reason") or "decided"),
    }


def ending(status: Any, events: list[Event]) -> dict[str, Any] | None:
    """The `run_finished` data of a run that ended: what it reported, or, for one stopped in
    the store (cancelled, or failed inside DBOS), what its recorded steps add up to."""
    if status.status == "SUCCESS" and isinstance(status.output, dict):
        return {k: v for k, v in status.output.items() if k != "messages"}
    if status.status not in ("ERROR", "CANCELLED"):
        return None
    tally = Tally()
    for event in events:
        tally(event)
    cancelled = status.status == "CANCELLED"
    reason = "cancelled" if cancelled else str(status.error or "failed")
    stopped = {"outcome": "cancelled" if cancelled else "failed", "reason": reason}
    return tally.fill(RunResult.from_dict(status.workflow_id, stopped)).summary()


class Tally:
    """Counts what a run's events show, for the end of a run cut short elsewhere."""

    def __init__(self) -> None:
        self.usage = Usage()
        self.steps = 0
        self.cost = 0.0
        self.price: Price | None = None

    def __call__(self, event: Event) -> None:
        if event.type == "run_started":
            self.price = price_for(str(event.data.get("model", "")))
        elif event.type == "model_response":
            usage = Usage.from_dict(event.data.get("usage") or {})
            self.usage = self.usage + usage
            self.cost += self.price.cost(usage) if self.price else 0.0
            self.steps += 1

    def fill(self, result: RunResult) -> RunResult:
        """`result` with the figures seen, where the store had none (a cancelled run)."""
        if result.steps == 0 and self.steps:
            result.usage, result.steps, result.cost_usd = self.usage, self.steps, self.cost
        return result


ENDED = ("SUCCESS", "ERROR", "CANCELLED")
"""The DBOS statuses of a run that has ended."""
STATES = {"ENQUEUED": "queued", "PENDING": "running", "ERROR": "failed", "CANCELLED": "cancelled"}


def executor_alive(executor_id: str) -> bool:
    """Whether a `tether run` process (by its executor id) still runs on this machine; an
    executor elsewhere, or a worker, counts as alive (its heartbeats decide)."""
    prefix = f"cli-{socket.gethostname()}-"
    if not executor_id.startswith(prefix):
        return executor_id != "local"
    pid = executor_id[len(prefix) :]
    if not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def listing(w: Any) -> dict[str, Any]:
    """One run of a store as `tether runs` shows it: what it was asked, where it stands
    (queued, running on a worker, then its outcome), when, and what it used."""
    inputs = w.input.get("args") if isinstance(w.input, dict) else None
    task = inputs[2] if isinstance(inputs, (list, tuple)) and len(inputs) > 2 else ""
    out = w.output if isinstance(w.output, dict) else {}
    state = out.get("outcome", "done") if w.status == "SUCCESS" else STATES.get(w.status)
    ended = w.status in ENDED
    queued = bool(w.queue_name)
    if not queued:
        started: float | None = (w.created_at or 0) / 1000
    else:  # a queued run starts when a worker takes it
        started = w.dequeued_at / 1000 if w.dequeued_at else None
    return {
        "id": w.workflow_id,
        "state": state or str(w.status).lower(),
        "task": task if isinstance(task, str) else "",
        "queued_at": (w.created_at or 0) / 1000 if queued else None,
        "started_at": started,
        "ended_at": ((w.completed_at or w.updated_at or 0) / 1000) if ended else None,
        "steps": out.get("steps"),
        "cost_usd": out.get("cost_usd"),
        "usage": out.get("usage"),
        "answer": out.get("answer"),
        "status": w.status,
        "executor": w.executor_id,
        "worker": w.executor_id if w.status == "PENDING" else None,
    }


def list_runs(
    store: Any, states: list[str] | None = None, limit: int | None = None
) -> list[dict[str, Any]]:
    """The runs of a store, oldest first, as `listing` shows them; `states` keeps only those
    (queued, running, waiting for approval, done, halted, failed, cancelled), asking the
    store for the matching statuses only; `limit` keeps the most recent."""
    query: dict[str, Any] = {"name": WORKFLOW}
    if states is not None:
        unknown = sorted(set(states) - set(RUN_STATES))
        if unknown:
            raise ConfigError(f"--state {', '.join(unknown)}: use {', '.join(RUN_STATES)}")
        query["status"] = sorted({RUN_STATES[s] for s in states})
    if limit is not None:
        query.update(limit=limit, sort_desc=True)
    found = store.list_workflows(**query)
    rows = [waiting_state(store, listing(w)) for w in (reversed(found) if limit else found)]
    return rows if states is None else [r for r in rows if r["state"] in states]


def waiting_state(store: Any, row: dict[str, Any]) -> dict[str, Any]:
    """`row` with the state `waiting` (and the `approvals` it waits for) if its run waits for
    a person's approval, or `interrupted` if the process executing it died: nothing executes
    it until `tether resume`, a worker or a `Runtime` on this machine takes it over. (It
    showed `running on` the dead process for ever.)"""
    if row["state"] != "running":
        return row
    waiting = approvals_waiting(store, row["id"])
    if waiting:
        row["state"] = "waiting"
        row["approvals"] = waiting
    asked = [q.id for q in questions_waiting(store.ledger, row["id"])]
    if asked:  # a tool's question for a person (`tether answer`)
        row["state"] = "waiting"
        row["questions"] = asked
    if not executor_alive(row["executor"] or ""):  # waiting or not, nothing executes it
        row["state"] = "interrupted"
        row["worker"] = None
    return row


def approvals_waiting(store: Any, run_id: str) -> list[str]:
    """The approvals a running run waits for (their requests are on the store)."""
    events = all_events(store, run_id)
    return sorted(
        k for k, v in events.items() if isinstance(v, dict) and v.get("state") == "waiting"
    )


# tether's run states, and the DBOS status each is stored as
RUN_STATES = {
    "queued": "ENQUEUED",
    "running": "PENDING",
    "waiting": "PENDING",  # for a person's approval
    "interrupted": "PENDING",  # its process died: `tether resume` goes on with it
    "done": "SUCCESS",
    "halted": "SUCCESS",
    "failed": "ERROR",
    "cancelled": "CANCELLED",
}


def answer_approval(
    store: Any, run_id: str, approval_id: str, reply: dict[str, Any], args_hash: str | None
) -> None:
    """Answer a durable run's approval request from outside (`tether approve`): only one
    that is waiting now, and with `args_hash`, only for the arguments it showed."""
    status = status_of(store, run_id)
    if status.status in ENDED:
        raise ConfigError(f"run {run_id} has ended ({status.status.lower()})")
    request = store.get_event(run_id, approval_id, timeout_seconds=0)
    if not isinstance(request, dict) or request.get("state") != "waiting":
        raise ConfigError(
            f"run {run_id} is not waiting for approval {approval_id} (decided already, or "
            "never requested)"
        )
    if args_hash is not None and args_hash != request.get("args_hash"):
        raise ConfigError(f"approval {approval_id} was shown other arguments")
    store.send(run_id, reply, approval_id)


# -- the queue --------------------------------------------------------------------------------


def enqueue(url: str, runs: list[tuple[str, str]], record: dict[str, Any]) -> None:
    """Put runs (id, task) of one record (agent, options, context) on the shared queue for
    whichever workers are free, in one transaction: all of them are recorded, or, when one
    cannot be (an id the store has already), none is. A thousand take about a second."""
    store = client(url, create=True)
    ids = [run_id for run_id, _ in runs]
    if len(set(ids)) != len(ids):
        raise ConfigError("two runs to queue have the same id")
    taken = sorted(w.workflow_id for w in store.list_workflows(workflow_ids=ids, load_input=False))
    if taken:
        shown = ", ".join(taken[:5]) + (f" and {len(taken) - 5} more" if len(taken) > 5 else "")
        raise ConfigError(f"the store has runs with these ids already: {shown}; nothing queued")
    queue = {"queue_name": QUEUE, "workflow_name": WORKFLOW, "app_version": VERSION}
    with engine(store).begin() as conn:
        for run_id, task in runs:
            options: Any = {**queue, "workflow_id": run_id}
            store.enqueue_in_transaction(conn, options, run_id, record, task)


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


def questions_waiting(ledger: Ledger, run_id: str) -> list[Question]:
    """The questions a run asked that have no answer yet, as it asked them."""
    return [Question.from_dict(orjson.loads(q), run_id) for q in ledger.unanswered(run_id)]


def ledger_for(url: str) -> Ledger:
    """The ledger of a store, for a process that only messages it (`tether send`)."""
    return Ledger(url)


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
                for event in events[len(log.events) :]:
                    log.append(event)
                if log.events and log.events[-1].type == "run_finished":
                    return
                await asyncio.sleep(POLL_S)
        except ConfigError:  # the run is gone from the store
            return
        finally:
            log.close()
            if self.logs.get(log.run_id) is log:  # read again from the store if asked again
                del self.logs[log.run_id]

    def rows(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The store's runs as `tether runs` lists them (with `limit`, the most recent)."""
        return list_runs(self.client, limit=limit)

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
        self.view.client.cancel_workflow(self.id)
        return True

    def approve(self, approval_id: str, args_hash: str | None = None) -> None:
        self.answer(approval_id, {"approved": True, "reason": "approved by the user"}, args_hash)

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
