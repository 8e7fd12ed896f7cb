"""Durable runs on DBOS Transact: a run is a workflow; its model calls and tool calls are steps.

    async with Runtime(store="sqlite:///runs.sqlite", agents=[agent]) as rt:  (see runtime.py)
        run = await rt.start("billing", "Charge order A-7", run_id="a-7")   (kill -9 it anywhere)
    ... await rt.resume("a-7")                                  (no completed step repeats)

The workflow runs the same driver as a run in memory (`agent.execute`), over `RecordedEffects`:
each effect (a model call, fitting the context, the tool calls of a reply) is a recorded step,
so there is one loop, and what differs is only how an effect is performed. DBOS keeps the run's
life (its start, end and status, recovery, queues, durable messages for approvals); the steps
are numbered in the order the run takes them and recorded in the ledger (`ledger.py`, with
group commit), which costs a fraction of a DBOS step. A store records the
agent's name, the run's options (for agents built from options) and context, never a Python
object or a command line (`record_of`, versioned); any process that registers the agent can
execute the run. `DurableRuns` owns what a process keeps in memory for the runs it executes.

What is persisted is what completed: each model reply and each tool result (token deltas are
only streamed live). Each model call is a step; the parallel calls of one reply share one step,
and each of them is also journaled on its own (`ledger.py`): started before it runs, its result
when it ends. After a crash DBOS runs the workflow again and the run replays: completed steps
return their recorded output, the first unfinished step runs again, and inside a tool step a
call the journal shows finished gives back its result instead of running again. A call
that started but never finished is rerun if its tool is idempotent; any other gives the model
an "outcome unknown" error: a payment is never made twice silently. Tools get an idempotency
key (`run_id:call_id`, in `RunContext.idempotency_key`) for the at-least-once window that
remains (the moment between a tool's effect and its journal entry).

User messages wait in the ledger's inbox; each model step takes those that arrived and records
them with its reply. Approvals travel as durable DBOS messages. Starting returns only once the
run is recorded (accepted means durable).

SQLite stores need SQLite 3.42 or newer (DBOS uses `unixepoch('subsec')`); where Python's own is
older, the bundled one of `pysqlite3-binary` is used, for Tether's connections only (`sqlite`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import os
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from .admission import Limiter
from .agent import Agent, RunResult, execute, judge, respond
from .approvals import ApprovalRequest, Decision, arguments_hash, needs_approval
from .bus import Bus, EventLog
from .context import fit
from .dbos_private import cancelled_errors, id_in_use_error, listen_to, refuse_pickles
from .errors import (
    ApprovalError,
    ConfigError,
    NoSuchRun,
    ProviderError,
    RunEnded,
    RunExists,
    StoreUnavailable,
    TetherError,
)
from .events import Emitter, Event, Sink, model_response_data, tool_result_data
from .guardrails import Kind, Verdict
from .journal import private_file
from .ledger import CallState, Ledger
from .loop import LoopState, unique_calls
from .messages import (
    ImagePart,
    Message,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolResult,
    filled,
    hollow,
    hollow_result,
)
from .outage import (
    POSTGRES_CONNECT_ARGS,
    STORE_PATIENCE_S,
    QuietStoreLog,
    cannot_open,
    cause_of,
    said_by_us,
    unavailable,
)
from .records import RecordSerializer
from .run import RestartPolicy, after_attempt, forget_old
from .sqlite import sqlite_engine_kwargs
from .steps import (
    KIND_OF,
    ContextStep,
    GuardStep,
    InboxStep,
    ModelStep,
    Step,
    ToolsStep,
    kind_of,
)
from .steps import read as read_step
from .steps import record as step_record
from .store import (
    ENDED,
    MAIL,
    QUEUE,
    VERSION,
    WORKFLOW,
    StoreView,
    Tally,
    approval_id,
    check_url,
    executor_alive,
    messages_of,
    status_of,
    task_images,
)
from .tools.session import close_kept
from .tools.tool import RunContext, Spawn
from .tree import Allowance

T = TypeVar("T")
S = TypeVar("S", bound=Step)

APP = "tether"


# -- what a store records of a run -----------------------------------------------------------

FORMAT = 1
"""The version of a run's record (below); a reader refuses a record of another version."""

Resolver = Callable[[str, "dict[str, Any] | None"], Awaitable[Agent]]
"""Finds a run's agent: by its name among the registered ones, or built from the run's options
(`options.RunOptions`, as the CLI and the page record them) by the runtime's factory."""

APPROVALS = ("wait", "auto", "deny")
IDLE_WAIT_S = 24 * 3600.0
CONNECTIONS = 20
"""The connections to the store a process executes runs over: DBOS's pool and, as many, the
ledger's. DBOS records each step from a thread of its pool of threads, and that pool is
unbounded by default: 1,000 runs at once on Postgres made hundreds of threads wait for 20
connections, time out after 30 s and stall every run (#20). Bounded to as many threads as
connections, a step waits for a thread instead, in order and without a time-out. Runs beyond
what the threads keep up with wait in the executor's queue, not in the pool; `max_runs`
bounds how many execute at once besides."""
CANCEL_POLL_S = 0.5
"""How soon a run executing here stops once it is cancelled in the store from elsewhere; the
same query tells that the store answers (see `watch`)."""


def record_of(
    agent: Agent,
    options: dict[str, Any] | None,
    context: RunContext,
    approvals: str = "wait",
    restart: RestartPolicy | None = None,
) -> dict[str, Any]:
    """What the store keeps of a run besides its task: the agent's name (and the options it
    was built from, if it was), the JSON parts of its context, and how approvals are decided.
    Nothing here depends on how a command line spells its flags."""
    if approvals not in APPROVALS:
        raise ConfigError(f"approvals: {approvals!r} is not one of {', '.join(APPROVALS)}")
    return {
        "format": FORMAT,
        "agent": agent.name,
        "options": options,
        "approvals": approvals,
        "restart": dataclasses.asdict(restart or RestartPolicy()),
        "workspace": str(Path(context.workspace).resolve()),
        "account_id": context.account_id,
        "config": context.config,
        "provider": agent.model.provider,
        "model": agent.model.name,
        **context.lineage(),
    }


def context_of(run_id: str, record: dict[str, Any]) -> RunContext:
    return RunContext(
        run_id=run_id,
        workspace=Path(record["workspace"]),
        account_id=record.get("account_id"),
        config=dict(record.get("config") or {}),
    )


# -- the process's durable runs ---------------------------------------------------------------

_active: DurableRuns | None = None
"""The store this process executes runs of. DBOS keeps one registry of workflows per process,
so its steps find their owner here; everything else belongs to that owner."""


def active() -> DurableRuns:
    if _active is None:
        raise ConfigError("no durable store is open in this process")
    return _active


class DurableRuns:
    """This process's side of a store: it executes runs (started here, recovered after a crash,
    or taken from the queue), keeps their live events on a bus, and answers for their handles.

    It owns what executing runs needs in memory: the agents of running runs, their emitters and
    tasks, which runs have stepped here (their replay is behind them), which tool calls were
    announced, and the background tasks (followers, MCP holders, approvals sent), which are
    cancelled when it closes. One per process, for one store (DBOS's own rule)."""

    def __init__(
        self,
        url: str,
        resolve: Resolver,
        executor_id: str | None = None,
        *,
        run_slots: Limiter | None = None,
        limiter_for: Callable[[Agent], Limiter | None] | None = None,
        keep_finished: int | None = 10_000,
        connections: int = CONNECTIONS,
        patience: float = STORE_PATIENCE_S,
    ) -> None:
        """`run_slots` bounds the runs this process executes at once (the rest wait, visibly);
        `limiter_for` gives the bound on concurrent calls to an agent's model endpoint;
        `keep_finished`: how many ended runs keep their handle and events here.
        `connections`: see `CONNECTIONS`. `patience`: how many seconds runs wait for a
        store that stopped answering (see `outage`)."""
        check_url(url)
        if connections < 1:
            raise ConfigError(f"connections: {connections} is not a positive number")
        if not patience > 0:
            raise ConfigError(f"patience: {patience} is not a positive number of seconds")
        self.connections = connections
        self.patience = patience
        self.quiet = _quiet  # DBOS's log, quiet about the store while DBOS runs (the process)
        self.lost: dict[str, StoreUnavailable] = {}  # runs stopped here for want of the store
        self.abandoned: set[str] = set()  # those of them a worker puts back on the queue
        self.run_slots = run_slots
        self.limiter_for = limiter_for or (lambda agent: None)
        self.keep_finished = keep_finished
        self.finished: deque[str] = deque()
        self.url = url
        self.resolve = resolve
        self.executor_id = executor_id or process_executor_id()
        self.working = False
        """Whether this process is a `tether worker` (it says each run it starts and ends)."""
        self.bus = Bus()
        self.runs: dict[str, StoredRun] = {}
        self.agents: dict[str, Agent] = {}  # run id -> agent, while the run executes here
        self.contexts: dict[str, RunContext] = {}  # run id -> its tools' context, likewise
        self.emitters: dict[str, Emitter] = {}
        self.parents: dict[str, Allowance] = {}
        """The allowance of the run that started a child run (`tree`), by the child's id."""
        self.spawner: Callable[[str], Spawn] | None = None
        """How a run's tools start child runs, by the run's approvals policy (the Runtime's)."""
        self.watchers: dict[str, list[Sink]] = {}
        """The sinks a run was started or resumed with here: its children's events go there
        too (an agent used as a tool runs inside the call, see `agent.run_child`)."""
        self.tasks: dict[str, asyncio.Task[Any]] = {}
        self.stepped: set[str] = set()
        self.fresh: set[str] = set()
        """Runs started here that have not executed yet: nothing is recorded of them to read."""
        self.shown: dict[str, set[str]] = {}
        self.background: set[asyncio.Task[Any]] = set()
        self.watcher: asyncio.Task[None] | None = None  # see watch
        self.view: StoreView | None = None  # the store read as from outside, once open
        self._ledger: Ledger | None = None

    # -- lifetime ---------------------------------------------------------------------------

    def open(self) -> None:
        """Register the workflow, launch DBOS on the store, open the ledger. DBOS recovers this
        executor's pending runs as it launches, so everything they need is set up first."""
        global _active
        if _active is not None and _active is not self:
            raise ConfigError("one durable store per process is open already")
        if self.url.startswith("sqlite"):
            private_file(self.url.removeprefix("sqlite:///"))  # transcripts: this user's only
        workflow()
        try:
            self._ledger = Ledger(self.url, self.connections)
            self.launch()
            self.view = StoreView(self.url, self._ledger)
        except TetherError:
            raise
        except Exception as e:
            raise cannot_open(e) from None
        _active = self

    def launch(self) -> None:
        global _launched
        if _launched is not None:
            if _launched != self.url:
                raise ConfigError("one store per process")
            return
        from dbos import DBOS

        config: dict[str, Any] = {
            "name": APP,
            "system_database_url": self.url,
            "log_level": "WARNING",
            "notification_listener_polling_interval_sec": 0.05,
            "application_version": VERSION,
            "executor_id": self.executor_id,
            # as many threads as connections: a thread never waits for one (see CONNECTIONS)
            "sys_db_pool_size": self.connections,
            "max_executor_threads": self.connections,
            "serializer": RecordSerializer(),  # records are data (see `records`)
        }
        if self.url.startswith("sqlite"):
            config["db_engine_kwargs"] = sqlite_engine_kwargs(self.url)
        else:
            config["db_engine_kwargs"] = {"connect_args": dict(POSTGRES_CONNECT_ARGS)}
        refuse_pickles()
        DBOS(config=config)  # type: ignore[arg-type]
        _quiet.install()
        # DBOS 3 has every launched process dequeue from every queue the store knows: a
        # `tether run` or `tether serve` would take queued runs and exit in their middle.
        # Only a worker takes them (`work` adds the queue).
        DBOS.listen_queues([])
        DBOS.launch()
        _launched = self.url

    async def close(self) -> None:
        """Stop following runs and cancel the background tasks; runs still going stay
        recorded, and `resume` (or a worker, or the next runtime here) finishes them."""
        global _active
        if self.view is not None:
            await self.view.close()
        for task in list(self.background):
            task.cancel()
        if self.background:
            await asyncio.wait(self.background, timeout=5.0)
        if _active is self:
            _active = None

    @property
    def ledger(self) -> Ledger:
        assert self._ledger is not None, "open the store first"
        return self._ledger

    @property
    def reader(self) -> Any:
        """The client that reads the store (one per process, the view's)."""
        assert self.view is not None, "open the store first"
        return self.view.client

    def spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run `work` as a task of its own, in a fresh context: inside a workflow's, DBOS would
        take what it does for part of that workflow, and the replay would no longer match."""
        task = asyncio.get_running_loop().create_task(work, context=contextvars.Context())
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return task

    # -- starting, resuming, following ------------------------------------------------------

    async def start(
        self,
        record: dict[str, Any],
        task: str,
        run_id: str,
        sinks: list[Sink],
        history: list[Message] | None = None,
        chosen: bool = True,
        typed: Callable[[Any], Any] | None = None,
        images: tuple[ImagePart, ...] = (),
    ) -> StoredRun:
        """Start a run executed by this process; returns once the run is recorded. An id the
        store has already is refused as the run is recorded (DBOS's `reject` policy: no read
        first); a generated one (not `chosen`) cannot be there. `typed` makes the recorded
        output (JSON) the agent's output type again. The task's `images` are kept once,
        beside the record, which names them."""
        from dbos import DBOS, SetWorkflowID

        if images:
            await self.ledger.call(self.ledger.keep_images, list(images))
            record = {**record, "images": [i.ref for i in images]}
        if run_id in self.runs:  # it ran here: the store has it
            raise RunExists(f"the store has a run {run_id!r} already; resume it or use another id")
        run = self.attach(run_id, sinks)
        run.typed = typed
        self.fresh.add(run_id)
        try:
            with SetWorkflowID(run_id, workflow_id_reuse_policy="reject" if chosen else None):
                started = DBOS.start_workflow_async(workflow(), run_id, record, task, history)
                handle = await self.in_time(started)
        except (StoreUnavailable, id_in_use_error()) as e:
            self.forget_start(run_id)
            if isinstance(e, StoreUnavailable):
                raise
            raise RunExists(
                f"the store has a run {run_id!r} already; resume it or use another id"
            ) from None
        self.spawn(self.follow(run, handle))  # "queued" until it starts (its events say so)
        return run

    def forget_start(self, run_id: str) -> None:
        """Undo `attach` for a run that could not start."""
        self.fresh.discard(run_id)
        self.runs.pop(run_id, None)
        self.bus.logs.pop(run_id, None)
        self.emitters.pop(run_id, None)
        self.watchers.pop(run_id, None)

    def attach(
        self, run_id: str, sinks: list[Sink], before: list[Event] | None = None
    ) -> StoredRun:
        """A handle for a run and its live events here (bus, handle, `sinks`); `before`: the
        events a page showed of it already (numbering goes on from there)."""
        old = self.runs.get(run_id)
        if old is not None and old.alive:
            raise RunExists(f"a live run already has the id {run_id!r}")
        run = self.runs[run_id] = StoredRun(self, run_id)
        log = self.bus.logs[run_id] = EventLog(run_id)
        log.events.extend(before or ())
        emitter = self.emitters[run_id] = Emitter(run_id, [log.append, run.track, *sinks])
        emitter.seq = len(log.events)
        self.watchers[run_id] = list(sinks)
        return run

    async def follow(self, run: StoredRun, handle: Any) -> None:
        """Wait for the run's end and report it (a run executed elsewhere, or one that had
        ended already, reports its end here from the store)."""
        try:
            data: dict[str, Any] = await handle.get_result()
        except asyncio.CancelledError:
            this = asyncio.current_task()
            if this is not None and this.cancelling():
                raise  # the runtime closes; the run stays recorded
            data = {"outcome": "cancelled", "reason": "cancelled"}
        except Exception as e:  # cancelled in the store, or failed inside DBOS
            cancelled = isinstance(e, cancelled_errors())
            outcome = "cancelled" if cancelled else "failed"
            data = {"outcome": outcome, "reason": str(e) or outcome}
        if run.summary is not None:  # it ended here, and said how
            data = {**run.summary, "messages": data.get("messages") or run.kept}
        result = RunResult.from_dict(run.id, data)
        if run.typed is not None and result.output is not None:
            result.output = run.typed(result.output)
        if not result.messages:
            result.messages = run.transcript
        if run.summary is None:
            self.emitter_for(run.id).emit("run_finished", **run.tally.fill(result).summary())
        run.result = result
        run.status = result.outcome
        self.bus.log(run.id).close()
        self.watchers.pop(run.id, None)
        run.ended.set()
        forget_old(self.finished, self.keep_finished, self.runs, self.bus.logs, run.id)

    async def resume(self, run_id: str, sinks: list[Sink], force: bool = False) -> StoredRun:
        """Continue a run here: one whose process died (still PENDING in the store) is
        recovered; one cancelled or failed is resumed; one that ended reports its end."""
        from dbos import DBOS

        here = self.runs.get(run_id)
        if here is not None and here.alive:  # executed here already (taken over on entering)
            self.emitters[run_id].sinks.extend(sinks)
            return here
        status = await asyncio.to_thread(status_of, self.reader, run_id)
        if status.app_version not in (None, VERSION) and status.status not in ENDED:
            raise ConfigError(
                f"run {run_id} was recorded by another version of Tether ({status.app_version}, "
                f"this one writes {VERSION}): its steps are kept differently, so resuming it "
                "here could repeat what it had completed; finish it with the version that "
                "started it"
            )
        if status.status == "PENDING":
            owner = status.executor_id or "local"
            if owner != self.executor_id and executor_alive(owner) and not force:
                raise ConfigError(
                    f"run {run_id} is being executed by {owner}; it is not lost, so not resumed "
                    "(--force takes it over if that process is gone)"
                )
        run = self.attach(run_id, sinks)
        self.emitter_for(run_id).emit("run_resumed")
        if status.status == "PENDING" and owner == self.executor_id:  # stopped here (give_up)
            await DBOS.resume_workflow_async(run_id)
        elif status.status == "PENDING":
            await asyncio.to_thread(DBOS._recover_pending_workflows, [owner])
        elif status.status != "SUCCESS":
            await DBOS.resume_workflow_async(run_id)
        handle: Any = await DBOS.retrieve_workflow_async(run_id)
        run.status = "running"
        self.spawn(self.follow(run, handle))
        return run

    async def take_over(
        self,
        run_ids: list[str] | None = None,
        sinks: list[Sink] | None = None,
        before: dict[str, list[Event]] | None = None,
    ) -> list[str]:
        """Take over, in this process, the runs that this machine's dead processes were
        executing (with `run_ids`, only among those); the run ids taken. With `sinks`, the
        runs get handles here and their events go to `sinks` (see `attach` for `before`)."""
        from dbos import DBOS

        found = await orphans(run_ids)
        if sinks is not None:
            for run_id in found:
                shown = (before or {}).get(run_id)
                self.attach(run_id, sinks, shown).status = "running"
        for executor in sorted(set(found.values())):
            await asyncio.to_thread(DBOS._recover_pending_workflows, [executor])
        if sinks is not None:
            for run_id in found:
                handle: Any = await DBOS.retrieve_workflow_async(run_id)
                self.spawn(self.follow(self.runs[run_id], handle))
        return sorted(found)

    async def cancel(self, run_id: str) -> None:
        """Cancel a run in the store and, if this process executes it, stop it now (DBOS itself
        stops a cancelled run only at its next step) and wait for it to report its end."""
        from dbos import DBOS

        await DBOS.cancel_workflow_async(run_id)
        task = self.tasks.pop(run_id, None)
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=10.0)

    async def in_time[T](self, work: Awaitable[T]) -> T:
        """`work` (a request to the store), or StoreUnavailable after the patience."""
        try:
            return await asyncio.wait_for(work, self.patience)
        except TimeoutError:
            raise unavailable(self.patience, self.quiet.cause) from None

    def watch(self) -> None:
        """Start (once) the task that watches the store for the runs executing here. It reads
        the store every `CANCEL_POLL_S`, and only while runs execute, for two things:
        - a run cancelled in the store from elsewhere (`tether cancel`, the page on another
          machine) stops at once: DBOS by itself stops it only at its next step, after a
          tool call or an approval that may take hours;
        - a store that has not answered for the patience: the runs stop waiting for it
          (`give_up`)."""
        if self.watcher is None or self.watcher.done():
            self.watcher = self.spawn(self.watching())

    async def watching(self) -> None:
        answered = time.monotonic()
        probe: asyncio.Future[list[str]] | None = None
        while True:
            await asyncio.sleep(CANCEL_POLL_S)
            if probe is not None and probe.done():
                cancelled = None if probe.exception() else probe.result()
                probe = None
                if cancelled is not None:
                    answered = time.monotonic()
                    self.stop(cancelled)
            executing = [run_id for run_id, task in self.tasks.items() if not task.done()]
            if not executing:
                answered = time.monotonic()
            elif probe is None:
                probe = cancelled_among(executing)
            elif time.monotonic() - answered > self.patience:
                self.give_up(executing)

    def stop(self, run_ids: list[str], lost: bool = False) -> None:
        """Stop runs executing here now: cancelled, or (`lost`) for want of the store."""
        for run_id in run_ids:
            task = self.tasks.pop(run_id, None)
            if task is None:
                continue
            if lost:
                self.lost[run_id] = unavailable(self.patience, self.quiet.cause, run_id)
                self.abandoned.add(run_id)
            task.cancel()

    def give_up(self, run_ids: list[str]) -> None:
        """The store has not answered for the patience: the runs executing here stop waiting
        for it. Each ends `failed` with StoreUnavailable here (its effects say so, see
        `RecordedEffects.stopped`) and stays PENDING in the store, as a crash would leave it:
        `resume` (or a worker, `work`) goes on from its last recorded step. Stopping the
        runs keeps them from doing more that the store cannot record."""
        lost = unavailable(self.patience, self.quiet.cause)
        say(f"tether: {lost}; {len(run_ids)} runs executing here stop waiting for it")
        self.stop(run_ids, lost=True)

    def get(self, run_id: str) -> StoredRun:
        run = self.runs.get(run_id)
        if run is None:
            raise NoSuchRun(f"no run {run_id!r}")
        return run

    # -- executing a run (the workflow's body) ----------------------------------------------

    async def execute(
        self, run_id: str, record: dict[str, Any], task: str, history: list[Message] | None
    ) -> dict[str, Any]:
        if not self.working:
            return await self.execute_here(run_id, record, task, history)
        # a worker says what it takes and how each run ended: its log is where an operator
        # looks first (it printed nothing per run)
        shown = " ".join(task.split())
        say(f"tether worker {self.executor_id}: run {run_id} started: {shown[:70]}")
        ended = "failed (see its events)"
        try:
            summary = await self.execute_here(run_id, record, task, history)
            ended = str(summary.get("outcome", "done"))
            reason = summary.get("reason")
            ended += f" ({reason})" if reason else ""
            return summary
        except asyncio.CancelledError:
            ended = "stopped here (it stays in the store)"
            raise
        finally:
            say(f"tether worker {self.executor_id}: run {run_id} ended {ended}")

    async def execute_here(
        self, run_id: str, record: dict[str, Any], task: str, history: list[Message] | None
    ) -> dict[str, Any]:
        if record.get("format") != FORMAT:
            raise ConfigError(f"run {run_id} was recorded in another format")
        this = asyncio.current_task()
        if this is not None:  # so that a cancel here or in the store can stop the run at once
            self.tasks[run_id] = this
            self.watch()
        try:
            agent = self.agents[run_id] = await self.resolve(record["agent"], record["options"])
            ctx = self.contexts[run_id] = context_of(run_id, record)
            ctx.tree_sinks = self.watchers.get(run_id, [])
            ctx.parent = self.parents.get(run_id)
            if self.spawner is not None:
                ctx.spawn = self.spawner(record.get("approvals", "wait"))
            if self.run_slots is None:
                return await self.attempts(run_id, record, agent, task, history)
            emitter = self.emitter_for(run_id)

            def queued(position: int) -> None:
                emitter.emit("queued", what="run", position=position)

            async with self.run_slots.slot(queued) as waited:
                if waited:
                    emitter.emit("admitted", what="run")
                return await self.attempts(run_id, record, agent, task, history)
        finally:
            self.forget(run_id)

    async def attempts(
        self,
        run_id: str,
        record: dict[str, Any],
        agent: Agent,
        task: str,
        history: list[Message] | None,
    ) -> dict[str, Any]:
        """One attempt after another, as the run's restart policy says (`run.after_attempt`,
        on the recorded clock); a permanent run idles between answers for the next message.
        Each attempt goes on with the conversation so far."""
        policy = RestartPolicy(**(record.get("restart") or {}))
        emitter = self.emitter_for(run_id)
        if "parent_run_id" in record:
            emitter.lineage = {k: record[k] for k in ("parent_run_id", "root_run_id")}
        effects = RecordedEffects(self, run_id, record, agent)
        if run_id not in self.fresh:
            effects.replay(await self.ledger.call(self.ledger.steps_of, run_id))
        self.fresh.discard(run_id)
        messages = await self.filled([*(history or []), Message.user(task, task_images(record))])
        restarts: deque[float] = deque()
        first: str | None = task
        attempt = 1
        ctx = self.contexts[run_id]
        while True:
            state = agent.new_state(messages)
            state.allowance = ctx.allowance = agent.allowance(run_id, ctx.parent)
            try:
                result = await execute(agent, state, first, emitter, effects)
            except asyncio.CancelledError:
                self.keep(run_id, messages)
                raise
            first = None
            after = after_attempt(policy, result.outcome, restarts, effects.now())
            if after == "end":
                return recorded(result)
            if after == "give_up":
                emitter.emit(
                    "gave_up", restarts=len(restarts), within=policy.within, reason=result.reason
                )
                return recorded(result)
            if after == "restart":
                attempt += 1
                emitter.emit("restarting", attempt=attempt, reason=result.reason)
                continue
            try:
                await effects.next_message()
            except asyncio.CancelledError:  # cancelled while idle: no attempt reports it
                ended = dataclasses.replace(result, outcome="cancelled", reason="cancelled")
                emitter.emit("run_finished", **ended.summary())
                self.keep(run_id, messages)
                raise

    async def filled(self, messages: list[Message]) -> list[Message]:
        """`messages` with the bytes of their images read back (records hold them hollow)."""
        wanted = sorted({i.sha256 for m in messages for i in m.images if i.data is None})
        if not wanted:
            return messages
        found = await self.ledger.call(self.ledger.images, wanted)
        lost = [h[:12] for h in wanted if h not in found]
        if lost:
            raise RuntimeError(f"the store has lost the bytes of image(s) {', '.join(lost)}")
        return [filled(m, found) for m in messages]

    def keep(self, run_id: str, messages: list[Message]) -> None:
        """What a run cancelled here had completed, for its handle."""
        followed = self.runs.get(run_id)
        if followed is not None:
            followed.kept = list(messages)

    def emitter_for(self, run_id: str) -> Emitter:
        """The run's live emitter here: one numbering across all its steps. A run nobody here
        follows (a worker's) gets a bus log that goes when the run ends."""
        emitter = self.emitters.get(run_id)
        if emitter is None:
            emitter = self.emitters[run_id] = Emitter(run_id, [self.bus.log(run_id).append])
        return emitter

    def forget(self, run_id: str) -> None:
        """Drop what this process kept for executing a run (it serves many runs)."""
        self.tasks.pop(run_id, None)
        self.agents.pop(run_id, None)
        ctx = self.contexts.pop(run_id, None)
        if ctx is not None and ctx.kept:  # what its tools left running ends with the run here
            self.spawn(close_kept(ctx.kept))
        self.stepped.discard(run_id)
        self.fresh.discard(run_id)
        self.parents.pop(run_id, None)
        self.shown.pop(run_id, None)
        self.lost.pop(run_id, None)
        if run_id not in self.runs:  # nobody here follows it
            self.watchers.pop(run_id, None)
            self.emitters.pop(run_id, None)
            self.bus.logs.pop(run_id, None)

    def announce(self, run_id: str, calls: list[ToolCall]) -> None:
        """Emit `tool_call` for the calls not yet announced by this process."""
        emitter = self.emitter_for(run_id)
        shown = self.shown.setdefault(run_id, set())
        toolbox = self.agents[run_id].toolbox
        for c in calls:
            if c.id not in shown:
                shown.add(c.id)
                emitter.emit("tool_call", **toolbox.call_data(c, run_id))

    # -- workers ----------------------------------------------------------------------------

    async def work(self, concurrency: int, beat: float, dead_after: float) -> None:
        """Run queued runs until cancelled. Every `beat` seconds this worker records that it is
        alive, and recovers the runs of any worker silent for `dead_after` seconds (DBOS's open
        source edition does not move a dead executor's runs by itself)."""
        from dbos import DBOS

        await DBOS.register_queue_async(QUEUE, worker_concurrency=concurrency)
        self.working = True
        listen_to(QUEUE)
        name = self.executor_id
        while True:
            try:
                dead = await self.beat(name, dead_after)
                await self.tend(name, dead)  # recovering hundreds of runs takes its time
            except Exception as e:
                say(f"tether worker {name}: {type(e).__name__}: {cause_of(str(e))}; goes on")
            await asyncio.sleep(beat)

    async def beat(self, name: str, dead_after: float) -> list[str]:
        """Record that this worker is alive; the workers that stopped beating, to recover.
        The beat also tells whether the store answers: one that has not after the patience
        is said once, and the worker waits for it. The beat is never cancelled, for it forgets
        the dead workers it returns: its answer must not be lost."""
        beating = asyncio.ensure_future(self.ledger.call(self.ledger.beat, name, dead_after))
        done, _ = await asyncio.wait({beating}, timeout=self.patience)
        if done:
            return beating.result()
        since = time.monotonic() - self.patience
        cause = self.quiet.cause or "no reply"
        say(f"tether worker {name}: the store does not answer ({cause}); waiting")
        dead = await beating
        waited = time.monotonic() - since
        say(f"tether worker {name}: the store answers again (after {waited:.0f} s)")
        return dead

    async def tend(self, name: str, dead: list[str]) -> None:
        """A worker's round after its beat: take over the runs of dead processes here,
        recover the runs of the workers that stopped beating (`dead`), and queue again the
        runs this worker stopped when the store did not answer (`give_up`), now that it does."""
        from dbos import DBOS

        taken = await self.take_over()  # runs of `tether run` processes that died here
        if taken:
            say(
                f"tether worker {name}: took over {len(taken)} runs whose process died: "
                f"{', '.join(taken)}"
            )
        if dead:
            recovered = await asyncio.to_thread(DBOS._recover_pending_workflows, dead)
            say(
                f"tether worker {name}: executors {', '.join(dead)} stopped beating; "
                f"recovered {len(recovered)} runs"
            )
        if self.abandoned:
            runs = sorted(self.abandoned)
            for run_id in runs:
                await DBOS.resume_workflow_async(run_id, queue_name=QUEUE)
                self.abandoned.discard(run_id)
            say(
                f"tether worker {name}: queued again {len(runs)} runs stopped while the store "
                f"did not answer: {', '.join(runs)}"
            )


def cancelled_among(run_ids: list[str]) -> asyncio.Future[list[str]]:
    """Which of `run_ids` are cancelled in the store, asked from a thread of its own: while
    the store does not answer, DBOS's call waits for it, and a daemon thread that waits does
    not hold up the process's exit (the default executor's threads would)."""
    from dbos import DBOS

    loop = asyncio.get_running_loop()
    answer: asyncio.Future[list[str]] = loop.create_future()

    def settle(found: list[str] | None, error: BaseException | None) -> None:
        if answer.done():
            return
        if error is not None:
            answer.set_exception(error)
        else:
            answer.set_result(found or [])

    def ask() -> None:
        found, error = None, None
        try:
            rows = DBOS.list_workflows(
                workflow_ids=run_ids, status="CANCELLED", load_input=False, load_output=False
            )
            found = [w.workflow_id for w in rows]
        except Exception as e:
            error = e
        with contextlib.suppress(RuntimeError):  # the loop closed while the store kept us
            loop.call_soon_threadsafe(settle, found, error)

    threading.Thread(target=ask, name="tether-store-watch", daemon=True).start()
    return answer


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class StoredRun:
    """A durable run as this process sees it: its status and live events, and what can be
    asked of it (the same surface as a `Run` in memory). Messages go to the store's inbox,
    approvals travel as the run's durable messages, a cancel stops it in the store and here."""

    def __init__(self, owner: DurableRuns, run_id: str) -> None:
        self.owner = owner
        self.id = run_id
        self.status = "queued"
        self.result: RunResult | None = None
        self.pending: dict[str, ApprovalRequest] = {}
        self.ended = asyncio.Event()
        self.summary: dict[str, Any] | None = None  # its run_finished, once seen here
        self.kept: list[Message] = []  # the transcript of a run cancelled here
        self.typed: Callable[[Any], Any] | None = None  # see DurableRuns.start
        self.tally = Tally()

    @property
    def alive(self) -> bool:
        return not self.ended.is_set()

    def waiting(self) -> list[ApprovalRequest]:
        return list(self.pending.values())

    @property
    def transcript(self) -> list[Message]:
        if self.result is not None and self.result.messages:
            return list(self.result.messages)
        try:
            return messages_of(self.owner.reader, self.id)
        except NoSuchRun:
            return []

    def track(self, event: Event) -> None:
        d = event.data
        self.tally(event)
        if event.type == "approval_requested":
            call = ToolCall(d["id"], d["name"], d["arguments"], "")
            self.pending[d["approval_id"]] = ApprovalRequest(
                d["approval_id"], call, arguments_hash(d["name"], d["arguments"]), None
            )
        elif event.type == "approval_decided":
            self.pending.pop(d["approval_id"], None)
        elif event.type == "run_finished":
            self.summary = dict(event.data)
        elif event.type == "idle":
            self.status = "idle"
        elif event.type in ("run_started", "admitted"):
            self.status = "running"
        elif event.type == "queued" and event.data.get("what") == "run":
            self.status = "queued"

    def send(self, text: str) -> None:
        if self.ended.is_set():
            raise RunEnded(f"run {self.id} has ended ({self.status}); start a new one")
        from dbos import DBOS

        seq = self.owner.ledger.send(self.id, text)  # announced when the run takes it
        self.owner.spawn(DBOS.send_async(self.id, seq, topic=MAIL))  # wakes it if idle

    def approve(self, approval_id: str, args_hash: str | None = None) -> None:
        self.answer(approval_id, True, "approved by the user", args_hash)

    def deny(self, approval_id: str, reason: str = "denied by the user") -> None:
        self.answer(approval_id, False, reason, None)

    def answer(self, approval_id: str, approved: bool, reason: str, args_hash: str | None) -> None:
        """Send the answer to the run as its durable message, and only then take the request
        off `waiting()`. When the store does not take it, StoreUnavailable says so and the
        request stays waiting (sent from a task, the answer was gone from `waiting()` and
        the caller told it worked, when it never reached the run)."""
        request = self.pending.get(approval_id)
        if request is None:
            raise ApprovalError(f"no approval {approval_id!r} is waiting (decided or expired)")
        if args_hash is not None and args_hash != request.args_hash:
            raise ApprovalError(f"approval {approval_id!r} was shown other arguments")
        reply = {"approved": approved, "reason": reason}
        assert self.owner.view is not None  # open while this process executes runs
        try:  # the store's client: it fails at once when the store does not answer
            with said_by_us():
                self.owner.view.client.send(self.id, reply, approval_id)
        except Exception as e:
            raise StoreUnavailable(
                f"the answer to {approval_id} did not reach the store: {cause_of(str(e))}; "
                "the call still waits for it"
            ) from None
        self.pending.pop(approval_id, None)

    def cancel(self) -> bool:
        if self.ended.is_set():
            return False
        self.owner.spawn(self.owner.cancel(self.id))
        return True

    async def wait(self) -> RunResult:
        await self.ended.wait()
        assert self.result is not None
        return self.result


# -- the workflow and its steps ----------------------------------------------------------------

UNKNOWN_OUTCOME = (
    "Outcome unknown: this call started before a crash and may or may not have taken effect. "
    "It was not run again; check its effect before retrying."
)


def recorded(result: RunResult) -> dict[str, Any]:
    """The workflow's output: the result, its images without their bytes (kept beside)."""
    out = result.to_dict()
    out["messages"] = [hollow(m) for m in result.messages]
    return out


class RecordedEffects:
    """The driver's effects in a durable run (see `agent.Effects`): each a recorded step (see
    `step`), so a replay after a crash gets the same answers without the work. The clock is the
    recorded time of the last step, so reading it costs no step of its own."""

    def __init__(
        self, owner: DurableRuns, run_id: str, record: dict[str, Any], agent: Agent
    ) -> None:
        self.owner, self.run_id, self.record, self.agent = owner, run_id, record, agent
        self.clock = 0.0  # until the first model call (its recorded start), no time has passed
        self.seen = 0  # the last inbox message delivered
        self.n = 0  # the number of the next step
        self.recorded: dict[int, tuple[str, bytes]] = {}  # what a replay has yet to go through

    guard_beside_model = False  # its steps must keep one order: the guardrails ask first

    def replay(self, steps: list[tuple[int, str, bytes, float]]) -> None:
        """Go through these recorded steps (the ledger's, in order) before doing any work."""
        self.recorded = {n: (kind, output) for n, kind, output, _ in steps}

    async def step(self, kind: type[S], work: Callable[[], Awaitable[S]]) -> S:
        """The run's next step (of the step type `kind`, `steps.py`): what was recorded of it, or
        `work` done and recorded (with the steps of other runs that complete at the same
        moment: `ledger.Writer`). A step recorded as another kind means that the agent's code
        no longer takes the same path: the replay stops there instead of pairing answers with
        the wrong questions."""
        n, self.n = self.n, self.n + 1
        found = self.recorded.pop(n, None)
        if found is not None:
            recorded = read_step(found[0], found[1], f"run {self.run_id}'s step {n}")
            if not isinstance(recorded, kind):
                raise RuntimeError(
                    f"run {self.run_id}: step {n} was recorded as {found[0]} and is now "
                    f"{KIND_OF[kind]}; the agent's code changed since the run started"
                )
            return recorded
        self.owner.stepped.add(self.run_id)  # live from here: its events are shown
        out = await work()
        await self.owner.ledger.record_step(self.run_id, n, kind_of(out), step_record(out))
        return out

    def now(self) -> float:
        return self.clock

    def stopped(self) -> StoreUnavailable | None:
        return self.owner.lost.get(self.run_id)

    def told(self, text: str) -> None:
        if self.run_id in self.owner.stepped:  # live: a replay's watchers saw it already
            self.owner.emitter_for(self.run_id).emit("user_message", text=text, by="check")

    async def guard(self, kind: Kind, value: Any) -> list[Verdict]:
        found = await self.step(GuardStep, lambda: guard_step(self.owner, self.run_id, kind, value))
        return [Verdict.from_dict(v) for v in found.verdicts]

    async def fit(self, state: LoopState, force: bool) -> None:
        messages = list(state.messages)
        out = await self.step(
            ContextStep, lambda: context_step(self.owner, self.run_id, messages, force)
        )
        state.messages[:] = await self.owner.filled(out.messages)
        self.agent.charge(state, out.usage)

    async def call_model(self, state: LoopState) -> ModelResponse:
        request = self.agent.request(state)
        out = await self.step(
            ModelStep, lambda: model_step(self.owner, self.run_id, request, self.seen)
        )
        self.clock = out.ended
        if state.steps == 0:
            state.started_at = out.began
        # the messages went in before the reply: the transcript says so too
        state.messages.extend(Message.user(text) for _, text in out.arrived)
        state.inbox.extend(text for _, text in out.late)  # after the answer
        self.seen = max([self.seen, *(n for n, _ in out.arrived + out.late)])
        return out.response

    async def run_tools(self, state: LoopState, calls: list[ToolCall]) -> list[ToolResult]:
        if self.run_id in self.owner.stepped:  # while the run replays, its watchers saw these
            self.owner.announce(self.run_id, calls)
        decisions = await self.decide(calls)
        # live since an earlier step (the reply, or the guardrails after it): a step is
        # recorded before the next begins, so no earlier attempt can have started these calls
        fresh = self.run_id in self.owner.stepped
        out = await self.step(
            ToolsStep, lambda: tools_step(self.owner, self.run_id, calls, decisions, fresh)
        )
        results, self.clock = out.results, out.ended
        if not any(r.images for r in results):
            return list(results)
        (message,) = await self.owner.filled([Message("tool", tuple(results))])
        return message.tool_results

    async def next_message(self) -> None:
        """Idle (a permanent run between answers; `idle` is announced) until the inbox has a
        message the run has not seen; the next model call takes it. A wake-up is a DBOS
        message, so the wait survives restarts; the inbox is read in a step, so a replay sees
        what the run saw."""
        from dbos import DBOS

        idle = False
        while not (
            await self.step(InboxStep, lambda: inbox_step(self.owner, self.run_id, self.seen))
        ).unseen:
            if not idle:
                self.owner.emitter_for(self.run_id).emit("idle")
                idle = True
            await DBOS.recv_async(MAIL, timeout_seconds=IDLE_WAIT_S)

    async def decide(self, calls: list[ToolCall]) -> list[Decision | None]:
        """Approvals are decided in the workflow, durably: a waiting call survives restarts.
        Every call of the reply is put to the user at once and each is decided on its own; the
        answers are taken in the order of the calls (they wait as messages until then)."""
        from dbos import DBOS

        emitter = self.owner.emitter_for(self.run_id)
        policy = self.record.get("approvals", "wait")
        decisions: list[Decision | None] = [None] * len(calls)
        waiting: list[tuple[int, ToolCall, str]] = []
        for i, call in enumerate(calls):
            tool = self.agent.toolbox.tools.get(call.name)
            if tool is None or not needs_approval(tool.approval, call.arguments):
                continue
            ap = approval_id(call.id)
            shown = shown_of(call)
            if policy == "wait":  # what `tether approve` checks an answer against
                await DBOS.set_event_async(ap, {**shown, "state": "waiting"})
            emitter.emit(
                "approval_requested",
                approval_id=ap,
                id=call.id,
                name=call.name,
                arguments=call.arguments or {},
                args_hash=shown["args_hash"],
                expires_at=None,
            )
            if policy == "auto":
                decisions[i] = Decision(True, "approved by policy (--approve auto)")
            elif policy == "deny":
                decisions[i] = Decision(False, "denied by policy (--approve deny)")
            else:
                waiting.append((i, call, ap))
                continue
            decided(emitter, ap, call, decisions[i])
        for i, call, ap in waiting:
            answer = await DBOS.recv_async(ap, timeout_seconds=24 * 3600)
            if answer is None:
                decision = Decision(False, "the approval expired")
            else:
                decision = Decision(bool(answer.get("approved")), str(answer.get("reason", "")))
            decisions[i] = decision
            # what it showed stays, with the answer: a page following the store shows both
            await DBOS.set_event_async(
                ap,
                {
                    **shown_of(call),
                    "state": "decided",
                    "approved": decision.approved,
                    "reason": decision.reason,
                },
            )
            decided(emitter, ap, call, decision)
        return decisions


def shown_of(call: ToolCall) -> dict[str, Any]:
    """What a person is asked to approve, and what `tether approve` checks an answer against."""
    return {
        "name": call.name,
        "arguments": call.arguments,
        "args_hash": arguments_hash(call.name, call.arguments),
    }


def decided(emitter: Emitter, approval_id: str, call: ToolCall, decision: Decision | None) -> None:
    assert decision is not None
    emitter.emit(
        "approval_decided",
        approval_id=approval_id,
        id=call.id,
        approved=decision.approved,
        reason=decision.reason,
    )


async def model_step(
    owner: DurableRuns, run_id: str, request: ModelRequest, seen: int
) -> ModelStep:
    """One model call, with the user messages that arrived since message `seen`: the recorded
    output says which went in, so a replay delivers the same ones."""
    agent, ledger = owner.agents[run_id], owner.ledger
    emitter = owner.emitter_for(run_id)
    arrived = await ledger.call(ledger.messages_after, run_id, seen)
    if arrived:
        extra = tuple(Message.user(text) for _, text in arrived)
        request = dataclasses.replace(request, messages=request.messages + extra)
        for _, text in arrived:
            emitter.emit("user_message", text=text)
    emitter.emit("model_request", messages=len(request.messages))

    def on_retry(attempt: int, delay: float, e: ProviderError) -> None:
        emitter.emit("retry", attempt=attempt, delay=round(delay, 3), error=e.to_dict())

    def on_text(text: str) -> None:
        emitter.emit("text_delta", text=text)

    began = time.time()
    limiter = owner.limiter_for(agent)
    response = await respond(agent.model, request, emitter, limiter, on_text, on_retry)
    response = unique_calls(response, request.messages)  # recorded so: a replay agrees
    emitter.emit("model_response", **model_response_data(response))
    late: list[tuple[int, str]] = []
    if not response.message.tool_calls:  # an answer: a message sent meanwhile reopens it
        late = await ledger.call(
            ledger.messages_after, run_id, max([seen, *(n for n, _ in arrived)])
        )
        for _, text in late:
            emitter.emit("user_message", text=text)
    return ModelStep(response, began, time.time(), arrived, late)


async def context_step(
    owner: DurableRuns, run_id: str, messages: list[Message], force: bool
) -> ContextStep:
    """Fit the conversation to the model's window (`context.fit`): the new messages, the
    summary call's usage, and what was replaced, recorded as one step."""
    agent = owner.agents[run_id]
    assert agent.context is not None
    live = owner.emitter_for(run_id)
    happened: list[tuple[str, dict[str, Any]]] = []

    def keep(event: Event) -> None:
        happened.append((event.type, event.data))
        live.emit(event.type, **event.data)

    usage = await fit(
        agent.model, messages, agent.system, agent.context, Emitter(run_id, [keep]), force
    )
    return ContextStep([hollow(m) for m in messages], usage, happened)


async def tools_step(
    owner: DurableRuns,
    run_id: str,
    calls: list[ToolCall],
    decisions: list[Decision | None],
    fresh: bool,
) -> ToolsStep:
    """The calls of one reply, at the same time, in one recorded step; each call is journaled
    on its own (see `ledger.py`), so a step made again repeats no finished call. `fresh`: the
    reply was made here, so no earlier attempt can have started its calls (none is read)."""
    owner.announce(run_id, calls)  # those a replay passed over silently
    ledger = owner.ledger
    ids = [c.id for c in calls]
    if fresh:
        await ledger.start_fresh(run_id, ids)
        started: dict[str, tuple[CallState, ToolResult | None]] = {i: ("fresh", None) for i in ids}
    else:
        started = await ledger.call(ledger.start_calls, run_id, ids)
    results = await asyncio.gather(
        *(
            one_call(owner, run_id, c, d, *started[c.id])
            for c, d in zip(calls, decisions, strict=True)
        )
    )
    return ToolsStep(list(results), time.time())


async def inbox_step(owner: DurableRuns, run_id: str, seen: int) -> InboxStep:
    """Whether the run's inbox has a message after message `seen`."""
    ledger = owner.ledger
    return InboxStep(bool(await ledger.call(ledger.messages_after, run_id, seen)))


async def guard_step(owner: DurableRuns, run_id: str, kind: Kind, value: Any) -> GuardStep:
    """The verdicts of the agent's guardrails of `kind`, recorded: a replay asks none."""
    found = await judge(owner.agents[run_id], kind, value, owner.emitter_for(run_id))
    return GuardStep([v.to_dict() for v in found])


async def one_call(
    owner: DurableRuns,
    run_id: str,
    call: ToolCall,
    decision: Decision | None,
    state: str,
    recorded: ToolResult | None,
) -> ToolResult:
    agent = owner.agents[run_id]
    emitter = owner.emitter_for(run_id)
    tool = agent.toolbox.tools.get(call.name)
    if recorded is not None:
        result = recorded
    elif state == "interrupted" and tool is not None and not tool.idempotent:
        result = ToolResult(call.id, call.name, UNKNOWN_OUTCOME, is_error=True)
    else:
        ctx = dataclasses.replace(owner.contexts[run_id])
        ctx.idempotency_key = f"{run_id}:{call.id}"
        ctx.emitter = emitter  # the call's progress and questions are the run's events
        ctx.model = agent.model  # what an MCP server samples is the run's model
        approver = None
        if decision is not None:

            async def given(request: Any) -> Decision:
                return decision

            approver = given
        # decided in the workflow (`decide`), which told the watchers already
        result = await agent.toolbox.run(call, ctx, approver)
    if recorded is None:
        if result.images:  # kept once; the records name them
            await owner.ledger.call(owner.ledger.keep_images, list(result.images))
        await owner.ledger.finish_call(run_id, result)
    emitter.emit("tool_result", **tool_result_data(result))
    return hollow_result(result)


_workflow: Any = None


def workflow() -> Any:
    """The run's DBOS workflow, registered with DBOS once per process."""
    global _workflow
    if _workflow is None:
        from dbos import DBOS

        @DBOS.workflow(name=WORKFLOW)
        async def durable_run(
            run_id: str, record: dict[str, Any], task: str, history: list[Message] | None = None
        ) -> dict[str, Any]:
            """`history`: the conversation before `task` (a turn of `tether ask`)."""
            return await active().execute(run_id, record, task, history)

        _workflow = durable_run
    return _workflow


_launched: str | None = None
_quiet = QuietStoreLog()  # on DBOS's log once it launches, for as long as its threads (the process)


def process_executor_id() -> str:
    return f"cli-{socket.gethostname()}-{os.getpid()}"


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
