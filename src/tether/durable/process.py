"""This process's side of a store: `DurableRuns` executes runs (started here, recovered after a
crash, or taken from the queue), keeps their live events on a bus, and answers for their handles
(`run.DurableRun`). It launches DBOS on the store, registers the run's workflow, watches the store
for runs cancelled elsewhere and for a store that stopped answering, and takes over the runs of
this machine's dead processes. The workflow's body is `execute.execute_run`.

Starting returns only once the run is recorded (accepted means durable). DBOS allows one store
per process, so its workflow finds its owner through `active()`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from ..admission import Limiter
from ..agent import Agent
from ..background import Background
from ..bus import Bus
from ..errors import ConfigError, NoSuchRun, RunExists, StoreUnavailable, TetherError, known
from ..events import Event, Sink
from ..journal import private_file
from ..messages import ImagePart, Message
from ..result import RunResult
from ..run import forget_old
from ..tools.session import close_kept
from ..tools.tool import Spawn
from ..tree import Allowance
from . import notices
from .accounts import StoredAccounts
from .dbos_private import cancelled_errors, id_in_use_error, refuse_pickles, result_of
from .execute import Executor, Resolver, execute_run
from .formats import WORKFLOW_VERSION, RunRecord
from .ledger import Ledger
from .outage import (
    POSTGRES_CONNECT_ARGS,
    STORE_PATIENCE_S,
    QuietStoreLog,
    cancelled_among,
    cannot_open,
    unavailable,
)
from .rates import StoredRates
from .records import RecordSerializer
from .remote import StoreView
from .run import DurableRun
from .sqlite import sqlite_engine_kwargs
from .versions import HandedBack, Serving, route
from .view import (
    ENDED,
    WORKFLOW,
    check_url,
    client,
    executor_alive,
    filled,
    orphans,
    status_of,
)

T = TypeVar("T")

APP = "tether"
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

    It holds one `DurableRun` per run followed or executing here (each keeps what its execution
    needs), and the background tasks (followers, MCP holders, messages sent), which are cancelled
    when it closes. One per process, for one store (DBOS's own rule)."""

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
        self.abandoned: set[str] = set()  # runs stopped for want of the store, to queue again
        self.unserved_said: set[str] = set()  # queued runs a worker here said it cannot take
        self.run_slots = run_slots
        self.limiter_for = limiter_for or (lambda agent: None)
        self.keep_finished = keep_finished
        self.finished: deque[str] = deque()
        self.url = url
        self.resolve = resolve
        self.executor_id = executor_id or process_executor_id()
        self.named = executor_id is not None  # a name another process may have had before
        self.serving: Callable[[], Serving] = Serving
        """The versions this process executes (`versions.py`): the Runtime's agents'."""
        self.working = False
        """Whether this process is a `tether worker` (it says each run it starts and ends)."""
        self.bus = Bus()
        self.runs: dict[str, DurableRun] = {}  # the runs followed here, by id: their handles
        self.executing: dict[str, DurableRun] = {}  # the runs executing here, by id
        self.parents: dict[str, Allowance] = {}
        """The allowance of the run that starts a child run (`tree`), by the child's id: given
        before the child starts (or is found again after a crash), taken as it executes."""
        self.spawner: Callable[[str], Spawn] | None = None
        """How a run's tools start child runs, by the run's approvals policy (the Runtime's)."""
        self.background = Background()  # the process's own tasks beside its runs
        self.watcher: asyncio.Task[None] | None = None  # see watch
        self.view: StoreView | None = None  # the store read as from outside, once open
        self._ledger: Ledger | None = None
        self.accounts: StoredAccounts | None = None  # accounts' budgets, in the ledger
        self.rates: StoredRates | None = None  # endpoints' rate limits, in the ledger

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
            self.accounts = StoredAccounts(self._ledger)
            self.rates = StoredRates(self._ledger)
            self.launch()
            self.view = StoreView(self.url, self._ledger)
            if self._ledger.engine is not None:  # the rates' changes and mail, as they commit
                self.spawn(self._ledger.notices.listen(self.url))
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
            "application_version": WORKFLOW_VERSION,
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
        if self.named:  # its runs of versions this process does not have go to their queues
            reader = client(self.url, create=True)
            try:
                route(reader, [self.executor_id], self.serving())
            finally:
                reader.destroy()
        DBOS.launch()
        _launched = self.url

    async def close(self) -> None:
        """Stop following runs and cancel the background tasks; runs still going stay
        recorded, and `resume` (or a worker, or the next runtime here) finishes them."""
        global _active
        if self.view is not None:
            await self.view.close()
        await self.background.close()
        if _active is self:
            _active = None

    @property
    def ledger(self) -> Ledger:
        return known(self._ledger, "the store's ledger (the store is open)")

    @property
    def reader(self) -> Any:
        """The client that reads the store (one per process, the view's)."""
        return known(self.view, "the store's view (the store is open)").client

    def spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run `work` as a task of its own, in a fresh context: inside a workflow's, DBOS would
        take what it does for part of that workflow, and the replay would no longer match."""
        return self.background.spawn(work)

    # -- starting, resuming, following ------------------------------------------------------

    async def start(
        self,
        record: RunRecord,
        task: str | None,
        run_id: str,
        sinks: list[Sink],
        history: list[Message] | None = None,
        chosen: bool = True,
        typed: Callable[[Any], Any] | None = None,
        images: tuple[ImagePart, ...] = (),
    ) -> DurableRun:
        """Start a run executed by this process; returns once the run is recorded. An id the
        store has already is refused as the run is recorded (DBOS's `reject` policy: no read
        first); a generated one (not `chosen`) cannot be there. `typed` makes the recorded
        output (JSON) the agent's output type again. The task's `images` are kept once,
        beside the record, which names them."""
        from dbos import DBOS, SetWorkflowID

        if images:
            await self.ledger.call(self.ledger.keep_images, list(images))
            record = dataclasses.replace(record, images=tuple(i.hollow() for i in images))
        if run_id in self.runs:  # it ran here: the store has it
            raise taken(run_id)
        run = self.attach(run_id, sinks)
        run.typed = typed
        run.fresh = True
        run.mail_before = self.ledger.notices.mark(notices.MAIL)  # before the store has the run
        try:
            with SetWorkflowID(run_id, workflow_id_reuse_policy="reject" if chosen else None):
                given = record.to_dict()
                started = DBOS.start_workflow_async(workflow(), run_id, given, task, history)
                handle = await self.in_time(started)
        except (StoreUnavailable, id_in_use_error()) as e:
            self.forget_start(run_id)
            if isinstance(e, StoreUnavailable):
                raise
            raise taken(run_id) from None
        self.spawn(self.follow(run, handle))  # "queued" until it starts (its events say so)
        return run

    def forget_start(self, run_id: str) -> None:
        """Undo `attach` for a run that could not start."""
        self.runs.pop(run_id, None)
        self.bus.logs.pop(run_id, None)

    def attach(
        self, run_id: str, sinks: list[Sink], before: list[Event] | None = None
    ) -> DurableRun:
        """A handle for a run and its live events here (bus, handle, `sinks`); `before`: the
        events a page showed of it already (numbering goes on from there). A run a worker
        executes here, that nobody here followed, is followed from now on."""
        old = self.runs.get(run_id)
        if old is not None and old.alive:
            raise RunExists(f"a live run already has the id {run_id!r}")
        run = self.executing.get(run_id)
        if run is not None and not run.followed:
            run.follow_with(sinks, before or [])
        else:
            run = DurableRun(self, run_id, sinks, before)
        self.runs[run_id] = run
        return run

    async def follow(self, run: DurableRun, handle: Any) -> None:
        """Wait for the run's end and report it (a run executed elsewhere, or one that had
        ended already, reports its end here from the store)."""
        try:
            data: dict[str, Any] = await result_of(handle)
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
            run.emitter.run_finished(**filled(result, run.tally).summary())
        run.result = result
        run.status = result.outcome
        run.log.close()
        run.sinks = []
        run.ended.set()
        if forget_old(self.finished, self.keep_finished, self.runs, self.bus.logs, run.id):
            run.keep()

    async def resume(self, run_id: str, sinks: list[Sink], force: bool = False) -> DurableRun:
        """Continue a run here: one whose process died (still PENDING in the store) is
        recovered; one cancelled or failed is resumed; one that ended reports its end."""
        from dbos import DBOS

        here = self.runs.get(run_id)
        if here is not None and here.alive:  # executed here already (taken over on entering)
            here.emitter.watch(sinks)
            return here
        status = await asyncio.to_thread(status_of, self.reader, run_id)
        if status.app_version not in (None, WORKFLOW_VERSION) and status.status not in ENDED:
            raise ConfigError(
                f"run {run_id} was recorded by another version of Tether ({status.app_version}, "
                f"this one writes {WORKFLOW_VERSION}): its steps are kept differently, so "
                "resuming it here could repeat what it had completed; finish it with the "
                "version that started it"
            )
        if status.status == "PENDING":
            owner = status.executor_id or "local"
            if owner != self.executor_id and executor_alive(owner) and not force:
                raise ConfigError(
                    f"run {run_id} is being executed by {owner}; it is not lost, so not resumed "
                    "(--force takes it over if that process is gone)"
                )
        run = self.attach(run_id, sinks)
        run.emitter.run_resumed()
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
        moved = await asyncio.to_thread(
            route, self.reader, sorted(set(found.values())), self.serving()
        )
        found = {run_id: owner for run_id, owner in found.items() if run_id not in moved}
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
        here = self.executing.get(run_id)
        if here is None and self.accounts is not None:  # its worker may be dead: see cancel_run
            await self.accounts.release(run_id)
        stopped = here.stop_here() if here is not None else None
        if stopped is not None:
            await asyncio.wait([stopped], timeout=10.0)

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
            executing = [
                run.id for run in self.executing.values() if run.task and not run.task.done()
            ]
            if not executing:
                answered = time.monotonic()
            elif probe is None:
                probe = cancelled_among(executing)
            elif time.monotonic() - answered > self.patience:
                self.give_up(executing)

    def stop(self, run_ids: list[str], lost: bool = False) -> None:
        """Stop runs executing here now: cancelled, or (`lost`) for want of the store."""
        for run_id in run_ids:
            run = self.executing.get(run_id)
            if run is None or run.task is None:
                continue
            if lost:
                run.lost = unavailable(self.patience, self.quiet.cause, run_id)
                self.abandoned.add(run_id)
            run.stop_here()

    def give_up(self, run_ids: list[str]) -> None:
        """The store has not answered for the patience: the runs executing here stop waiting
        for it. Each ends `failed` with StoreUnavailable here (its effects say so, see
        `RecordedEffects.stopped`) and stays PENDING in the store, as a crash would leave it:
        `resume` (or a worker, `work`) goes on from its last recorded step. Stopping the
        runs keeps them from doing more that the store cannot record."""
        lost = unavailable(self.patience, self.quiet.cause)
        say(f"tether: {lost}; {len(run_ids)} runs executing here stop waiting for it")
        self.stop(run_ids, lost=True)

    def get(self, run_id: str) -> DurableRun:
        run = self.runs.get(run_id)
        if run is None:
            raise NoSuchRun(f"no run {run_id!r}")
        return run

    # -- executing a run (the workflow's body) ----------------------------------------------

    async def execute(
        self, run_id: str, record: RunRecord, task: str | None, history: list[Message] | None
    ) -> dict[str, Any]:
        if not self.working:
            return await self.execute_here(run_id, record, task, history)
        # a worker says what it takes and how each run ended: its log is where an operator
        # looks first (it printed nothing per run)
        shown = " ".join(task.split()) if task is not None else f"a fork of {record.forked_from}"
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
        self, run_id: str, record: RunRecord, task: str | None, history: list[Message] | None
    ) -> dict[str, Any]:
        """Execute the run here, with its handle if it has one here (else one nobody here
        follows: its log on the bus goes when it ends)."""
        run = self.runs.get(run_id)
        if run is None or not run.alive:
            run = DurableRun(self, run_id)
        self.executing[run_id] = run
        # so that a cancel here or in the store can stop the run at once
        run.task = asyncio.current_task()
        self.watch()
        how = Executor(
            self.resolve,
            self.run_slots,
            self.limiter_for,
            self.spawner,
            self.parents.get,
            self.accounts,
            self.rates,
        )
        try:
            return await execute_run(how, run, record, task, history)
        except HandedBack as e:  # not recorded: the run's row is its queue's again
            return {"outcome": "not here", "reason": f"{e}; it is back on its version's queue"}
        finally:
            self.forget(run)

    def forget(self, run: DurableRun) -> None:
        """Drop what this process kept for executing a run (it serves many runs)."""
        if self.executing.get(run.id) is run:
            del self.executing[run.id]
        ctx = run.done_executing()
        if ctx is not None and ctx.kept:  # what its tools left running ends with the run here
            self.spawn(close_kept(ctx.kept))
        self.parents.pop(run.id, None)
        if not run.followed and self.bus.logs.get(run.id) is run.log:  # nobody here follows it
            del self.bus.logs[run.id]


def say(line: str) -> None:
    """A line for the operator (a worker's log, the terminal of `tether run`)."""
    print(line, file=sys.stderr, flush=True)


_workflow: Any = None


def workflow() -> Any:
    """The run's DBOS workflow, registered with DBOS once per process."""
    global _workflow
    if _workflow is None:
        from dbos import DBOS

        @DBOS.workflow(name=WORKFLOW)
        async def durable_run(
            run_id: str,
            record: dict[str, Any],
            task: str | None,
            history: list[Message] | None = None,
        ) -> dict[str, Any]:
            """`record`: a `RunRecord`'s JSON; `history`: the conversation before `task` (a
            turn of `tether ask`)."""
            return await active().execute(run_id, RunRecord.of(record), task, history)

        _workflow = durable_run
    return _workflow


_launched: str | None = None
_quiet = QuietStoreLog()  # on DBOS's log once it launches, for as long as its threads (the process)


def process_executor_id() -> str:
    return f"cli-{socket.gethostname()}-{os.getpid()}"


def taken(run_id: str) -> RunExists:
    """A start refused because the store has a run of that id (ids are a store's for good)."""
    return RunExists(
        f"the store has a run {run_id!r} already: a new run needs another id, or none "
        "(a run a crash left goes on with resume)"
    )
