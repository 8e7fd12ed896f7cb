"""The async driver: performs what the loop decides, emits events, and always ends with an outcome.

    agent = Agent(model, tools=[get_weather], system="Be brief.", budget=Budget(max_steps=10))
    result = await agent.run("Weather in Oslo?")
    result.outcome, result.answer

A run ends `done`, `halted` (a budget, with the reason), `failed` (the model call failed, with
the error) or `cancelled`. On cancel the `CancelledError` is re-raised after the transcript is
closed and `run_finished` is emitted; everything completed before the cancel stays in the
transcript the caller passed in.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from .accounts import OverBudget
from .admission import Limiter
from .approvals import Approver, Policy
from .children import run_child
from .context import ContextPolicy, estimate, fit, is_context_error
from .errors import (
    OutputInvalid,
    ProviderError,
    StoreUnavailable,
    known,
)
from .events import Emitter, Sink, images_data
from .guardrails import Guardrail, Kind, Verdict, tripped, verdicts
from .loop import (
    CHOICES,
    STARTED,
    Budget,
    CallModel,
    Finish,
    Happening,
    LoopState,
    ModelReplied,
    RunTools,
    ToolsDone,
    ask_to_check,
    choice_for,
    last_answer,
    output_room,
    step,
)
from .messages import ImagePart, Message, ModelRequest, ModelResponse, ToolCall, ToolResult, Usage
from .output import OUTPUT_TRIES, Output, retry_message
from .paying import lend_model, model_call, summarized
from .pricing import Price, price_for
from .providers.base import Model
from .rates import GATE, Gate, Rates
from .result import RunResult, close, finish_run, internal_error
from .tools.session import close_kept
from .tools.tool import RunContext, Tool, tool_from_function
from .tools.toolbox import Toolbox
from .tree import Allowance

NO_LIMIT = contextlib.nullcontext()
"""A run with no time limit runs in this, not in `asyncio.timeout(None)`: a `Timeout` a run,
held for its whole life, is an object more for every collection while it runs."""

CHILD_TIMEOUT = 3600.0
"""How long an agent used as a tool may take by default (its own budget and its parent's time
limit still hold): far longer than a plain tool's minute, as a child makes model calls."""


def fingerprint(agent: Agent) -> str:
    """A version for an agent that names none: twelve hex digits of a hash of its
    `definition`, so a changed prompt, model, tool schema, output type or guardrail is another
    version while a restart of the same code is the same one."""
    text = orjson.dumps(agent.definition(), option=orjson.OPT_SORT_KEYS, default=str)
    return hashlib.sha256(text).hexdigest()[:12]


@dataclass
class Agent:
    """A model, its tools, a system prompt and a budget: what a run runs. `agent.run(task)`
    runs the loop once; a `Runtime` runs it with an id, a mailbox, approvals and, on a
    store, crash recovery. `as_tool` makes it another agent's tool (a child run)."""

    model: Model
    tools: Iterable[Tool | Callable[..., Any]] = ()
    """Tools (`@tool` functions, `Agent.as_tool()`, a `Toolbox`), or plain typed functions,
    made tools as `@tool` would."""
    system: str | None = None
    budget: Budget = field(default_factory=Budget)
    prices: dict[str, Price] | None = None
    max_output_tokens: int | None = None
    context: ContextPolicy | None = None
    """Keeps requests inside the model's window (trims, then summarises); None: no management."""
    name: str = "agent"
    """What a `Runtime` finds the agent by; a store records it, so a process that registers an
    agent of the same name can resume the agent's runs."""
    tool_choice: str | None = None
    """`auto`, `required`, `none` or a tool's name, sent in each provider's own format;
    `required` and a name hold until the model has called a tool (see `loop.choice_for`)."""
    output_type: Any = None
    """A pydantic model class or a JSON Schema (a dict) the final answer must match; the
    run's `output` is the typed value (see `output`)."""
    input_guardrails: Sequence[Any] = ()
    """Checks of the task that can stop the run (functions or `Guardrail`s, see `guardrails`):
    they run beside the first model call, and no tool runs before they have passed."""
    output_guardrails: Sequence[Any] = ()
    """Checks of the final answer (its typed output) before the run reports it."""
    tool_guardrails: Sequence[Any] = ()
    """Checks of each tool call (a `ToolCall`) before any call of its reply runs."""
    check: str | None = None
    """A message that asks the model, once, to check its work against the task before its
    first final answer is taken (the terminal profile's `TERMINAL_CHECK`); None: no check."""
    version: str | None = None
    """The agent's version, which each run records at its start (`run_started`, the store,
    `tether runs`); None: `fingerprint`'s, of what changes behaviour. `effective_version` is
    the one used."""

    def __post_init__(self) -> None:
        self.toolbox = self.tools if isinstance(self.tools, Toolbox) else Toolbox(self.tools)
        names = [s.name for s in self.toolbox.specs]
        if self.tool_choice is not None and self.tool_choice not in (*CHOICES, *names):
            raise ValueError(
                f"tool_choice {self.tool_choice!r} is none of auto, required, none or a tool's "
                f"name ({', '.join(names) or 'no tools'})"
            )
        self.price = price_for(self.model.name, self.prices)
        self.output = None if self.output_type is None else Output(self.output_type)
        self.input_guards = [Guardrail.of(g) for g in self.input_guardrails]
        self.output_guards = [Guardrail.of(g) for g in self.output_guardrails]
        self.tool_guards = [Guardrail.of(g) for g in self.tool_guardrails]
        if self.version is not None and not self.version.strip():
            raise ValueError("version: give a name, or None for the agent's fingerprint")
        self.effective_version = self.version or fingerprint(self)

    def definition(self) -> dict[str, Any]:
        """What changes how the agent behaves (see `fingerprint`): its instructions, model,
        tools as the model sees them, output shape, guardrails and the rest of its settings."""
        return {
            "system": self.system,
            "check": self.check,
            "provider": self.model.provider,
            "model": self.model.name,
            "max_output_tokens": self.max_output_tokens,
            "tool_choice": self.tool_choice,
            "tools": [dataclasses.asdict(s) for s in self.toolbox.specs],
            "output": None if self.output is None else dataclasses.asdict(self.output.format),
            "guardrails": [
                [g.name for g in guards]
                for guards in (self.input_guards, self.output_guards, self.tool_guards)
            ],
        }

    def new_state(self, messages: list[Message]) -> LoopState:
        return LoopState(messages, self.system, self.toolbox.specs)

    async def run(
        self,
        task: str | None,
        *,
        images: Sequence[ImagePart] = (),
        transcript: list[Message] | None = None,
        context: RunContext | None = None,
        run_id: str | None = None,
        sinks: list[Sink] | None = None,
        approver: Approver | None = None,
        inbox: list[str] | None = None,
        emitter: Emitter | None = None,
        limiter: Limiter | None = None,
        reraise_cancel: bool = True,
    ) -> RunResult:
        """Run until the model answers, a budget halts it, or a call fails.

        `transcript` is the conversation so far and is extended in place (so a caller keeps
        completed work even when the run is cancelled); `task` is appended as a user message,
        with `images` (see `ImagePart.load`).
        The runtime attaches the rest: `approver` decides calls that need approval, `inbox`
        holds user messages that arrive mid-run, `emitter` numbers the events, `limiter`
        bounds concurrent calls to the model's endpoint. With `reraise_cancel=False` a cancel
        returns the cancelled result instead of raising (for a task that owns the run).
        """
        ctx = context or RunContext()
        run_id = run_id or ctx.run_id or uuid.uuid4().hex[:12]
        ctx.run_id = run_id
        messages = transcript if transcript is not None else []
        if task is not None:
            messages.append(Message.user(task, tuple(images)))
        state = self.new_state(messages)
        state.started_at = time.monotonic()
        if inbox is not None:
            state.inbox = inbox
        emitter = emitter or Emitter(run_id, sinks)
        state.allowance = ctx.allowance = self.allowance(run_id, ctx.parent)
        if ctx.parent is not None:
            emitter.lineage = ctx.lineage()
        elif sinks and not ctx.tree_sinks:
            ctx.tree_sinks = list(sinks)  # the root's watchers see its children too
        effects = LocalEffects(self, ctx, emitter, approver, limiter)
        try:
            return await execute(self, state, task, emitter, effects, reraise_cancel)
        finally:
            await close_kept(ctx.kept)  # what the tools left running ends with the run

    def allowance(self, run_id: str, parent: Allowance | None) -> Allowance:
        """A run's share of its tree's budget: this agent's limits, under its parent's."""
        b = self.budget
        return Allowance(run_id, b.max_steps, b.max_tokens, b.max_cost_usd, parent)

    def as_tool(
        self,
        name: str | None = None,
        description: str | None = None,
        *,
        timeout: float = CHILD_TIMEOUT,
        approval: Policy = "never",
    ) -> Tool:
        """This agent as a tool of another. A call starts a child run on the task the model
        writes (in the same runtime, found by its id, `PARENT.CALL`); its answer is the
        result (its typed output as JSON). The child draws on the caller's budget (`tree`),
        is cancelled with the call, and one that does not end `done` gives an error result
        that says why. `timeout` bounds the child's time, as any tool's. On a store the
        child is a durable run of its own, and a repeat of the call after a crash goes on
        with the same child (so the tool is idempotent)."""
        agent = self

        async def delegate(task: str, ctx: RunContext) -> str:
            """Args:
            task: Everything the agent needs to do the task: it sees nothing else of this
                conversation.
            """
            return await run_child(agent, task, ctx)

        summary = description or f"Hand a task to the agent {self.name} and get its answer."
        made = tool_from_function(
            delegate, name=name or self.name, description=summary, timeout=timeout
        )
        made.approval = approval
        made.agent = self
        made.idempotent = True  # a repeat finds the child by its id (PARENT.CALL) and waits
        return made

    def price_of(self, response: ModelResponse) -> Price | None:
        """The price of a fallback model that answered (None: the agent's own, `price`, which
        also stands for a fallback whose price is unknown, so a budget still counts it)."""
        if response.served_by and response.served_by != self.model.name:
            return price_for(response.served_by, self.prices)
        return None

    def charge(self, state: LoopState, usage: Usage) -> None:
        """Count a model call made outside the loop (a summary) in the run's usage and cost."""
        if usage != Usage():
            state.usage = state.usage + usage
            if self.price is not None:
                state.cost_usd += self.price.cost(usage)

    def request(self, state: LoopState) -> ModelRequest:
        """The next model call's request: the conversation as it stands."""
        limit = output_room(state, self.budget, self.max_output_tokens)
        choice = choice_for(self.tool_choice, state.messages)
        output = None if self.output is None else self.output.format
        messages = tuple(state.messages)
        return ModelRequest(messages, state.tools, state.system, limit, choice, output, state.wire)

    def started(self, task: str | None, **extra: Any) -> dict[str, Any]:
        """The `run_started` event's data (see `RunResult.summary` for the other end)."""
        b = self.budget
        return {
            "task": task,
            "provider": self.model.provider,
            "model": self.model.name,
            "agent": self.name,
            "version": self.effective_version,
            "budget": {
                "max_steps": b.max_steps,
                "max_tokens": b.max_tokens,
                "max_cost_usd": b.max_cost_usd,
                "max_seconds": b.max_seconds,
            },
            **extra,
        }


# -- the one driver ----------------------------------------------------------------------------


class Effects(Protocol):
    """What the driver asks of the world. In memory (`LocalEffects`) each is a plain call; in a
    durable run (`durable.RecordedEffects`) each is a recorded step, so a replay after a crash
    gets the same answers without doing the work again. Effects emit their own events (a
    replayed step must not show its events twice)."""

    def now(self) -> float:
        """The clock the time budget is checked against (a replay must read the same time)."""
        ...

    async def fit(self, state: LoopState, force: bool) -> None:
        """Make `state.messages` fit the agent's context policy (shrink anyway with `force`)."""
        ...

    def call_model(self, state: LoopState) -> Awaitable[ModelResponse]:
        """One model call on the conversation as it stands (an awaitable, so an effect that
        only hands on another's adds no coroutine of its own)."""
        ...

    def run_tools(self, state: LoopState, calls: list[ToolCall]) -> Awaitable[list[ToolResult]]:
        """The calls of one reply, approvals decided, results in the order of the calls."""
        ...

    def stopped(self) -> StoreUnavailable | None:
        """Why the effects had the run's task cancelled, when it was not a cancel: a durable
        store that stopped answering ends the run `failed` with this error (it is not lost:
        the store keeps it). None for a cancel."""
        ...

    async def guard(self, kind: Kind, value: Any) -> list[Verdict]:
        """The verdicts of the agent's `kind` guardrails on `value`, each a `guardrail` event."""
        ...

    def told(self, text: str) -> None:
        """Say that the runtime added a user message to the conversation (the check before
        the answer), as a `user_message` event."""
        ...

    guard_beside_model: bool
    """Whether input guardrails may run while the first model call is under way (in memory);
    a durable run asks them first, so its steps keep one order for a replay."""

    origin: dict[str, Any]
    """A fork's origin (`forked_from`, `at`), which its `run_started` carries; else empty."""

    account: str | None
    """The run's account (`accounts.py`), which its `run_started` names; None: none."""

    rates: Rates | None
    """Where its endpoints' rate limits are kept (`rates.py`): every HTTP attempt of the run
    passes them. None: not gated."""


async def drive(
    agent: Agent, state: LoopState, effects: Effects, inputs: Awaitable[Verdict | None] | None
) -> Finish:
    """Perform what the step function decides until it says to finish. `inputs`: the input
    guardrails' first trip, awaited before any tool runs and before any answer."""
    happened: Happening = STARTED
    while True:
        spent = state.cost_usd
        action = step(state, happened, agent.budget, agent.price, effects.now())
        if isinstance(happened, ModelReplied) and state.allowance is not None:
            state.allowance.charge(happened.response.usage, state.cost_usd - spent)
        if isinstance(action, (RunTools, Finish)) and inputs is not None:
            trip = await inputs
            inputs = None
            if trip is not None:  # the reply is not reported; its calls are closed unrun
                return Finish("halted", "", trip.reason)
        if isinstance(action, Finish):
            if action.outcome == "done" and ask_to_check(
                state, agent.check, agent.budget, agent.price, effects.now()
            ):
                effects.told(state.messages[-1].text)
                happened = STARTED  # the model checks its work, then answers again
                continue
            if action.outcome != "done" or agent.output is None or typed(agent, state, action):
                return await checked(agent, state, effects, action)
            happened = STARTED  # told what does not match: the model answers again
            continue
        if isinstance(action, CallModel):
            refused = state.allowance.reserve() if state.allowance is not None else ""
            if refused:  # a limit of the tree this run is part of
                return Finish("halted", last_answer(state.messages), refused)
            try:
                response = await model_turn(agent, state, effects)
            except OverBudget as e:  # its account has no room for the call
                return Finish("halted", last_answer(state.messages), e.reason)
            happened = ModelReplied(response, agent.price_of(response))
        elif isinstance(action, RunTools):
            if agent.tool_guards:  # (most agents have none: no coroutine a turn for them)
                trip = await calls_trip(agent, effects, action.calls)
                if trip is not None:  # no call of the reply runs: they are closed unrun
                    return Finish("halted", "", trip.reason)
            state.finished = {}
            happened = ToolsDone(await effects.run_tools(state, list(action.calls)))


async def checked(agent: Agent, state: LoopState, effects: Effects, finish: Finish) -> Finish:
    """The run's end once the output guardrails have seen its answer (its typed output): a
    trip ends it `halted`, and the answer is not reported."""
    if finish.outcome != "done" or not agent.output_guards:
        return finish
    value = state.output if agent.output is not None else finish.answer
    trip = tripped(await effects.guard("output", value))
    if trip is None:
        return finish
    state.output = None
    return Finish("halted", "", trip.reason)


async def first_trip(effects: Effects, task: str) -> Verdict | None:
    return tripped(await effects.guard("input", task))


async def calls_trip(agent: Agent, effects: Effects, calls: list[ToolCall]) -> Verdict | None:
    """The first tool guardrail a reply's calls trip, each call asked in turn (a durable run
    records a step per call)."""
    for call in calls:
        trip = tripped(await effects.guard("tool", call))
        if trip is not None:
            return trip
    return None


async def judge(agent: Agent, kind: Kind, value: Any, emitter: Emitter) -> list[Verdict]:
    """The verdicts of the agent's `kind` guardrails on `value`, each said as a `guardrail`
    event (in memory at once; in a durable run inside the step that records them)."""
    guards = {"input": agent.input_guards, "tool": agent.tool_guards, "output": agent.output_guards}
    found = await verdicts(guards[kind], kind, value)
    for v in found:
        if isinstance(value, ToolCall):  # which call it judged
            emitter.guardrail(**v.to_dict(), id=value.id)
        else:
            emitter.guardrail(**v.to_dict())
    return found


def typed(agent: Agent, state: LoopState, finish: Finish) -> bool:
    """Whether the final answer matches the agent's output type (then `state.output` is its
    value); if not, the model is told what is wrong, and after `OUTPUT_TRIES` answers the run
    fails. Pure, so a durable replay decides the same."""
    output = known(agent.output, "the output type of an agent that has one")
    try:
        state.output = output.parse(finish.answer)
        return True
    except ValueError as e:
        state.output_tries += 1
        if state.output_tries >= OUTPUT_TRIES:
            raise OutputInvalid(
                f"the answer does not match the output schema after {OUTPUT_TRIES} tries: {e}"
            ) from None
        state.messages.append(Message.user(retry_message(e)))
        return False


def model_turn(agent: Agent, state: LoopState, effects: Effects) -> Awaitable[ModelResponse]:
    """A model call, with the context kept inside the window if the agent has a context
    policy (`fitted_turn`); without one, the call itself, not a coroutine more around it."""
    if agent.context is None:
        return effects.call_model(state)
    return fitted_turn(agent, state, effects)


async def fitted_turn(agent: Agent, state: LoopState, effects: Effects) -> ModelResponse:
    """A model call with the context kept inside the window: fitted first when the estimate is
    over the limit, and shrunk and retried once when the server still says it is too long."""
    policy = known(agent.context, "the context policy of an agent that fits its context")
    if estimate(state.messages, state.system) > policy.limit:
        await effects.fit(state, False)
    try:
        return await effects.call_model(state)
    except ProviderError as e:
        if not is_context_error(e):
            raise
        await effects.fit(state, True)
        return await effects.call_model(state)


async def execute(
    agent: Agent,
    state: LoopState,
    task: str | None,
    emitter: Emitter,
    effects: Effects,
    reraise_cancel: bool = True,
) -> RunResult:
    """One run from `run_started` to `run_finished`, whatever happens in between: the time
    limit cuts a model call or a tool call in flight, a cancel closes the open calls and keeps
    what completed, a failed model call or a bug ends the run `failed` with the error."""
    shown = state.messages[-1].images if task is not None and state.messages else []
    account = {"account": effects.account} if effects.account else {}
    emitter.run_started(**agent.started(task, **images_data(shown), **effects.origin, **account))
    error: dict[str, Any] | None = None
    limit = agent.budget.max_seconds
    inputs: asyncio.Task[Verdict | None] | None = None
    gate = GATE.set(Gate(effects.rates, emitter) if effects.rates is not None else None)
    try:
        try:
            async with asyncio.timeout(limit) if limit is not None else NO_LIMIT:
                if agent.input_guards and task is not None:
                    inputs = asyncio.ensure_future(first_trip(effects, task))
                    if not effects.guard_beside_model:
                        await inputs
                finish = await drive(agent, state, effects, inputs)
                if finish.outcome != "done":
                    close(emitter, state, "Not run: the run was stopped.")
        except TimeoutError:
            if limit is None:
                raise
            close(emitter, state, "Cancelled: the run's time limit was reached.")
            reason = f"timeout: the limit of {limit:g} s was reached"
            finish = Finish("halted", last_answer(state.messages), reason)
    except asyncio.CancelledError:
        stopped = effects.stopped()
        if stopped is None:
            close(emitter, state, "Cancelled before the tool finished.")
            ended = Finish("cancelled", last_answer(state.messages), "cancelled")
        else:
            close(emitter, state, f"Not finished: {stopped}.")
            error = stopped.to_dict()
            ended = Finish("failed", last_answer(state.messages), str(stopped))
        result = finish_run(emitter, state, ended, error)
        task_ = asyncio.current_task()
        if reraise_cancel or task_ is None:
            raise
        task_.uncancel()
        return result
    except (ProviderError, OutputInvalid) as e:
        close(emitter, state, "Not run: the model call failed.")
        error = e.to_dict()
        finish = Finish("failed", last_answer(state.messages), str(e))
    except Exception as e:  # a bug in Tether or a user hook: still end with an outcome
        close(emitter, state, "Not run: the run failed.")
        error = internal_error(e)
        finish = Finish("failed", last_answer(state.messages), f"{type(e).__name__}: {e}")
    finally:
        GATE.reset(gate)  # its HTTP attempts passed the run's rates (`rates.py`)
        if inputs is not None and not inputs.done():
            inputs.cancel()
    return finish_run(emitter, state, finish, error)


class LocalEffects:
    """The driver's effects in memory: each a plain call, events emitted as they happen."""

    def __init__(
        self,
        agent: Agent,
        ctx: RunContext,
        emitter: Emitter,
        approver: Approver | None,
        limiter: Limiter | None,
    ) -> None:
        self.agent, self.ctx, self.emitter = agent, ctx, emitter
        self.origin, self.account, self.rates = ctx.origin, ctx.account_id, ctx.rates
        self.approver, self.limiter = approver, limiter
        self.calls = 0  # model calls made, which name each call to the run's account
        self.tools_ctx: RunContext | None = None  # what its tools get: made at its first call

    guard_beside_model = True

    def now(self) -> float:
        return time.monotonic()

    def told(self, text: str) -> None:
        self.emitter.user_message(text=text, by="check")

    def stopped(self) -> StoreUnavailable | None:
        return None  # nothing but a cancel stops a run in memory

    async def guard(self, kind: Kind, value: Any) -> list[Verdict]:
        return await judge(self.agent, kind, value, self.emitter)

    async def fit(self, state: LoopState, force: bool) -> None:
        agent = self.agent
        window = known(agent.context, "the context window of an agent that fits one")
        usage = await fit(agent.model, state.messages, state.system, window, self.emitter, force)
        agent.charge(state, usage)
        self.calls += 1
        await summarized(agent, self.ctx, usage, f"summary {self.calls}")

    def call_model(self, state: LoopState) -> Awaitable[ModelResponse]:
        self.calls += 1
        return model_call(
            self.agent, self.ctx, f"call {self.calls}", self.agent.request(state),
            state.steps == 0, self.emitter, self.limiter,
        )  # fmt: skip

    def run_tools(self, state: LoopState, calls: list[ToolCall]) -> Awaitable[list[ToolResult]]:
        ctx = self.tools_ctx
        if ctx is None:  # the run's context, with the run's model for its tools to ask
            ctx = self.tools_ctx = self.ctx.copy()
            lend_model(self.agent, ctx, self.emitter)
        return self.agent.toolbox.run_all(calls, ctx, self.emitter, self.approver, state.finished)
