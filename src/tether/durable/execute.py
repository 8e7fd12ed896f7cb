"""A durable run's execution: the workflow's body, in the process that executes it.

The run's agent is found again from its record (by name, or built from its options), its tools'
context is rebuilt, and its recorded steps are read for the replay; then the run lives as any
run does, under the one supervision loop (`run.supervise`: slots, attempts, restarts, idling),
over `RecordedEffects`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from ..accounts import Accounts
from ..admission import Limiter
from ..agent import Agent, execute
from ..errors import ConfigError, known
from ..events import Emitter
from ..messages import Message, Usage
from ..rates import Rates
from ..result import RunResult
from ..run import RestartPolicy, cancelled_summary, supervise
from ..tools.tool import Spawn
from ..tree import Allowance
from .effects import RecordedEffects
from .formats import RUN_FORMAT, RunRecord
from .run import DurableRun, context_of, recorded
from .versions import on_its_version

Resolver = Callable[[str, "dict[str, Any] | None"], Awaitable[Agent]]
"""Finds a run's agent: by its name among the registered ones, or built from the run's options
(`options.RunOptions`, as the CLI and the page record them) by the runtime's factory."""


@dataclasses.dataclass
class Executor:
    """What executing a run here takes from its process (`process.DurableRuns` makes one)."""

    resolve: Resolver
    run_slots: Limiter | None
    limiter_for: Callable[[Agent], Limiter | None]
    spawner: Callable[[str], Spawn] | None
    parent_of: Callable[[str], Allowance | None]
    accounts: Accounts | None = None
    rates: Rates | None = None


async def execute_run(
    how: Executor,
    run: DurableRun,
    record: RunRecord,
    task: str | None,
    history: list[Message] | None,
) -> dict[str, Any]:
    """Execute `run` here from its `record`, and return the workflow's output."""
    if record.format != RUN_FORMAT or record.agent is None:
        raise ConfigError(f"run {run.id} was recorded in another format")
    try:
        agent = await how.resolve(record.agent, record.options)
    except ConfigError as e:  # not to be built here (a worker's scope): it ends saying why
        return recorded(refused_here(run, str(e)))
    version = agent.effective_version
    await on_its_version(run.id, record, version, run.emitter, run.host.ledger)
    ctx = context_of(run.id, record)
    ctx.tree_sinks = run.sinks
    ctx.parent = how.parent_of(run.id)
    ctx.accounts, ctx.rates = how.accounts, how.rates
    if how.spawner is not None:
        ctx.spawn = how.spawner(record.approvals)
    run.executes(agent, ctx)
    if record.lineage:
        run.emitter.lineage = record.lineage
    effects = RecordedEffects(run, record, how.limiter_for(agent))
    fresh = run.fresh  # begun here: every call it reserved was reserved by this process
    if not fresh:
        effects.replay(await effects.ledger.call(effects.ledger.steps_of, run.id))
    run.fresh = False
    messages = [*(history or [])]
    if task is not None:  # a fork may go on from its history with no new message
        messages.append(Message.user(task, record.images))
    attempts = Attempts(run, agent, effects, await effects.filled(messages))
    policy = RestartPolicy(**record.restart)
    result = await supervise(attempts, policy, task, how.run_slots)
    if ctx.accounts is not None and ctx.account_id is not None and not settled(fresh, result):
        await ctx.accounts.release(run.id)  # what a failed step held counts as spent
    return recorded(result)


def refused_here(run: DurableRun, why: str) -> RunResult:
    """The end of a run whose agent this process will not build (a worker not given the code
    or the endpoint its record names): failed with the reason, in its events and its record,
    rather than a workflow's traceback in the worker's log."""
    error = {"kind": "config", "status": None, "message": why, "retryable": False}
    result = RunResult(run.id, "failed", "", why, Usage(), 0.0, 0, [], error)
    run.emitter.run_finished(**result.summary())
    return result


def settled(fresh: bool, result: RunResult) -> bool:
    """Whether a run can hold nothing against its account as it ends, so that the store need
    not be asked (a transaction a run, about 0.2 ms of CPU a call on Postgres): one begun here
    (no dead worker left it a reservation) that ended done or halted (each of its calls'
    settlements was recorded with its step, or written when it was cut short)."""
    return fresh and result.outcome in ("done", "halted")


class Attempts:
    """A durable run's side of `run.supervise`: an attempt is the driver over the recorded
    effects, going on with the conversation so far; the clock is the recorded one."""

    def __init__(
        self, run: DurableRun, agent: Agent, effects: RecordedEffects, messages: list[Message]
    ) -> None:
        self.run, self.agent, self.effects, self.messages = run, agent, effects, messages

    @property
    def emitter(self) -> Emitter:
        return self.run.emitter  # a follower that comes later gets a new one

    async def attempt(self, task: str | None) -> RunResult:
        state = self.agent.new_state(self.messages)
        context = known(self.run.context, "the context of a run that executes here")
        state.allowance = context.allowance = self.agent.allowance(self.run.id, context.parent)
        try:
            return await execute(self.agent, state, task, self.run.emitter, self.effects)
        except asyncio.CancelledError:
            self.run.kept = list(self.messages)  # what it had completed, for its handle
            raise

    async def idle(self) -> None:
        await self.effects.next_message()

    def cancelled_idle(self, last: RunResult) -> None:
        self.run.emitter.run_finished(**cancelled_summary(last, self.run.id))
        self.run.kept = list(self.messages)

    def now(self) -> float:
        return self.effects.now()
