"""A Run: one asyncio task that owns a conversation and reads a mailbox; and `supervise`, the
one supervision loop of a run in memory and of a run on a store.

The mailbox takes user messages (queued while the model or tools are busy, delivered together
before the next model call, never lost), approvals and denials, and cancel, which takes effect
at once, inside a model stream or a tool call too. Everything the run does is an event in its
log, numbered from 0, which any number of subscribers follow (see `bus`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from .admission import SLOT, Limiter, Slot
from .agent import Agent
from .approvals import ApprovalDesk, ApprovalRequest, Approver
from .bus import EventLog
from .compact import Compact, compact, expand
from .errors import RunEnded
from .events import Emitter
from .messages import ImagePart, Message, Usage
from .result import RunResult, compact_result, expand_result
from .tools.tool import RunContext

Status = Literal["queued", "running", "idle", "done", "halted", "cancelled", "failed"]


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """What to do when a run's attempt ends, as an OTP supervisor does for a child.

    temporary: never restart. transient: restart after a failure. permanent: restart after a
    failure, and after an answer stay alive, idle, for the next message. At most `max_restarts`
    restarts within `within` seconds; one more and the supervisor gives up and reports it.
    """

    mode: Literal["temporary", "transient", "permanent"] = "temporary"
    max_restarts: int = 3
    within: float = 60.0


TEMPORARY = RestartPolicy()
"""The default: one policy for every run given none (it is frozen), not one object a run."""

After = Literal["end", "idle", "restart", "give_up"]


def after_attempt(policy: RestartPolicy, outcome: str, restarts: deque[float], now: float) -> After:
    """What to do when a run's attempt ends with `outcome` (OTP's restart strategy as a pure
    decision; the same for runs in memory and in a store). `restarts` holds the times of the
    recent restarts and is updated; `now` is the run's clock."""
    if outcome == "cancelled":
        return "end"
    if outcome != "failed":
        return "idle" if policy.mode == "permanent" else "end"
    if policy.mode == "temporary":
        return "end"
    while restarts and now - restarts[0] > policy.within:
        restarts.popleft()
    if len(restarts) >= policy.max_restarts:
        return "give_up"
    restarts.append(now)
    return "restart"


class Attempts(Protocol):
    """A run's side of `supervise`: how it makes an attempt, idles, and reads its clock."""

    @property
    def emitter(self) -> Emitter: ...

    async def attempt(self, task: str | None) -> RunResult:
        """One go of the agent loop; `task` on the first attempt only (later attempts go on
        with the conversation so far)."""
        ...

    async def idle(self) -> None:
        """Wait for the next message (a permanent run between answers)."""
        ...

    def cancelled_idle(self, last: RunResult) -> None:
        """Cancelled while idle: no attempt reports it, so this does (`last`: the last one)."""
        ...

    def now(self) -> float:
        """The run's clock, which the restart intensity is measured on."""
        ...


async def supervise(
    run: Attempts, policy: RestartPolicy, task: str | None, slots: Limiter | None
) -> RunResult:
    """A run's life, as an OTP supervisor keeps a child's: wait for a slot among `slots` (the
    runs a process executes at once), then one attempt after another as `policy` says
    (`after_attempt`), idling between answers for a permanent run, until it ends or the
    supervisor gives up. The same for a run in memory (`Supervisor`) and on a store
    (`durable.execute`). Returns the last attempt's result."""
    async with admitted(slots, run):
        restarts: deque[float] = deque()
        attempt = 1
        while True:
            result = await run.attempt(task)
            task = None
            after = after_attempt(policy, result.outcome, restarts, run.now())
            if after == "end":
                return result
            if after == "give_up":
                run.emitter.gave_up(
                    restarts=len(restarts), within=policy.within, reason=result.reason
                )
                return result
            if after == "restart":
                attempt += 1
                run.emitter.restarting(attempt=attempt, reason=result.reason)
                continue
            try:
                await run.idle()
            except asyncio.CancelledError:
                run.cancelled_idle(result)
                raise


NO_SLOTS = contextlib.nullcontext()

NO_MORE: Any = ()
"""A kept run's transcript list (it reads `kept`) and inbox (it is sent nothing more): one
empty tuple shared, where two lists a run were objects more for every full collection to walk,
10,000 ended runs kept by default; appending to it fails, as a bug should."""

NO_DESK = ApprovalDesk()
"""A kept run's desk when it was asked nothing: every answer to it is refused as never asked
(no run asks it: the run has ended). A desk that decided something is kept, to say how."""


def admitted(slots: Limiter | None, run: Attempts) -> contextlib.AbstractAsyncContextManager[None]:
    """Hold one of `slots` (if any) for the run's life; a run that waits for one says so
    (`queued`, then `admitted`). With no bound, nothing: a generator-based context manager a
    run was three objects more held while it ran."""
    return NO_SLOTS if slots is None else slot_of(slots, run)


@contextlib.asynccontextmanager
async def slot_of(slots: Limiter, run: Attempts) -> AsyncIterator[None]:
    def queued(position: int) -> None:
        run.emitter.queued(what="run", position=position)

    waited = await slots.acquire(queued)
    slot = Slot(slots)
    token = SLOT.set(slot)  # the run's task's: it may step aside (`admission.aside`)
    try:
        if waited:
            run.emitter.admitted(what="run")
        yield
    finally:
        SLOT.reset(token)
        slot.give_back()


def cancelled_summary(last: RunResult | None, run_id: str) -> dict[str, Any]:
    """The `run_finished` of a run cancelled where no attempt reports it (queued or idle)."""
    last = last or RunResult(run_id, "cancelled", "", "", Usage(), 0.0, 0, [])
    return dataclasses.replace(last, outcome="cancelled", reason="cancelled").summary()


def forget_old(
    finished: deque[str],
    keep: int | None,
    runs: dict[str, Any],
    logs: dict[str, EventLog],
    run_id: str,
) -> bool:
    """Remember `run_id` as ended, and forget the oldest ended runs past `keep` (their handles
    and event logs); None keeps them all. Whether the run is kept (not at once forgotten)."""
    if keep is None:
        return True
    finished.append(run_id)
    while len(finished) > keep:
        old = finished.popleft()
        run = runs.get(old)
        if run is not None and not run.alive:  # the id may have been reused since
            del runs[old]
            logs.pop(old, None)
    return run_id in runs


class Run:
    def __init__(
        self,
        run_id: str,
        agent: Agent,
        task: str | None,
        log: EventLog,
        *,
        context: RunContext | None = None,
        approver: Approver | None = None,
        approval_ttl: float | None = None,
        restart: RestartPolicy | None = None,
        transcript: list[Message] | None = None,
        images: tuple[ImagePart, ...] = (),
    ) -> None:
        self.id = run_id
        self.agent = agent
        self.task = task
        self.images = images
        self.log = log
        self.context = context or RunContext(run_id=run_id)
        self.context.run_id = run_id
        self.emitter = Emitter(run_id, log=log)
        self.emitter.seq = len(log)  # an id reused after its run ended: one stream
        self.desk = ApprovalDesk(approval_ttl)
        self.approver: Approver = approver or self.desk
        self.restart = restart or TEMPORARY
        self.history: list[Message] = transcript if transcript is not None else []
        """The conversation, extended in place while the run runs (`transcript` reads it)."""
        self.inbox: list[str] = []
        self.mail: asyncio.Event | None = None
        """Set when a message arrives; made when the run first idles (most runs never do)."""
        self.status: Status = "queued"
        self.last: RunResult | None = None
        """The last attempt's result (`result` reads it)."""
        self.kept: Compact | None = None
        """An ended run's transcript, compact (`keep`); None while it runs."""
        self.kept_result: Compact | None = None
        """An ended run's result, compact (`keep`); None before one."""
        self.attempts = 0
        self.task_handle: asyncio.Task[RunResult] | None = None
        self.watchers: list[asyncio.Future[RunResult | None]] | None = None
        """Who waits for the run to end (`wait`), each on a future of its own."""
        self.forget: Callable[[str], bool] | None = None
        """Told the run's id when it has ended (its supervisor keeps the latest ended runs);
        says whether it keeps this one."""
        self.limiter: Limiter | None = None  # the bound on its model's calls (the supervisor's)

    @property
    def version(self) -> str | None:
        """The agent's version the run started with (`Agent.effective_version`)."""
        return self.agent.effective_version

    @property
    def alive(self) -> bool:
        return self.status in ("queued", "running", "idle")

    @property
    def transcript(self) -> list[Message]:
        """The conversation so far: while the run runs, the list it extends; once it has
        ended, a list of its own for each caller."""
        return self.history if self.kept is None else expand(self.kept)

    @property
    def result(self) -> RunResult | None:
        """The last attempt's result (None before one has ended)."""
        if self.kept is None or self.kept_result is None:
            return self.last
        return expand_result(self.kept_result, self.kept)

    @result.setter
    def result(self, value: RunResult | None) -> None:
        self.last = value

    def keep(self) -> None:
        """Hold what the ended run is still asked for, and little else: its transcript and
        result compact (`compact.py`, read back as equal values), not the budget its children
        drew on. A process keeps thousands of ended runs for whoever asks (10,000 by default);
        as message objects each held some fifty objects for every full collection to walk,
        and its small strings and objects stayed among the memory new runs are made in."""
        last = self.last
        if last is not None:
            own = None if last.messages is self.history else compact(last.messages)
            self.kept_result = compact_result(last, own)
        self.kept = compact(self.history)
        self.history, self.inbox, self.last = NO_MORE, NO_MORE, None
        if self.approver is self.desk and not (self.desk.pending or self.desk.decided):
            self.desk = self.approver = NO_DESK  # asked nothing: says so, as its own would
        self.context.allowance = None

    def send(self, text: str) -> None:
        """A user message: delivered before the next model call, together with any others."""
        if not self.alive:
            raise RunEnded(f"run {self.id} has ended ({self.status}); start a new one")
        self.inbox.append(text)
        self.emitter.user_message(text=text)
        if self.mail is not None:
            self.mail.set()

    def cancel(self) -> bool:
        """Stop the run now. Returns False if it had already ended."""
        if self.task_handle is None or self.task_handle.done():
            return False
        self.task_handle.cancel()
        return True

    def approve(
        self, approval_id: str, args_hash: str | None = None, reason: str = "approved by the user"
    ) -> None:
        self.desk.decide(approval_id, True, reason, args_hash)

    def deny(self, approval_id: str, reason: str = "denied by the user") -> None:
        self.desk.decide(approval_id, False, reason)

    def waiting(self) -> list[ApprovalRequest]:
        """The approval requests this run waits on."""
        return self.desk.waiting()

    async def wait(self) -> RunResult:
        """Wait for the run to end; its last result (cancelled, with nothing done, for one
        cancelled before it got to run). Always a result: `RunResult | None` made every
        caller's `result.outcome` an error under `mypy --strict`, the README's own."""
        result = self.result
        if self.task_handle is not None:
            ended: asyncio.Future[RunResult | None] = asyncio.get_running_loop().create_future()
            watchers = self.watchers = self.watchers or []
            watchers.append(ended)
            try:
                result = await ended  # a waiter cancelled cancels its own future, never the run
            except asyncio.CancelledError:
                if ended in watchers:
                    watchers.remove(ended)
                raise
        if result is None:
            return RunResult(
                self.id, "cancelled", "", "cancelled", Usage(), 0.0, 0, list(self.transcript)
            )
        return result

    def task_ended(self, task: asyncio.Task[RunResult]) -> None:
        """The run's task (`supervise`) is done, however it ended: its log closes, its waiters
        go on, and the task (its finished coroutine and context) is let go. A future a
        waiter, where `asyncio.shield` of the task made ten objects held while the run ran.
        A task that failed is a bug in the runtime itself: this run fails (`run_crashed`), no
        other. A task cancelled where no attempt says so (before it began, or waiting for a
        slot) ends the run `cancelled` here. (Said here, not by a coroutine around
        `supervise`: a run held that coroutine while it ran, one more for the collector.)"""
        crash = None if task.cancelled() else task.exception()
        if isinstance(crash, Exception):
            self.status = "failed"
            self.emitter.run_crashed(error=f"{type(crash).__name__}: {crash}")
        elif self.alive:
            self.status = "cancelled"
            self.emitter.run_finished(**cancelled_summary(self.result, self.id))
        self.log.close()
        self.task_handle = None
        last = self.last
        watchers, self.watchers = self.watchers or [], None
        for ended in watchers:
            if not ended.done():
                ended.set_result(last)  # the result itself, not one made again from `kept`
        if self.forget is not None and self.forget(self.id):
            self.keep()
        self.forget = None

    async def attempt(self, task: str | None) -> RunResult:
        """One go of the agent loop on this run's transcript."""
        self.status = "running"
        self.attempts += 1
        if self.mail is not None:
            self.mail.clear()
        result = await self.agent.run(
            task,
            images=self.images if task is not None else (),
            transcript=self.history,
            context=self.context,
            run_id=self.id,
            emitter=self.emitter,
            approver=self.approver,
            inbox=self.inbox,
            limiter=self.limiter,
            reraise_cancel=False,
        )
        self.result = result
        self.status = result.outcome
        return result

    async def idle(self) -> None:
        """Idle until a message arrives (permanent runs, between answers)."""
        self.status = "idle"
        self.emitter.idle()
        mail = self.mail = self.mail or asyncio.Event()
        while not self.inbox:
            mail.clear()
            await mail.wait()

    def cancelled_idle(self, last: RunResult) -> None:
        self.status = "cancelled"
        self.emitter.run_finished(**cancelled_summary(last, self.id))

    def now(self) -> float:
        return time.monotonic()
