"""A run's model calls, paid for: each reserved against the run's account before it is made
and settled with what it used after (`accounts.py`), a tool's requests to the run's model
(an MCP server's sampling) reserved against the run's and its tree's limits too, and a summary
that fitted the context counted after the fact. The in-memory driver (`agent.LocalEffects`)
and the durable one (`durable.effects`) both pay through here: one rule for both.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from .accounts import Cost, OverBudget, cost_of
from .accounts import estimate as estimate_cost
from .admission import Limiter, aside
from .calls import answered, respond
from .context import estimate
from .errors import ProviderStatusError
from .events import Emitter
from .messages import ModelRequest, ModelResponse, Usage
from .pricing import Price
from .providers.base import Model
from .tools.tool import RunContext


class Payer(Protocol):
    """What paying needs of a run's agent (an `Agent`): its model and its prices."""

    model: Model
    price: Price | None

    def price_of(self, response: ModelResponse) -> Price | None: ...


def model_call(
    agent: Payer,
    ctx: RunContext,
    key: str,
    request: ModelRequest,
    first: bool,
    emitter: Emitter,
    limiter: Limiter | None,
    used: Callable[[Cost], Awaitable[None]] | None = None,
    sent: Callable[[], None] | None = None,
) -> Awaitable[ModelResponse]:
    """A run's model call, the same in memory and in a durable run's step: paid for (`paid`),
    said as `model_request` when it goes (`sent` is told then: what waited before, for its
    account or a slot, is no model latency), with its text, retries and fallbacks as they
    come, and as `model_response` when it is answered, its tool calls' ids made unique in the
    conversation (a durable run records the reply so: a replay agrees). With nothing to pay,
    the call is `respond`'s coroutine itself, which says the reply: a run in flight holds no
    coroutine of this layer."""
    if ctx.accounts is None or ctx.account_id is None:  # nothing to pay: no layer for it
        return go(agent, request, emitter, limiter, sent, said=True)
    return paid_call(agent, ctx, key, request, first, emitter, limiter, used, sent)


async def paid_call(
    agent: Payer,
    ctx: RunContext,
    key: str,
    request: ModelRequest,
    first: bool,
    emitter: Emitter,
    limiter: Limiter | None,
    used: Callable[[Cost], Awaitable[None]] | None,
    sent: Callable[[], None] | None,
) -> ModelResponse:
    """`model_call` for a run with an account: reserved, made, settled, then said."""
    goes = functools.partial(go, agent, request, emitter, limiter, sent)
    response = await paid(agent, ctx, key, request, first, emitter, goes, used)
    return answered(request, response, emitter)


def go(
    agent: Payer,
    request: ModelRequest,
    emitter: Emitter,
    limiter: Limiter | None,
    sent: Callable[[], None] | None,
    said: bool = False,
) -> Awaitable[ModelResponse]:
    """The request goes (paid for, if it is): said as `model_request`, `sent` told; with
    `said`, its reply is `answered` too."""
    if sent is not None:
        sent()
    on_text = emitter.streamed if emitter.active else None
    if emitter.active:
        emitter.model_request(messages=len(request.messages))
    return respond(agent.model, request, emitter, limiter, on_text, emitter.retried, said)


QUEUE_POLL_S = 5.0
"""How often a run held for its account's room (a limit's `when_over="queue"`) asks again."""


async def paid(
    agent: Payer,
    ctx: RunContext,
    key: str,
    request: ModelRequest,
    first: bool,
    emitter: Emitter,
    call: Callable[[], Awaitable[ModelResponse]],
    used: Callable[[Cost], Awaitable[None]] | None = None,
) -> ModelResponse:
    """`call` (the model call of `request`), reserved against the run's account before it is
    made and settled with what it used after (`accounts.py`); `key` names the call within the
    run. An account with no room raises `OverBudget` (the run halts), except before a run's
    `first` call when its limit says to queue: the run then waits for room. `used`, if given,
    settles a call that answered instead (a durable run's rides with its step's record)."""
    accounts, account = ctx.accounts, ctx.account_id
    if accounts is None or account is None:
        return await call()
    run_id = ctx.run_id
    held = estimate_cost(request.messages, request.system, request.max_output_tokens, agent.price)
    waited = False
    while refused := await accounts.reserve(account, run_id, key, held):
        limits = (await accounts.standing(account)).limits
        if not first or limits is None or limits.when_over != "queue":
            raise OverBudget(refused)
        if not waited:
            emitter.queued(what="account", account=account, reason=refused)
            waited = True
        async with aside():  # its slot among the process's runs, to others meanwhile
            await accounts.pause(QUEUE_POLL_S)
    if waited:
        emitter.admitted(what="account")
    try:
        response = await call()
    except ProviderStatusError:  # the server refused it (an error status): nothing spent
        await asyncio.shield(accounts.settle(account, run_id, key, Cost()))
        raise
    except BaseException:  # cut short (a cancel, a dropped stream): it may have been paid for
        await asyncio.shield(accounts.settle(account, run_id, key, held))
        raise
    cost = cost_of(response.usage, agent.price_of(response) or agent.price)
    await (used(cost) if used is not None else accounts.settle(account, run_id, key, cost))
    return response


@dataclass(eq=False)
class Sampling:
    """The run's model as a tool asks it on the run's behalf (an MCP server's sampling, the
    tool's `RunContext.model`): each request is a model call of the run, reserved before it is
    made against the run's and its tree's limits (`Allowance`, its expected tokens counted)
    and against its account (`paid`), and charged to both after. Refused, it raises
    `OverBudget` with the reason, for the tool to tell the server; the call is not made. (It
    went to the model directly: 30 requests in one tool call spent 60,006 tokens against
    `--max-tokens 600`, and an account's ledger saw 12 of them.)"""

    agent: Payer
    ctx: RunContext
    emitter: Emitter

    @property
    def name(self) -> str:
        return self.agent.model.name

    async def respond(self, request: ModelRequest) -> ModelResponse:
        agent, allowance = self.agent, self.ctx.allowance
        tokens = estimate(list(request.messages), request.system)
        tokens += request.max_output_tokens or 0
        refused = allowance.reserve(tokens) if allowance is not None else ""
        if refused:
            raise OverBudget(refused)
        key = f"sample {self.ctx.call_id or ''} {uuid.uuid4().hex[:12]}"
        try:
            response = await paid(
                agent, self.ctx, key, request, False, self.emitter,
                lambda: agent.model.respond(request),
            )  # fmt: skip
        finally:
            if allowance is not None:
                allowance.release(tokens)
        if allowance is not None:
            cost = cost_of(response.usage, agent.price_of(response) or agent.price)
            allowance.charge(response.usage, cost.usd)
        return response


def lend_model(agent: Payer, ctx: RunContext, emitter: Emitter) -> None:
    """Give the tools of `ctx` the run's model to ask (`RunContext.model`, a `Sampling`). The
    `Sampling` keeps a copy of the context without it: a context that held its model, which
    held the context, was a reference cycle, so every ended run's context, allowance, spawner,
    emitter and event log waited for the collector's full pass (17 objects a run in the rig's
    scenario, where the bare loop leaves none)."""
    ctx.model = Sampling(agent, ctx.copy(model=None), emitter)


async def summarized(
    agent: Payer,
    ctx: RunContext,
    usage: Usage,
    key: str,
    used: Callable[[Cost], Awaitable[None]] | None = None,
) -> None:
    """Count a call that fitted the context (a summary) against the run's account, after the
    fact: it is not reserved (the window, not the budget, asked for it), but it is paid for.
    `used`, if given, counts it instead (a durable run's rides with its step's record)."""
    accounts, account = ctx.accounts, ctx.account_id
    if accounts is None or account is None or usage == Usage():
        return
    cost = cost_of(usage, agent.price)
    await (used(cost) if used is not None else accounts.settle(account, ctx.run_id, key, cost))
