"""A store read from outside: its runs listed, their status, events and transcripts, by a
process that executes none of them (`tether runs`, `show`, and the page of `tether serve` for
runs that workers elsewhere execute); `remote.py` acts on them.

Such a process must not launch DBOS: DBOS would make it an executor, and it would pick up
pending runs and then exit in the middle of them. It reads through a `DBOSClient`, which
executes nothing. What a store holds of a run is what completed (`steps.py` says what
each step records), so a run followed from here shows its steps as they are recorded, not
its token deltas.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any, TypeVar

import orjson

from ..approvals import Decision
from ..errors import ConfigError, NoSuchRun
from ..journal import private_file
from ..loop import close_open_calls
from ..messages import Message
from ..questions import Question
from ..result import RunResult
from ..run_filter import Cursor, Page, RunFilter
from ..tally import Tally
from .dbos_private import (
    all_events,
    make_schema,
    no_such_workflow_error,
    refuse_pickles,
    run_keys,
    status_counts,
    wake,
)
from .formats import WORKFLOW_VERSION, RunRecord, WorkflowInput
from .ledger import Ledger
from .outage import cannot_open, said_by_us
from .records import RecordSerializer
from .sqlite import scoped_sqlite, sqlite_dbapi
from .steps import KINDS, ContextStep, ModelStep, Step, ToolsStep
from .steps import built as step_of
from .steps import read as read_step
from .versions import record_in, upgraded, version_in, wanted

T = TypeVar("T")

WORKFLOW = "tether.durable_run"

MAIL = "tether.mail"
"""The topic of the DBOS message that wakes an idle (permanent) run when its inbox gets one."""


def check_url(url: str) -> None:
    if not url.startswith(("sqlite:///", "postgresql://", "postgres://")):
        raise ConfigError(f"--store: {url!r} is not sqlite:///PATH or postgresql://...")


def messages_of(store: Any, run_id: str) -> list[Message]:
    """A run's conversation as far as its store has it: the history and task it started with,
    then each recorded reply and tool result; calls left open are closed as cancelled."""
    status = status_of(store, run_id)
    given = WorkflowInput.of(status)
    if given is None:
        return []
    messages: list[Message] = [*given.history]
    if given.task is not None:  # a fork may start with no new message
        messages.append(Message.user(given.task, given.record.images))
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


class Reader:
    """A store read from a process that executes none of its runs: DBOS's client (runs, their
    status, approvals, messages) and the store's ledger (each run's recorded steps). It
    answers for the client's own methods too."""

    def __init__(self, dbos_client: Any, url: str, ledger: Ledger | None = None) -> None:
        self.client = dbos_client
        self.url = url
        self._ledger = ledger
        self._own_ledger = ledger is None  # opened here, when first asked for: closed here
        self._served: tuple[float, set[str]] | None = None

    def close(self) -> None:
        """Let go of the store: the client's connections, and the ledger it opened."""
        self.client.destroy()
        if self._own_ledger and self._ledger is not None:
            self._ledger.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def send(self, run_id: str, message: Any, topic: str) -> None:
        """DBOS's client's `send`, and the run woken at once (`dbos_private.wake`)."""
        self.client.send(run_id, message, topic)
        wake(self.client, run_id, topic)

    def served(self) -> set[str]:
        """The versions live workers execute (`agent@version`), read at most once a second."""
        now = time.monotonic()
        if self._served is None or now - self._served[0] > 1.0:
            by_worker = self.ledger.served()
            self._served = (now, {v for vs in by_worker.values() for v in vs})
        return self._served[1]

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
        if status.app_version not in (None, WORKFLOW_VERSION):
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


def version_of(store: Any, run_id: str) -> str | None:
    """The agent's version a run of the store started with (None: recorded before runs had
    versions); an unknown id is NoSuchRun."""
    return record_of_run(store, run_id).version


def record_of_run(store: Any, run_id: str) -> RunRecord:
    """What the store keeps of a run besides its task (`run.record_of`); NoSuchRun if none."""
    return record_in(status_of(store, run_id))


def decision_in(asked: Any) -> Decision | None:
    """How an approval was decided, from what the run recorded of it in the store (None: it
    was not, or never asked)."""
    if not isinstance(asked, dict) or asked.get("state") != "decided":
        return None
    return Decision(bool(asked.get("approved")), str(asked.get("reason") or "decided"))


def filled(result: RunResult, tally: Tally) -> RunResult:
    """`result` with the figures its events add up to, where the store had none (a run
    cancelled or failed in the store)."""
    if result.steps == 0 and tally.steps:
        result.usage, result.steps, result.cost_usd = tally.usage, tally.steps, tally.cost
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
    given = WorkflowInput.of(w)  # read once: the task and the record
    task, record = (given.task, given.record) if given is not None else ("", RunRecord())
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
        "agent": record.agent,
        "account": record.account_id,
        # the version it goes on under (an upgrade's, else its own); None: recorded before
        # runs had versions
        "version": wanted(record, w.queue_name) or record.version,
        "upgraded_from": record.version if upgraded(record, w.queue_name) else None,
        "queue_version": (version_in(w.queue_name) or ("", None))[1],
        "queued_at": (w.created_at or 0) / 1000 if queued else None,
        "started_at": started,
        "ended_at": ((w.completed_at or w.updated_at or 0) / 1000) if ended else None,
        "steps": out.get("steps"),
        "cost_usd": out.get("cost_usd"),
        "usage": out.get("usage"),
        "answer": out.get("answer"),
        "reason": out.get("reason") or None,  # why it halted or failed
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
        query["status"] = sorted({status for s in states for status in RUN_STATES[s]})
    if limit is not None:
        query.update(limit=limit, sort_desc=True)
    found = store.list_workflows(**query)
    rows = [waiting_state(store, listing(w)) for w in (reversed(found) if limit else found)]
    return rows if states is None else [r for r in rows if r["state"] in states]


PAGE_BATCH = 200
"""Runs read at a time to fill a page: a filter that matches one run in a thousand reads
many batches, each one keyset read and one read of those runs' records."""

SCAN_LIMIT = 5_000
"""The most runs one page reads: past it the page ends with what it found and a cursor, and
the next page reads on (a page never stalls on a filter that matches nothing in 100,000)."""


def page_runs(
    store: Any, flt: RunFilter, after: Cursor | None, limit: int, oldest_first: bool = False
) -> Page:
    """A page of the store's runs that `flt` keeps, newest first (or oldest), those past
    `after` only, as `listing` (and `waiting_state`) shows them."""
    states = sorted({st for s in flt.states if s in RUN_STATES for st in RUN_STATES[s]}) or None
    if flt.states and states is None:
        return Page([], None)  # states no store run has (idle)
    rows: list[dict[str, Any]] = []
    key = (after.at_ms, after.run_id) if after is not None else None
    scanned = 0
    wanted = RunFilter(
        agent=flt.agent, text=flt.text, account=flt.account
    )  # before its state is read in full
    while scanned < SCAN_LIMIT:
        keys = run_keys(store, WORKFLOW, states, key, PAGE_BATCH, oldest_first)
        if not keys:
            return Page(rows, None, scanned)
        found = store.list_workflows(workflow_ids=[run_id for _, run_id in keys])
        by_id = {w.workflow_id: w for w in found}
        for key in keys:
            scanned += 1
            w = by_id.get(key[1])
            if w is None:  # deleted meanwhile
                continue
            row = listing(w)
            if not wanted.matches(
                row["state"], row["id"], row["task"], row["agent"], row["account"]
            ):
                continue
            row = waiting_state(store, row)  # its own reads: for the runs shown only
            if flt.states and row["state"] not in flt.states:
                continue
            rows.append(row)
            if len(rows) == limit:
                last = key == keys[-1] and len(keys) < PAGE_BATCH  # no run is past it
                return Page(rows, None if last else Cursor(*key), scanned)
        if len(keys) < PAGE_BATCH:
            return Page(rows, None, scanned)
    return Page(rows, Cursor(*key) if key is not None else None, scanned)


COUNTED = {
    "ENQUEUED": "queued",
    "PENDING": "running",  # waiting and interrupted among them
    "SUCCESS": "done, halted or failed",  # a failed model call ends in SUCCESS too
    "ERROR": "failed",
    "CANCELLED": "cancelled",
}

EXACT_UP_TO = {"PENDING": 200, "SUCCESS": 2_000}
"""Up to how many runs of these statuses the counts read one by one, to tell waiting from
running and halted from done; past it they are counted together ("done, halted or failed"),
from the one grouped count: the counts of a store of 100,000 runs stay one query."""


def state_counts(store: Any) -> dict[str, int]:
    """How many runs the store holds in each state."""
    counts: dict[str, int] = {}
    for status, n in status_counts(store, WORKFLOW).items():
        if n > EXACT_UP_TO.get(status, 0):
            label = COUNTED.get(status, status.lower())
            counts[label] = counts.get(label, 0) + n
            continue
        for w in store.list_workflows(name=WORKFLOW, status=status, load_input=False):
            row = waiting_state(store, listing(w))
            counts[row["state"]] = counts.get(row["state"], 0) + 1
    return counts


def waiting_state(store: Any, row: dict[str, Any]) -> dict[str, Any]:
    """`row` with the state `waiting` (and the `approvals` it waits for) if its run waits for
    a person's approval, or `interrupted` if the process executing it died: nothing executes
    it until `tether resume`, a worker or a `Runtime` on this machine takes it over. (It
    showed `running on` the dead process for ever.) A queued run of a version no live worker
    executes says so (`waiting_for_version`)."""
    version = row.get("queue_version")
    if (
        version
        and row["status"] == "ENQUEUED"
        and f"{row['agent']}@{version}" not in store.served()
    ):
        row["waiting_for_version"] = version
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


RUN_STATES: dict[str, tuple[str, ...]] = {
    "queued": ("ENQUEUED",),
    "running": ("PENDING",),
    "waiting": ("PENDING",),  # for a person's approval
    "interrupted": ("PENDING",),  # its process died: `tether resume` goes on with it
    "done": ("SUCCESS",),
    "halted": ("SUCCESS",),
    "failed": ("SUCCESS", "ERROR"),  # a failed model call ends the workflow; a crash errs it
    "cancelled": ("CANCELLED",),
}
"""Tether's run states, and the DBOS statuses each is stored as: a listing asks the store for
those, then keeps the rows whose state is one asked for (`listing` tells done, halted and
failed apart by the outcome the run returned). `?state=failed` listed no run that failed on
its model call, which ends its workflow in SUCCESS."""


def questions_waiting(ledger: Ledger, run_id: str) -> list[Question]:
    """The questions a run asked that have no answer yet, as it asked them."""
    return [Question.from_dict(orjson.loads(q), run_id) for q in ledger.unanswered(run_id)]


def ledger_for(url: str) -> Ledger:
    """The ledger of a store, for a process that only messages it (`tether send`)."""
    return Ledger(url)


async def orphans(run_ids: list[str] | None = None) -> dict[str, str]:
    """Runs this machine's `tether` processes were executing when they died: run id ->
    its dead executor (with `run_ids`, only among those)."""
    from dbos import DBOS

    pending = await DBOS.list_workflows_async(
        status="PENDING", workflow_ids=run_ids, load_input=False, load_output=False
    )
    host = f"cli-{socket.gethostname()}-"
    owners = {w.workflow_id: w.executor_id or "" for w in pending}
    return {
        run_id: owner
        for run_id, owner in owners.items()
        if owner.startswith(host) and not executor_alive(owner)
    }
