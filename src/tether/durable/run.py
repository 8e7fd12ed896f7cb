"""One run on a store, as the process that follows or executes it sees it: `DurableRun`.

What a store keeps of a run besides its task is its record (`record_of`): the agent's name (and
the options it was built from), the JSON parts of its context, how approvals are decided and its
restart policy; never a Python object or a command line. Any process that registers the agent
can execute the run from it.

A `DurableRun` is both the handle a caller holds (status, live events, `send`, `approve`,
`cancel`, `wait`: the surface of a `Run` in memory) and, while the run executes here, what its
execution needs in memory (its agent, its tools' context, its task, what it announced). Its
owner (`process.DurableRuns`, through the `Host` it is given) keeps one per run id; when the run
ends here, what it kept for executing goes with it (`done_executing`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Protocol

from ..agent import Agent
from ..approvals import ApprovalRequest, Decision, arguments_hash, check_answer
from ..bus import Bus, EventLog
from ..compact import Compact, compact
from ..errors import ConfigError, NoSuchRun, RunEnded, StoreUnavailable, known
from ..events import Emitter, Event, Sink
from ..messages import Message, ToolCall, hollow
from ..result import RunResult, compact_result, expand_result
from ..run import RestartPolicy
from ..tally import Tally
from ..tools.tool import RunContext
from .formats import RUN_FORMAT, RunRecord
from .ledger import Ledger
from .outage import cause_of, said_by_us
from .view import MAIL, decision_in, messages_of, version_of

APPROVALS = ("wait", "auto", "deny")


def record_of(
    agent: Agent,
    options: dict[str, Any] | None,
    context: RunContext,
    approvals: str = "wait",
    restart: RestartPolicy | None = None,
) -> RunRecord:
    """What the store keeps of a run besides its task: the agent's name (and the options it
    was built from, if it was), the JSON parts of its context, and how approvals are decided.
    Nothing here depends on how a command line spells its flags."""
    if approvals not in APPROVALS:
        raise ConfigError(f"approvals: {approvals!r} is not one of {', '.join(APPROVALS)}")
    lineage, origin = context.lineage(), context.origin
    return RunRecord(
        format=RUN_FORMAT,
        agent=agent.name,
        version=agent.effective_version,
        options=options,
        approvals=approvals,
        restart=dataclasses.asdict(restart or RestartPolicy()),
        workspace=str(Path(context.workspace).resolve()),
        account_id=context.account_id,
        config=context.config,
        provider=agent.model.provider,
        model=agent.model.name,
        parent_run_id=lineage.get("parent_run_id"),
        root_run_id=lineage.get("root_run_id"),
        forked_from=origin.get("forked_from"),
        at=origin.get("at"),
    )


def context_of(run_id: str, record: RunRecord) -> RunContext:
    """A run's tools' context as its record keeps it (its workspace, account, config and a
    fork's origin); what lives only in memory (its parent, sinks, spawner) is set by whoever
    executes it."""
    return RunContext(
        run_id=run_id,
        workspace=Path(record.workspace or "."),
        account_id=record.account_id,
        config=dict(record.config),
        origin=record.origin,
    )


def recorded(result: RunResult) -> dict[str, Any]:
    """The workflow's output: the result, its images without their bytes (kept beside)."""
    out = result.to_dict()
    out["messages"] = [hollow(m) for m in result.messages]
    return out


class Host(Protocol):
    """What a run asks of the process that holds it (`process.DurableRuns`)."""

    bus: Bus

    @property
    def ledger(self) -> Ledger: ...

    @property
    def reader(self) -> Any: ...

    def spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]: ...

    async def cancel(self, run_id: str) -> None: ...


class DurableRun:
    """A durable run here: its status and live events, what can be asked of it, and, while it
    executes here, what executing it needs. Messages go to the store's inbox, approvals travel
    as the run's durable messages, a cancel stops it in the store and here."""

    def __init__(
        self,
        host: Host,
        run_id: str,
        sinks: list[Sink] | None = None,
        before: list[Event] | None = None,
    ) -> None:
        """`sinks`: where its events go besides its log on the bus (None: a run nobody here
        follows, a worker's, whose log goes when it ends); `before`: the events a page showed
        of it already (numbering goes on from there)."""
        self.host = host
        self.id = run_id
        self.followed = sinks is not None
        self.status = "queued"
        self.last: RunResult | None = None  # its result, until it is kept compact (`keep`)
        self.packed: tuple[Compact, Compact] | None = None  # its result and transcript, kept
        self.pending: dict[str, ApprovalRequest] = {}
        self.ended = asyncio.Event()
        self.summary: dict[str, Any] | None = None  # its run_finished, once seen here
        self.kept: list[Message] = []  # the transcript of a run cancelled here
        self.typed: Callable[[Any], Any] | None = None  # see DurableRuns.start
        self.tally = Tally()
        self.sinks: list[Sink] = []
        """Where its events go: its children's go there too (an agent used as a tool runs
        inside the call, see `children.run_child`)."""
        self.log = EventLog(run_id)
        self.emitter = Emitter(run_id)
        self.follow_with(sinks or [], before)
        # while it executes here
        self.agent: Agent | None = None
        self.context: RunContext | None = None
        self.task: asyncio.Task[Any] | None = None  # the execution, stopped by a cancel
        self.fresh = False  # started here and not executed yet: nothing is recorded to read
        self.mail_before: int | None = None
        """What was said of mail (`notices.py`) before this process recorded the run (`start`):
        nothing can be in its inbox unless something was said since."""
        self.stepped = False  # it has stepped here: its replay is behind it, events are live
        self.shown: set[str] = set()  # the tool calls announced here
        self.lost: StoreUnavailable | None = None  # stopped here for want of the store

    def follow_with(self, sinks: list[Sink], before: list[Event] | None = None) -> None:
        """Its events go to a log of the bus (a new one) and to `sinks`, and update this
        handle, from now on: a run a worker executes here gets a follower this way."""
        if sinks or before is not None:
            self.followed = True
        self.log = self.host.bus.logs[self.id] = EventLog(self.id)
        self.log.extend(before or ())
        lineage = self.emitter.lineage
        self.emitter = Emitter(self.id, [self.track, *sinks], log=self.log)
        self.emitter.seq = len(self.log)
        self.emitter.lineage = lineage
        self.sinks = list(sinks)

    @property
    def version(self) -> str | None:
        """The agent's version the run started with, as the store recorded it."""
        return version_of(self.host.reader, self.id)

    @property
    def alive(self) -> bool:
        return not self.ended.is_set()

    def waiting(self) -> list[ApprovalRequest]:
        return list(self.pending.values())

    @property
    def result(self) -> RunResult | None:
        """Its result (None before it ends): read back from what `keep` kept, if it did."""
        if self.packed is None:
            return self.last
        return expand_result(*self.packed)

    @result.setter
    def result(self, value: RunResult | None) -> None:
        self.last, self.packed = value, None

    def keep(self) -> None:
        """Hold its result compact once it has ended (`compact.py`), as a run in memory does: a
        process keeps thousands of ended runs, and as message objects an ended durable run held
        56 objects for every full collection to walk (16 kept compact: `bench/heap.py
        --store sqlite`)."""
        last = self.last
        if last is not None:
            self.packed = compact_result(last, None), compact(last.messages)
        self.last, self.kept = None, []

    @property
    def transcript(self) -> list[Message]:
        result = self.result
        if result is not None and result.messages:
            return list(result.messages)
        try:
            return messages_of(self.host.reader, self.id)
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

        seq = self.host.ledger.send(self.id, text)  # announced when the run takes it
        self.host.spawn(DBOS.send_async(self.id, seq, topic=MAIL))  # wakes it if idle

    def approve(
        self, approval_id: str, args_hash: str | None = None, reason: str = "approved by the user"
    ) -> None:
        self.answer(approval_id, True, reason, args_hash)

    def deny(self, approval_id: str, reason: str = "denied by the user") -> None:
        self.answer(approval_id, False, reason, None)

    def answer(self, approval_id: str, approved: bool, reason: str, args_hash: str | None) -> None:
        """Send the answer to the run as its durable message, and only then take the request
        off `waiting()`. When the store does not take it, StoreUnavailable says so and the
        request stays waiting (sent from a task, the answer was gone from `waiting()` and
        the caller told it worked, when it never reached the run)."""
        request = self.pending.get(approval_id)
        decided = None if request is not None else self.decided_in_store(approval_id)
        check_answer(approval_id, request.args_hash if request else None, decided, args_hash)
        reply = {"approved": approved, "reason": reason}
        try:  # the store's client: it fails at once when the store does not answer
            with said_by_us():
                self.host.reader.send(self.id, reply, approval_id)
        except Exception as e:
            raise StoreUnavailable(
                f"the answer to {approval_id} did not reach the store: {cause_of(str(e))}; "
                "the call still waits for it"
            ) from None
        self.pending.pop(approval_id, None)

    def decided_in_store(self, approval_id: str) -> Decision | None:
        """How an approval this run no longer waits for was decided, as the store recorded it
        (None: never asked, or the store does not answer)."""
        try:
            with said_by_us():
                asked = self.host.reader.get_event(self.id, approval_id, timeout_seconds=0)
        except Exception:  # the store does not answer: the plain refusal
            asked = None
        return decision_in(asked)

    def cancel(self) -> bool:
        if self.ended.is_set():
            return False
        self.host.spawn(self.host.cancel(self.id))
        return True

    async def wait(self) -> RunResult:
        await self.ended.wait()
        return known(self.result, "the result of a run that has ended")

    # -- while it executes here -------------------------------------------------------------

    def executes(self, agent: Agent, context: RunContext) -> None:
        self.agent, self.context = agent, context

    def stop_here(self) -> asyncio.Task[Any] | None:
        """Cancel its execution here, if it goes on; the task cancelled, to wait for."""
        task, self.task = self.task, None
        if task is None or task.done():
            return None
        task.cancel()
        return task

    def done_executing(self) -> RunContext | None:
        """Drop what executing it kept (a process serves many runs); its tools' context, whose
        kept sessions end with the run here."""
        context = self.context
        self.agent = self.context = self.task = self.lost = None
        self.stepped = self.fresh = False
        self.shown = set()
        return context

    def announce(self, calls: list[ToolCall]) -> None:
        """Emit `tool_call` for the calls not yet announced by this process."""
        agent = known(self.agent, "the agent of a run that executes here")
        for c in calls:
            if c.id not in self.shown:
                self.shown.add(c.id)
                self.emitter.tool_call(**agent.toolbox.call_data(c, self.id))
