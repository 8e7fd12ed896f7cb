"""The agent loop as a step function: (state, what just happened) -> what to do next. No I/O.

    Started ──► CallModel ──► ModelReplied ──► RunTools ──► ToolsDone ──► CallModel ...
                    │                │
                    └► Finish        └► Finish(done)        (budgets are checked before each call)

The async driver (`agent.py`) performs the actions; everything that decides lives here, so it
is tested without a network and replayed from a journal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .frozen import quick_init
from .messages import (
    Message,
    ModelRequest,
    ModelResponse,
    Part,
    ToolCall,
    ToolResult,
    ToolSpec,
    Usage,
    WireMemo,
    message_chars,
)
from .pricing import Price
from .tree import Allowance

Outcome = Literal["done", "halted", "cancelled", "failed"]


@dataclass(frozen=True, slots=True)
class Budget:
    """Hard limits, all checked before every model call. None means no limit."""

    max_steps: int | None = None
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    max_tokens: int | None = None
    max_cost_usd: float | None = None
    max_seconds: float | None = None


@dataclass(slots=True)
class LoopState:
    messages: list[Message]
    system: str | None = None
    tools: tuple[ToolSpec, ...] = ()
    steps: int = 0
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0
    started_at: float = 0.0
    last_usage: Usage | None = None
    """Usage of the last model call: the base for estimating the next call's input."""
    tools_chars: int = -1
    inbox: list[str] = field(default_factory=list)
    """User messages that arrived while the model or tools were busy: delivered together, before
    the next model call (the run's mailbox puts them here; the step function takes them out)."""
    finished: dict[str, ToolResult] = field(default_factory=dict)
    """Results of the current reply's calls as each completes: a cancel keeps them."""
    output: Any = None
    """The typed final answer, once it matched the agent's output type."""
    output_tries: int = 0
    """Final answers that did not match it (see `agent.typed`)."""
    allowance: Allowance | None = None
    """The run's share of its tree's budget: each model call is reserved against it first."""
    checked: bool = False
    """Whether the model was asked to check its work before answering (see `ask_to_check`)."""
    wire: WireMemo = field(default_factory=WireMemo)
    """Its messages as its model's provider sends them, each converted once (`WireMemo`)."""


# What just happened
@dataclass(frozen=True, slots=True)
class Started:
    pass


STARTED = Started()
"""The one `Started` (it holds nothing): not an object a run, held for as long as it runs."""


@quick_init
@dataclass(frozen=True, slots=True)
class ModelReplied:
    response: ModelResponse
    price: Price | None = None
    """What the model that answered costs, when it is not the run's own (a fallback)."""


@quick_init
@dataclass(frozen=True, slots=True)
class ToolsDone:
    results: list[ToolResult]


Happening = Started | ModelReplied | ToolsDone


# What to do next
@quick_init
@dataclass(frozen=True, slots=True)
class CallModel:
    pass


CALL_MODEL = CallModel()
"""The one `CallModel` (it holds nothing): not an object a turn, held across the call."""


@quick_init
@dataclass(frozen=True, slots=True)
class RunTools:
    calls: list[ToolCall]


@quick_init
@dataclass(frozen=True, slots=True)
class Finish:
    outcome: Outcome
    answer: str = ""
    reason: str = ""


Action = CallModel | RunTools | Finish


def step(
    state: LoopState, happened: Happening, budget: Budget, price: Price | None, now: float
) -> Action:
    """Record what happened in `state` and decide the next action."""
    if isinstance(happened, ModelReplied):
        r = happened.response
        state.messages.append(r.message)
        state.steps += 1
        state.usage = state.usage + r.usage
        state.last_usage = r.usage
        paid = happened.price or price
        if paid is not None:
            state.cost_usd += paid.cost(r.usage)
        calls = r.message.tool_calls
        if calls:
            return RunTools(calls)
        if not state.inbox and r.stop_reason != "pause":  # a paused turn goes on (budget allowing)
            cut = "max_tokens: the reply was cut at the model's output limit"
            answer = turn_text(state.messages)
            return Finish("done", answer, cut if r.stop_reason == "max_tokens" else "")
    if isinstance(happened, ToolsDone):
        state.messages.append(Message("tool", tuple(happened.results)))
        for result in happened.results:  # the model, asked by a tool (MCP sampling)
            if result.usage is not None:
                state.usage = state.usage + result.usage
                if price is not None:
                    state.cost_usd += price.cost(result.usage)
    if state.inbox:  # messages sent meanwhile go to the model together, never lost
        state.messages.extend(Message.user(text) for text in state.inbox)
        state.inbox.clear()
    reason = over_budget(state, budget, price, now)
    if reason:
        return Finish("halted", answer=last_answer(state.messages), reason=reason)
    return CALL_MODEL


def ask_to_check(
    state: LoopState, check: str | None, budget: Budget, price: Price | None, now: float
) -> bool:
    """Whether the model's first final answer waits for a check of its work: once a run, the
    `check` message goes to the model, which may then use tools and answers again. With no
    room in the budget for another call, the answer is taken as it is."""
    if check is None or state.checked or over_budget(state, budget, price, now):
        return False
    state.checked = True
    state.messages.append(Message.user(check))
    return True


CHOICES = ("auto", "required", "none")


def choice_for(choice: str | None, messages: Sequence[Message]) -> str | None:
    """The tool choice of the next call. `required` and a tool's name hold until the model has
    called a tool since the user last spoke, then the model chooses (`auto`): a model told to
    call a tool on every turn would never answer. `none` and `auto` hold throughout."""
    if choice is None or choice in ("auto", "none"):
        return choice
    for m in reversed(messages):
        if m.role == "tool":
            return None
        if m.role == "user":
            break
    return choice


def turn_text(messages: list[Message]) -> str:
    """The text of the model's last turn: its trailing assistant messages (more than one when
    the server paused the turn and the model went on with it)."""
    texts: list[str] = []
    for m in reversed(messages):
        if m.role != "assistant":
            break
        texts.append(m.text)
    return "".join(reversed(texts))


def over_budget(state: LoopState, budget: Budget, price: Price | None, now: float) -> str:
    """Why the next model call must not be made, or "" if it may."""
    b = budget
    if b.max_steps is not None and state.steps >= b.max_steps:
        return f"max_steps: {state.steps} model calls made, the limit is {b.max_steps}"
    if b.max_seconds is not None and now - state.started_at >= b.max_seconds:
        return f"timeout: {now - state.started_at:.1f} s elapsed, the limit is {b.max_seconds:g} s"
    u = state.usage
    if b.max_output_tokens is not None and u.output_tokens >= b.max_output_tokens:
        return f"max_output_tokens: {u.output_tokens} used, the limit is {b.max_output_tokens}"
    if b.max_input_tokens is None and b.max_tokens is None and b.max_cost_usd is None:
        return ""
    est = estimate_next_input(state)
    if b.max_input_tokens is not None and u.input_tokens + est > b.max_input_tokens:
        return (
            f"max_input_tokens: {u.input_tokens} used and the next call needs about {est}, "
            f"the limit is {b.max_input_tokens}"
        )
    if b.max_tokens is not None and u.total_tokens + est > b.max_tokens:
        return (
            f"max_tokens: {u.total_tokens} used and the next call needs about {est}, "
            f"the limit is {b.max_tokens}"
        )
    if b.max_cost_usd is not None:
        next_cost = price.cost(Usage(input_tokens=est)) if price else 0.0
        if state.cost_usd + next_cost > b.max_cost_usd:
            return (
                f"max_cost: ${state.cost_usd:.4f} spent and the next call costs about "
                f"${next_cost:.4f}, the limit is ${b.max_cost_usd:g}"
            )
    return ""


def output_room(state: LoopState, budget: Budget, per_call: int | None) -> int | None:
    """The most output the next call may bring: the call's own limit, and what the run's
    output and total budgets have left (sent as the request's limit, so a server stops there,
    and a stream that goes on past it is stopped by the client)."""
    u, b = state.usage, budget
    room = [per_call] if per_call is not None else []
    if b.max_output_tokens is not None:
        room.append(b.max_output_tokens - u.output_tokens)
    if b.max_tokens is not None:
        room.append(b.max_tokens - u.total_tokens - estimate_next_input(state))
    return max(1, min(room)) if room else None


def estimate_next_input(state: LoopState) -> int:
    """Input tokens the next call will send: the last call's input and output plus what was
    added since, or a character estimate of everything on the first call."""
    if state.last_usage is not None and state.last_usage.input_tokens > 0:
        since = 0
        for m in reversed(state.messages):
            if m.role == "assistant":
                break
            since += message_chars(m)
        return state.last_usage.input_tokens + state.last_usage.output_tokens + since // 4
    if state.tools_chars < 0:
        state.tools_chars = sum(
            len(t.name) + len(t.description) + len(str(t.parameters)) for t in state.tools
        )
    chars = len(state.system or "") + state.tools_chars
    chars += sum(message_chars(m) for m in state.messages)
    return chars // 4 + 1


def with_usage(request: ModelRequest, response: ModelResponse) -> ModelResponse:
    """The response, with token counts estimated (about four characters a token, from the
    request and what came back) and marked `estimated` when its server sent none: a server that
    sends no usage (llama.cpp's in a stream, some gateways) must not slip past the token
    budgets."""
    u = response.usage
    if u.input_tokens > 0 or u.output_tokens > 0:  # the server counted: its word stands
        return response
    out_chars = message_chars(response.message) - 4
    chars = len(request.system or "") + sum(message_chars(m) for m in request.messages)
    chars += sum(len(t.name) + len(t.description) + len(str(t.parameters)) for t in request.tools)
    usage = dataclasses.replace(
        u,
        input_tokens=chars // 4 + 1,
        output_tokens=out_chars // 4 + 1 if out_chars > 0 else 0,
        estimated=True,
    )
    return dataclasses.replace(response, usage=usage)


def unique_calls(response: ModelResponse, messages: Sequence[Message]) -> ModelResponse:
    """The reply with every tool call's id unique in the conversation. A server may reuse an
    id in a later turn, or within one reply, or leave ids out (and get `call_0` each turn):
    then a record keyed by call id (the durable journal, an approval, an idempotency key)
    would take a new call for an old one. A repeated or empty id gets a suffix; the model sees
    the new id in the history and in the result, so the conversation stays consistent."""
    calls = response.message.tool_calls
    if not calls:
        return response
    seen = {
        p.id for m in messages if m.role == "assistant" for p in m.parts if isinstance(p, ToolCall)
    }
    ids = [c.id for c in calls]
    if "" not in ids and len(set(ids)) == len(ids) and seen.isdisjoint(ids):
        return response
    parts: list[Part] = []
    for p in response.message.parts:
        if isinstance(p, ToolCall):
            if not p.id or p.id in seen:
                base, n = p.id or "call", 2
                while f"{base}_{n}" in seen:
                    n += 1
                p = dataclasses.replace(p, id=f"{base}_{n}")
            seen.add(p.id)
        parts.append(p)
    message = dataclasses.replace(response.message, parts=tuple(parts))
    return dataclasses.replace(response, message=message)


def last_answer(messages: list[Message]) -> str:
    for m in reversed(messages):
        if m.role == "assistant" and m.text:
            return m.text
    return ""


def close_open_calls(
    messages: list[Message], why: str, finished: dict[str, ToolResult] | None = None
) -> list[ToolResult]:
    """Give every tool call that has no result an error result (or the result it had already
    produced, from `finished`), so the transcript stays a valid conversation for the provider
    after a cancel or a crash; returns the error results it made."""
    if not messages or messages[-1].role != "assistant":
        return []
    done = finished or {}
    calls = messages[-1].tool_calls
    results = [done.get(c.id) or ToolResult(c.id, c.name, why, is_error=True) for c in calls]
    if results:
        messages.append(Message("tool", tuple(results)))
    return [r for r in results if r.call_id not in done]
