"""The Runtime: the one object that runs agents, in memory or durably, with the same features.

    agent = Agent(model, [charge_card], name="billing", budget=Budget(max_steps=20))
    async with Runtime(store="sqlite:///runs.sqlite", agents=[agent]) as rt:   # None: memory
        run = await rt.start("billing", "Charge order A-7", run_id="a-7")  # once it is recorded
        result = await run.wait()
    # after a crash, in a process that registers the same agents:
    async with Runtime(store="sqlite:///runs.sqlite", agents=[agent]) as rt:
        result = await (await rt.resume("a-7")).wait()      # no completed call repeats

Agents are found by name. A store records the name, the task and the run's context (never a
Python object), so any process that registers the same agents can execute, resume or take
over the run. Agents built from options (the CLI's flags, the page's form) are recorded with
their options, and `factory` rebuilds them in whichever process executes the run.

What the runtime owns: the runs (its backend: in memory or on a store, `backends.py`),
the agents it built (their HTTP pools are closed when it closes) and the connections they
hold (MCP servers, kept open by tasks of the runtime's own). Entering a runtime on a store
also takes over the runs that dead processes on this machine had been executing.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .accounts import Limits, Standing, check_account
from .agent import Agent
from .agents import Agents, Factory
from .approvals import Approver
from .backends import (
    NOT_OPEN,
    Backend,
    InMemory,
    Needs,
    OnStore,
    Recorded,
    RunHandle,
    RunsView,
    Start,
    StoreSettings,
)
from .background import Background
from .bus import Bus
from .errors import AccountOverBudget, ConfigError
from .events import Event, Sink
from .fork import fork_point
from .journal import store_url
from .messages import ImagePart, Message
from .providers.base import Model
from .questions import Action, Answer, Asker, Question, Questions
from .rates import Rate, RateStanding, endpoint_of
from .run import RestartPolicy
from .supervisor import DEFAULT_MAX_MODEL_CALLS, Supervisor
from .tools.tool import RunContext, Spawn, Tool

if TYPE_CHECKING:  # imported when a store is opened: a runtime in memory never loads it
    from .tools.mcp import MCPApproval, MCPHolder, MCPNames
    from .tools.mcp_auth import AuthSettings


def context_for(options: dict[str, Any] | None) -> RunContext:
    """The tools' context of a run given no other: in the workspace its options name (the
    page's and a worker's runs, built from options), else in the current directory; of the
    account they name (`--account`), if any."""
    workspace, account = (options or {}).get("workspace"), (options or {}).get("account")
    context = RunContext(workspace=Path(workspace)) if workspace else RunContext()
    context.account_id = account or None
    return context


class Runtime:
    """Runs agents, in memory or on a store, with the same API: `start`, `get`, `send`,
    `cancel`, `approve`, `deny`, `events`, and on a store `resume` and `enqueue`. Use it as
    an async context manager (see the module docstring)."""

    def __init__(
        self,
        store: str | None = None,
        agents: Iterable[Agent] = (),
        *,
        factory: Factory | None = None,
        executor_id: str | None = None,
        max_runs: int | None = None,
        max_model_calls: int | None = DEFAULT_MAX_MODEL_CALLS,
        approval_ttl: float | None = None,
        keep_finished: int | None = 10_000,
        gc_tuning: bool = False,
        take_over: bool = True,
        store_connections: int | None = None,
        store_patience: float | None = None,
    ) -> None:
        """`store`: None (or "memory") runs in memory; `sqlite:///PATH` or `postgresql://...`
        makes every run durable. `agents` are found by their names; `factory` builds agents
        from options (`start(..., options=...)`) here and in any process that executes the run.
        `executor_id` names this process to the store (default: host and pid). `take_over`:
        on entering, execute the runs that dead processes on this machine left.
        `store_connections`: how many connections to the store the runs use (default 20, see
        `durable.process.CONNECTIONS`). `store_patience`: how many seconds runs wait for a
        store that stops answering before they end `failed` with StoreUnavailable (default 30;
        they stay in the store, to resume; see `durable.outage`). `gc_tuning`: set the
        process's garbage collector for thousands of live runs (`supervisor.tune_gc`; off by
        default, as the host application may own it; the `tether` commands turn it on). The
        rest bounds the runs in memory (see `Supervisor`)."""
        self.store = None if store in (None, "", "memory") else store_url(store)
        self.supervisor = Supervisor(
            max_runs=max_runs,
            max_model_calls=max_model_calls,
            approval_ttl=approval_ttl,
            gc_tuning=gc_tuning,
            keep_finished=keep_finished,
        )
        self.backend: Backend = (
            InMemory(self.supervisor)
            if self.store is None
            else OnStore(
                StoreSettings(
                    self.store, executor_id, take_over, store_connections, store_patience
                ),
                self.supervisor,
            )
        )
        self.catalog = Agents(factory)
        self.agents = self.catalog.registered  # by name
        for agent in agents:
            self.register(agent)
        self.mcp: MCPHolder | None = None  # the MCP servers' connections, once asked for
        self.background = Background()  # the runtime's own tasks (MCP servers' holders)
        self.questions = Questions()  # what runs' tools asked, waiting for `answer`
        self.entered = False
        self.default_spawn: Spawn | None = None  # `spawner`'s, once made

    # -- lifetime ---------------------------------------------------------------------------

    async def __aenter__(self) -> Runtime:
        await self.open()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def open(self) -> None:
        if self.entered:
            return
        await self.backend.open(
            Needs(
                self.agent_for,
                self.spawner,
                self.questions,
                self.catalog.versions,
                self.catalog.factory is not None,
            )
        )
        self.entered = True

    async def close(self, deadline: float = 10.0) -> None:
        """In memory: give live runs `deadline` seconds, then cancel them. On a store: stop
        following runs (they stay recorded). Then close what the runtime built."""
        await self.backend.close(deadline)
        await self.background.close()
        if self.mcp is not None:
            self.mcp.close()
        await self.catalog.aclose()
        self.entered = False

    def spawn(self, work: Awaitable[Any]) -> asyncio.Task[Any]:
        """A task of the runtime's own (not part of any run), cancelled when it closes."""
        return self.background.spawn(work)

    # -- agents -----------------------------------------------------------------------------

    def named(self, agent: str | Agent) -> str:
        """The name a run is started by: the agent's own, registering it if it is an Agent."""
        return self.catalog.named(agent)

    def register(self, agent: Agent) -> None:
        """Find `agent` by its name here, and the agents its tools run as children."""
        self.catalog.register(agent)

    async def agent_for(self, name: str, options: dict[str, Any] | None = None) -> Agent:
        """The agent `name`, or the one the factory builds from `options` (once per name and
        options: runs with the same options share its HTTP pool)."""
        return await self.catalog.agent_for(name, options)

    async def mcp_tools(
        self,
        servers: list[str],
        connect_timeout: float = 30.0,
        *,
        auth: AuthSettings | None = None,
        token_dir: Path | None = None,
        asker: Asker | None = None,
        sampling: bool = True,
        approval: MCPApproval | str = "hints",
        names: MCPNames | None = None,
    ) -> list[Tool]:
        """The tools of these MCP servers, connected once per runtime and kept open by a task
        of its own (a connection belongs to the task that opened it, and a run's task ends).
        A server that has not listed its tools within `connect_timeout` seconds is an error.
        `auth`, `token_dir`, `asker` and `sampling`: how to sign in, where tokens are kept, who
        answers a server's questions (by default they wait for `answer`), whether its sampling
        requests are answered, and which calls wait for a person's approval (`approval`, by
        default those of every tool its server does not mark read-only; see
        `tools.mcp.MCPApproval`), and which tools are offered under which names (`names`, by
        default all as their servers name them; see `tools.mcp.MCPNames`)."""
        if self.mcp is None:
            from .tools.mcp import MCPHolder

            self.mcp = MCPHolder(self.spawn)
        return await self.mcp.tools(
            servers,
            connect_timeout,
            auth=auth,
            token_dir=token_dir,
            asker=asker or self.questions.ask,
            sampling=sampling,
            approval=approval,
            names=names,
        )

    # -- runs -------------------------------------------------------------------------------

    async def start(
        self,
        agent: str | Agent,
        task: str,
        *,
        run_id: str | None = None,
        options: dict[str, Any] | None = None,
        context: RunContext | None = None,
        history: list[Message] | None = None,
        restart: RestartPolicy | None = None,
        approver: Approver | None = None,
        sinks: list[Sink] | None = None,
        images: Sequence[ImagePart] = (),
    ) -> RunHandle:
        """Start a run of `agent` (a registered agent, by name or itself) on `task`, with
        `images` beside it (`ImagePart.load`); returns its handle once the run is recorded
        (on a store, which keeps each image once, by its hash) or started (in memory).

        `options`: build the agent with the factory from these instead (recorded with the
        run). `context`: the tools' workspace, account and config (on a store its JSON
        parts are recorded; `deps` stay in this process). `history`: the conversation before
        the task. `approver`: who decides calls that need approval; by default they wait for
        `approve`/`deny` (on a store, across restarts); `approve_all` and `deny_all` decide
        at once. `sinks` see every event as it is emitted, before any subscriber."""
        self.check_open()
        found = await self.agent_for(self.named(agent), options)
        context = context or context_for(options)
        begun = Start(found, task, run_id or "", run_id is not None, options, context, history)
        begun.restart, begun.approver, begun.sinks, begun.images = (
            restart,
            approver,
            list(sinks or []),
            tuple(images),
        )
        return await self.begin(begun)

    async def begin(self, start: Start) -> RunHandle:
        """Start what `start` says (its id checked, or made), its tools able to start child
        runs here, its sinks seeing its children's events too."""
        start.run_id = check_run_id(start.run_id or secrets.token_hex(6))
        context = start.context
        context.rates = context.rates or self.backend.rates
        if context.account_id is not None:
            await self.admit(context)
        if context.spawn is None:  # its tools start child runs here, as runs of their own
            context.spawn = self.spawner(start.approver)
        if context.parent is None and start.sinks and not context.tree_sinks:
            context.tree_sinks = list(start.sinks)  # the root's watchers see its children too
        return await self.backend.start(start)

    async def admit(self, context: RunContext) -> None:
        """Name the run's account book in its context and refuse a new run (not a child) of an
        account over a limit that refuses new runs (`Limits.when_over`)."""
        check_account(context.account_id)
        accounts = context.accounts = context.accounts or self.backend.accounts
        if context.parent is not None or context.account_id is None:
            return
        standing = await accounts.standing(context.account_id)
        refused = standing.refusal_of_new_runs()
        if refused:
            raise AccountOverBudget(f"{refused}: the run was not started")

    # -- accounts ---------------------------------------------------------------------------

    async def set_limits(self, account: str, limits: Limits | None) -> None:
        """Set an account's limits (None: remove them), kept where the runs are (on a store,
        for every process on it); they hold from the next model call of its runs."""
        self.check_open()
        await self.backend.accounts.set_limits(check_account(account), limits)

    async def account(self, account: str) -> Standing:
        """An account now: its limits, what it spent today, this month and in all, and what
        its calls in flight hold."""
        self.check_open()
        return await self.backend.accounts.standing(check_account(account))

    async def accounts(self) -> list[Standing]:
        """Every account with limits or spend, by name."""
        self.check_open()
        return await self.backend.accounts.accounts()

    # -- rate limits --------------------------------------------------------------------------

    async def set_rate(self, endpoint: Model | str, rate: Rate | None) -> None:
        """Limit the requests and tokens a model's endpoint and key takes (`rates.py`), across
        every run here (on a store, every process on it; None: no limit). `endpoint` is a
        model, or an endpoint as `rates()` names it."""
        self.check_open()
        await self.backend.rates.set_rate(endpoint_of(endpoint), rate)

    async def rates(self) -> list[RateStanding]:
        """Every endpoint with a rate or a server's pause: its attempts in its last window."""
        self.check_open()
        return await self.backend.rates.rates()

    async def upgrade(self, run_id: str, to: str | None = None) -> tuple[str, str]:
        """Move a run that waits for its agent's version (no live worker has it) to version
        `to` (None: the one other version live workers have): a worker of it goes on from
        its last recorded step. Its (from, to) versions; ConfigError, nothing changed, for a
        run that is running, has ended, or to a version no live worker has."""
        self.check_open()
        return await self.backend.upgrade(run_id, to)

    async def fork(
        self,
        run_id: str,
        *,
        at: int,
        message: str | None = None,
        results: dict[str, str] | None = None,
        fork_id: str | None = None,
        context: RunContext | None = None,
        approver: Approver | None = None,
        sinks: list[Sink] | None = None,
    ) -> RunHandle:
        """A new run that starts from run `run_id`'s conversation as it stood after step `at`
        (its `at`-th model reply and what followed it; see `fork.py`), with `message` as a new
        user message and `results` replacing the output of tool calls by their ids. Nothing
        of the prefix runs again and the original is untouched; the fork's `run_started` and
        record name its origin (`forked_from`, `at`). The run's agent must be registered here
        at the version the run recorded (ConfigError otherwise, nothing started): its steps
        would otherwise go on under another definition. By default the fork's context
        (workspace, account, config) and approvals policy are the run's. In memory and on a
        store alike; a child of a tree forks as a root of its own."""
        self.check_open()
        source = self.get(run_id)
        basis = self.backend.basis_of(run_id)
        name, options = basis.agent, basis.options
        if name is None or (options is None and name not in self.agents):
            raise ConfigError(f"run {run_id} ran the agent {name!r}, which is not registered here")
        found = await self.agent_for(name, options)  # as the run's own was (`resume` too)
        if basis.version is not None and basis.version != found.effective_version:
            raise ConfigError(
                f"run {run_id} was recorded by version {basis.version} of {name}; this "
                f"runtime has version {found.effective_version}: a fork would go on under "
                "another definition"
            )
        prefix = fork_point(source.transcript, at, message, results, f"run {run_id}")
        context = context or basis.context
        context.origin = {"forked_from": run_id, "at": at}
        begun = Start(found, message, fork_id or "", fork_id is not None, options, context, prefix)
        begun.approver = approver or basis.approver  # as the run decided
        begun.sinks = list(sinks or [])
        return await self.begin(begun)

    def spawner(self, approver: Approver | None) -> Spawn:
        """How an agent used as a tool starts a child run (see `tree`): as a run of this
        runtime, found by its id, its events also seen by its root's sinks. The children
        decide approvals as their root does: `approve_all` and `deny_all` pass down; by
        default each child waits for `approve(child_id, ...)`. On a store the child is a
        durable run of its own, and a repeat of the call (after a crash) finds it again.
        The default's (no approver) is made once: a closure a run was four objects each of
        the 10,000 ended runs kept held."""
        if approver is None:
            if self.default_spawn is None:
                self.default_spawn = self.make_spawner(None)
            return self.default_spawn
        return self.make_spawner(approver)

    def make_spawner(self, approver: Approver | None) -> Spawn:

        async def start_child(
            agent: Agent, task: str, context: RunContext, run_id: str
        ) -> RunHandle:
            sinks = list(context.tree_sinks)

            def begin() -> Awaitable[RunHandle]:
                return self.start(
                    agent, task, run_id=run_id, context=context, approver=approver, sinks=sinks
                )

            return await self.backend.start_child(run_id, context, sinks, begin)

        return start_child

    def enqueue(
        self,
        agent: str | Agent,
        task: str,
        *,
        run_id: str | None = None,
        options: dict[str, Any] | None = None,
        context: RunContext | None = None,
        restart: RestartPolicy | None = None,
        approver: Approver | None = None,
    ) -> str:
        """Put a run on the store's queue for whichever worker (`tether worker`) is free;
        returns its id once it is recorded. The run is not executed here."""
        ids = None if run_id is None else [run_id]
        return self.enqueue_many(
            agent,
            [task],
            run_ids=ids,
            options=options,
            context=context,
            restart=restart,
            approver=approver,
        )[0]

    def enqueue_many(
        self,
        agent: str | Agent,
        tasks: list[str],
        *,
        run_ids: list[str] | None = None,
        options: dict[str, Any] | None = None,
        context: RunContext | None = None,
        restart: RestartPolicy | None = None,
        approver: Approver | None = None,
    ) -> list[str]:
        """Queue one run per task, all with the same agent, options and context, in one
        transaction (all are queued, or none); returns their ids. `run_ids` names them (one
        per task, none the store has); by default they are generated."""
        # an agent given itself is recorded by its name and not registered: this runtime
        # does not execute the runs (one built from options is its own, by the same name)
        found = agent if isinstance(agent, Agent) else self.agents.get(agent)
        if found is None:
            raise ConfigError(f"no agent named {agent!r} is registered here")
        if run_ids is not None and len(run_ids) != len(tasks):
            raise ConfigError(f"{len(run_ids)} run ids for {len(tasks)} tasks")
        ids = [check_run_id(i) for i in run_ids or [secrets.token_hex(6) for _ in tasks]]
        pairs = list(zip(ids, tasks, strict=True))
        context = context or context_for(options)
        self.backend.enqueue(found, pairs, Recorded(options, context, restart, approver))
        return ids

    async def resume(
        self, run_id: str, *, sinks: list[Sink] | None = None, force: bool = False
    ) -> RunHandle:
        """Continue a durable run here: one whose process died is recovered (no completed
        model or tool call repeats), one cancelled or failed goes on from where it stopped.
        A run whose process still runs it is refused (`force` takes it over regardless)."""
        self.check_open()
        return await self.backend.resume(run_id, list(sinks or []), force)

    def get(self, run_id: str) -> RunHandle:
        """A run by id (NoSuchRun if there is none): one this runtime executes, or, on a
        store, any run of the store, wherever it executes (a worker elsewhere, or none yet)."""
        return self.backend.get(run_id)

    def has(self, run_id: str) -> bool:
        """Whether `get(run_id)` finds a run."""
        if run_id in self.bus.logs:
            return True
        return self.view.has(run_id)

    def send(self, run_id: str, text: str) -> None:
        """A user message, delivered before the run's next model call."""
        self.get(run_id).send(text)

    def cancel(self, run_id: str) -> bool:
        """Stop the run now (inside a model stream or a tool call too); False if it had ended."""
        return bool(self.get(run_id).cancel())

    def approve(
        self,
        run_id: str,
        approval_id: str,
        args_hash: str | None = None,
        reason: str = "approved by the user",
    ) -> None:
        """Approve a waiting call (with `args_hash`, only for the arguments it showed);
        `reason` says who did, to whoever decides it again too late."""
        self.get(run_id).approve(approval_id, args_hash, reason)

    def deny(self, run_id: str, approval_id: str, reason: str = "denied by the user") -> None:
        self.get(run_id).deny(approval_id, reason)

    async def answer(
        self,
        run_id: str,
        question_id: str,
        content: dict[str, Any] | None = None,
        *,
        action: Action = "accept",
        reason: str = "",
    ) -> None:
        """Answer a question a run's tool asked (an MCP server's elicitation, a
        `question_asked` event): `content` holds the fields it asked for; `action` "decline"
        or "cancel" refuses. On a store the answer is kept there, for a run waiting in any
        process (or in none: a resumed run takes it when the question is asked again).
        QuestionError if no such question waits, or the answer does not fit it."""
        given = Answer(action, content, reason)
        if self.questions.waits(run_id, question_id):
            await self.questions.answer(run_id, question_id, given)
        else:
            await self.backend.answer(run_id, question_id, given)

    def asked(self, run_id: str) -> list[Question]:
        """The questions a run waits on: of this process, else of the store (a run a worker
        elsewhere executes)."""
        here = self.questions.of_run(run_id)
        if here or run_id in self.runs:
            return here
        return self.view.questions(run_id)

    async def work(
        self, concurrency: int = 16, beat: float = 2.0, dead_after: float = 10.0
    ) -> None:
        """Execute the store's queued runs until cancelled (`tether worker`), beating every
        `beat` seconds and recovering the runs of workers silent for `dead_after` seconds."""
        self.check_open()
        await self.backend.work(concurrency, beat, dead_after)

    async def take_over(
        self,
        run_ids: list[str],
        sinks: list[Sink] | None = None,
        before: dict[str, list[Event]] | None = None,
    ) -> list[str]:
        """Execute here, among `run_ids`, the runs of the store that this machine's dead
        processes were executing, their events going to `sinks` (`before`: the events shown of
        each already, numbering goes on from there); the ids taken. None in memory."""
        self.check_open()
        return await self.backend.take_over(run_ids, list(sinks or []), dict(before or {}))

    @property
    def bus(self) -> Bus:
        """The event logs of this runtime's runs (a store's exist once it is entered)."""
        return self.backend.bus

    @property
    def runs(self) -> dict[str, Any]:
        return self.backend.runs

    def events(self, run_id: str, offset: int = 0) -> AsyncIterator[Event]:
        """The run's events from `offset`: replayed, then live, ending after `run_finished`.
        A run of the store that does not execute here is followed in its store (its steps
        as they are recorded; token deltas are only live where it executes)."""
        log = self.bus.logs.get(run_id)
        return (log if log is not None else self.view.log(run_id)).follow(offset)

    @property
    def view(self) -> RunsView:
        """Every run, wherever it executes, as a person reads them: this process's in
        memory, the store's on a store (entered first)."""
        return self.backend.view

    def stored_runs(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The runs of the store, wherever they execute, as `tether runs --json` lists them,
        oldest first (with `limit`, the most recent); none in memory."""
        return self.view.rows(limit)

    def stored_run(self, run_id: str) -> dict[str, Any] | None:
        """One run of the store as `stored_runs` lists it; None if the store has none."""
        return self.view.row(run_id)

    def check_open(self) -> None:
        if not self.entered:
            raise ConfigError(NOT_OPEN)


RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


def check_run_id(run_id: Any) -> str:
    """A run id names a file (the journal) and a record: letters, digits and `._:-`, up to
    128 characters, starting with a letter or digit."""
    if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
        raise ConfigError(
            f"run id {run_id!r}: use letters, digits and . _ : - (up to 128, starting with a "
            "letter or digit)"
        )
    return run_id
