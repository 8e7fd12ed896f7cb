"""Where a Runtime's runs live: in this process's memory (`InMemory`, over a `Supervisor`) or on a
store (`OnStore`, over `durable.process.DurableRuns`). The Runtime holds one and delegates to it,
so what differs between the two is said here, once, and the Runtime's API is the same for both.

A backend is given what it needs from the Runtime when it opens (`Needs`): how to find a run's
agent, how a run's tools start child runs, where questions are kept. Starting a run takes the
agent already found and the run's id already checked (`Start`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from .accounts import Accounts, MemoryAccounts, check_account
from .agent import Agent
from .approvals import ApprovalRequest, Approver, approve_all, deny_all
from .bus import Bus, EventLog
from .dashboard import Ended
from .errors import AccountOverBudget, ConfigError, QuestionError, known
from .events import Event, Sink
from .memory_view import MemoryView
from .messages import ImagePart, Message
from .questions import Answer, Question, Questions
from .rates import MemoryRates, Rates
from .result import RunResult
from .run import RestartPolicy, Status
from .run_filter import Cursor, Page, RunFilter
from .supervisor import Supervisor
from .tools.tool import RunContext, Spawn

if TYPE_CHECKING:  # imported when a store is opened: a runtime in memory never loads it
    from .durable.process import DurableRuns

NOT_OPEN = "enter the runtime first: async with Runtime(...) as rt"


class RunHandle(Protocol):
    """What a runtime gives back for a run, in memory (`run.Run`) or on a store
    (`durable.run.DurableRun`): the same surface either way."""

    id: str

    @property
    def status(self) -> Status | str: ...

    @property
    def version(self) -> str | None: ...

    @property
    def alive(self) -> bool: ...

    @property
    def transcript(self) -> list[Message]: ...

    def send(self, text: str) -> None: ...

    def cancel(self) -> bool: ...

    def approve(
        self, approval_id: str, args_hash: str | None = None, reason: str = "approved by the user"
    ) -> None: ...

    def deny(self, approval_id: str, reason: str = "denied by the user") -> None: ...

    def waiting(self) -> list[ApprovalRequest]: ...

    async def wait(self) -> RunResult: ...


class RunsView(Protocol):
    """A backend's runs as a person reads them, wherever they execute: in memory
    (`memory_view.MemoryView`) or on a store (`durable.remote.StoreView`)."""

    blocking: bool
    """Whether its reads wait on a store (then they are made in a thread, never on the loop)."""

    def has(self, run_id: str) -> bool: ...

    def questions(self, run_id: str) -> list[Question]: ...

    def log(self, run_id: str) -> EventLog: ...

    def rows(self, limit: int | None = None) -> list[dict[str, Any]]: ...

    def row(self, run_id: str) -> dict[str, Any] | None: ...

    def page(
        self, flt: RunFilter, after: Cursor | None, limit: int, oldest_first: bool = False
    ) -> Page: ...

    def activity(self, since: float) -> tuple[list[float], list[Ended], list[float]]: ...


@dataclasses.dataclass
class Start:
    """One run to start: its agent (found), task, id (checked) and the rest of `Runtime.start`."""

    agent: Agent
    task: str | None  # None: a fork that goes on from its history with no new message
    run_id: str
    chosen: bool  # the caller named the id (a generated one cannot be in the store)
    options: dict[str, Any] | None
    context: RunContext
    history: list[Message] | None
    restart: RestartPolicy | None = None
    approver: Approver | None = None
    sinks: list[Sink] = dataclasses.field(default_factory=list)
    images: tuple[ImagePart, ...] = ()


@dataclasses.dataclass
class Basis:
    """What a fork takes from the run it forks: its agent's name and version as the run
    recorded them, the options the agent was built from (None: a registered agent), a new
    context like the run's (workspace, account, config), and its approvals policy (None:
    approvals wait for a person)."""

    agent: str | None
    version: str | None
    options: dict[str, Any] | None
    context: RunContext
    approver: Approver | None


Begin = Callable[[], Awaitable[RunHandle]]
"""Starts a run, as `Runtime.start` does (what a child's start is made of)."""


@dataclasses.dataclass
class Needs:
    """What a backend takes from its Runtime when it opens."""

    resolve: Callable[[str, dict[str, Any] | None], Awaitable[Agent]]
    spawner: Callable[[Approver | None], Spawn]
    questions: Questions
    serving: Callable[[], dict[str, str]] = dict
    """The versions of the agents registered with the Runtime (name: version), which a store's
    process executes (`durable/versions.py`)."""
    rebuilds: bool = True
    """Whether the Runtime builds agents from recorded options (it has a factory)."""


@dataclasses.dataclass
class Recorded:
    """How queued runs are recorded besides their agent and tasks (see `Runtime.enqueue_many`)."""

    options: dict[str, Any] | None
    context: RunContext
    restart: RestartPolicy | None
    approver: Approver | None


class Backend:
    """The Runtime's runs, wherever they live (`InMemory`, `OnStore`). What only a store can do
    is refused here, with the reason; `OnStore` does it."""

    async def open(self, needs: Needs) -> None:
        pass

    async def close(self, deadline: float) -> None:
        pass

    @property
    def bus(self) -> Bus:
        raise NotImplementedError

    @property
    def runs(self) -> dict[str, Any]:
        raise NotImplementedError

    @property
    def view(self) -> RunsView:
        """Every run of the backend, wherever it executes, as a person reads them."""
        raise NotImplementedError

    @property
    def accounts(self) -> Accounts:
        """Where accounts' limits and spend are kept for these runs."""
        raise NotImplementedError

    @property
    def rates(self) -> Rates:
        """Where endpoints' rate limits are kept for these runs."""
        raise NotImplementedError

    async def start(self, s: Start) -> RunHandle:
        raise NotImplementedError

    async def start_child(
        self, run_id: str, context: RunContext, sinks: list[Sink], begin: Begin
    ) -> RunHandle:
        """Start a child run (an agent used as a tool) with `begin`."""
        return await begin()

    async def resume(self, run_id: str, sinks: list[Sink], force: bool) -> RunHandle:
        raise ConfigError("resume needs a store: runs in memory end with their process")

    async def upgrade(self, run_id: str, to: str | None) -> tuple[str, str]:
        raise ConfigError("an upgrade needs a store: a run in memory ends with its process")

    def get(self, run_id: str) -> RunHandle:
        raise NotImplementedError

    def basis_of(self, run_id: str) -> Basis:
        """What a fork of the run takes from it (NoSuchRun if there is none)."""
        raise NotImplementedError

    def enqueue(self, agent: Agent, pairs: list[tuple[str, str]], how: Recorded) -> None:
        """Queue runs (`pairs`: run id, task) in one transaction, for the store's workers."""
        raise ConfigError("a queue needs a store (the store whose workers take the run)")

    async def answer(self, run_id: str, question_id: str, given: Answer) -> None:
        """Answer a question no process here waits on (a store keeps it for the run)."""
        raise QuestionError(f"run {run_id} waits for no question {question_id}")

    async def work(self, concurrency: int, beat: float, dead_after: float) -> None:
        raise ConfigError("a worker needs a store")

    async def take_over(
        self, run_ids: list[str], sinks: list[Sink], before: dict[str, list[Event]]
    ) -> list[str]:
        return []


class InMemory(Backend):
    """Runs as tasks of this process (`Supervisor`); they end with it."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self.kept_accounts = MemoryAccounts()  # this process's runs' accounts
        self.kept_rates = MemoryRates()  # and their endpoints' rates
        self.memory_view = MemoryView(supervisor)

    async def open(self, needs: Needs) -> None:
        self.memory_view.asked = needs.questions

    @property
    def view(self) -> RunsView:
        return self.memory_view

    async def close(self, deadline: float) -> None:
        await self.supervisor.shutdown(deadline=deadline)

    @property
    def bus(self) -> Bus:
        return self.supervisor.bus

    @property
    def runs(self) -> dict[str, Any]:
        return self.supervisor.runs

    @property
    def accounts(self) -> Accounts:
        return self.kept_accounts

    @property
    def rates(self) -> Rates:
        return self.kept_rates

    async def start(self, s: Start) -> RunHandle:
        return self.supervisor.start(
            s.agent,
            s.task,
            run_id=s.run_id,
            context=s.context,
            restart=s.restart,
            approver=s.approver,
            sinks=s.sinks,
            transcript=list(s.history or []),
            images=s.images,
        )

    def get(self, run_id: str) -> RunHandle:
        return self.supervisor.get(run_id)

    def basis_of(self, run_id: str) -> Basis:
        run = self.supervisor.get(run_id)
        c = run.context
        context = RunContext(
            workspace=c.workspace, account_id=c.account_id, deps=c.deps, config=dict(c.config)
        )
        policy = run.approver if run.approver in (approve_all, deny_all) else None
        return Basis(run.agent.name, run.agent.effective_version, None, context, policy)


@dataclasses.dataclass
class StoreSettings:
    """How a Runtime uses its store (see `Runtime`'s arguments)."""

    url: str
    executor_id: str | None = None
    take_over: bool = True
    connections: int | None = None
    patience: float | None = None


class OnStore(Backend):
    """Runs recorded in a store (`durable/`): any process on it can execute, resume or take
    over a run, and the store's runs are seen wherever they execute (`view`)."""

    def __init__(self, settings: StoreSettings, supervisor: Supervisor) -> None:
        self.settings = settings
        self.supervisor = supervisor  # its bounds on runs and model calls hold here too
        self.durable: DurableRuns | None = None  # once open

    async def open(self, needs: Needs) -> None:
        from .durable.ledger import KeptQuestions
        from .durable.outage import STORE_PATIENCE_S
        from .durable.process import CONNECTIONS, DurableRuns
        from .durable.versions import Serving

        sup, s = self.supervisor, self.settings
        durable = DurableRuns(
            s.url,
            needs.resolve,
            s.executor_id,
            run_slots=sup.run_slots,
            limiter_for=sup.limiter_for,
            keep_finished=sup.keep_finished,
            connections=s.connections or CONNECTIONS,
            patience=STORE_PATIENCE_S if s.patience is None else s.patience,
        )
        durable.spawner = lambda approvals: needs.spawner(
            {"auto": approve_all, "deny": deny_all}.get(approvals)
        )
        durable.serving = lambda: Serving(needs.serving(), needs.rebuilds)
        durable.open()
        self.durable = durable
        needs.questions.recorder = KeptQuestions(durable.ledger)
        if s.take_over:
            await durable.take_over(sinks=[])

    async def close(self, deadline: float) -> None:
        if self.durable is not None:
            await self.durable.close()

    @property
    def opened(self) -> DurableRuns:
        if self.durable is None:
            raise ConfigError(NOT_OPEN)
        return self.durable

    @property
    def bus(self) -> Bus:
        return self.opened.bus

    @property
    def runs(self) -> dict[str, Any]:
        return self.opened.runs

    @property
    def view(self) -> RunsView:
        return known(self.opened.view, "the store's view (opened with the store)")

    @property
    def accounts(self) -> Accounts:
        return known(self.opened.accounts, "the store's accounts (opened with its ledger)")

    @property
    def rates(self) -> Rates:
        return known(self.opened.rates, "the store's rates (opened with its ledger)")

    async def start(self, s: Start) -> RunHandle:
        from .durable.run import record_of

        record = record_of(s.agent, s.options, s.context, approvals_of(s.approver), s.restart)
        typed = None if s.agent.output is None else s.agent.output.typed
        return await self.opened.start(
            record, s.task, s.run_id, s.sinks, s.history, s.chosen, typed, s.images
        )

    async def start_child(
        self, run_id: str, context: RunContext, sinks: list[Sink], begin: Begin
    ) -> RunHandle:
        """A child is a durable run of its own, and a repeat of the call that starts it (after
        a crash) finds it again; it is started from inside the parent's step, so in a task of
        its own, outside that step."""
        from .errors import RunExists

        durable = self.opened
        if context.parent is not None:
            durable.parents[run_id] = context.parent

        async def start_or_find() -> RunHandle:
            try:
                return await begin()
            except RunExists:  # the call is repeated after a crash: the child goes on
                return await self.resume(run_id, sinks, False)

        found: RunHandle = await durable.spawn(start_or_find())
        return found

    async def resume(self, run_id: str, sinks: list[Sink], force: bool) -> RunHandle:
        return await self.opened.resume(run_id, sinks, force)

    def get(self, run_id: str) -> RunHandle:
        durable = self.opened
        if run_id in durable.runs:
            return durable.get(run_id)
        return known(durable.view, "the store's view (opened with the store)").get(run_id)

    def basis_of(self, run_id: str) -> Basis:
        """Read from the run's record, once."""
        from .durable.run import context_of
        from .durable.view import record_of_run

        record = record_of_run(self.opened.reader, run_id)
        context = context_of("", record) if record.workspace is not None else RunContext()
        context.origin = {}  # the fork's own is set by the caller
        return Basis(
            record.agent,
            record.version,
            record.options,
            context,
            {"auto": approve_all, "deny": deny_all}.get(record.approvals),
        )

    def enqueue(self, agent: Agent, pairs: list[tuple[str, str]], how: Recorded) -> None:
        from .durable.remote import enqueue
        from .durable.run import record_of

        durable = self.durable  # its reader and ledger when open, else opened for this
        if how.context.account_id is not None:
            refuse_over(self.settings.url, how.context.account_id, durable)
        approvals = approvals_of(how.approver)
        record = record_of(agent, how.options, how.context, approvals, how.restart)
        enqueue(self.settings.url, pairs, record, durable.reader if durable else None)

    async def upgrade(self, run_id: str, to: str | None) -> tuple[str, str]:
        from .durable.remote import upgrade_run

        ledger = self.opened.ledger
        return await ledger.call(upgrade_run, self.opened.reader, ledger, run_id, to)

    async def answer(self, run_id: str, question_id: str, given: Answer) -> None:
        """Kept in the store, for a run waiting in any process (or in none: a resumed run
        takes it when the question is asked again)."""
        from .durable.remote import answer_question

        ledger = self.opened.ledger
        await ledger.call(answer_question, ledger, run_id, question_id, given)

    async def work(self, concurrency: int, beat: float, dead_after: float) -> None:
        from .durable.workers import work

        await work(self.opened, concurrency, beat, dead_after)

    async def take_over(
        self, run_ids: list[str], sinks: list[Sink], before: dict[str, list[Event]]
    ) -> list[str]:
        return await self.opened.take_over(run_ids, sinks, before)


def approvals_of(approver: Approver | None) -> str:
    """How a durable run decides approvals: a store can keep a policy, not a Python callable."""
    if approver is None:
        return "wait"
    if approver is approve_all:
        return "auto"
    if approver is deny_all:
        return "deny"
    raise ConfigError(
        "a run on a store decides approvals by approve()/deny() (the default), approve_all or "
        "deny_all; another approver cannot be recorded"
    )


def refuse_over(url: str, account: str, durable: DurableRuns | None = None) -> None:
    """Refuse to queue runs of an account over a limit that refuses new runs, as
    `Runtime.start` refuses one (`Runtime.admit`); with `when_over="queue"` they are queued
    and wait before their first call. Read from the store's ledger: a queue opens no more."""
    from .durable.accounts import StoredAccounts
    from .durable.ledger import Ledger

    if durable is not None:
        standing = StoredAccounts(durable.ledger).standing_now(check_account(account))
    else:
        with Ledger(url, connections=1) as ledger:
            standing = StoredAccounts(ledger).standing_now(check_account(account))
    refused = standing.refusal_of_new_runs()
    if refused:
        raise AccountOverBudget(f"{refused}: the runs were not queued")
