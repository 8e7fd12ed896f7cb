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
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .admission import Limiter
from .approvals import Approver
from .context import ContextPolicy, fit, is_context_error
from .errors import ProviderError
from .events import Emitter, Sink, model_response_data, tool_result_data
from .loop import (
    Budget,
    CallModel,
    Finish,
    Happening,
    LoopState,
    ModelReplied,
    Outcome,
    RunTools,
    Started,
    ToolsDone,
    close_open_calls,
    last_answer,
    step,
)
from .messages import Message, ModelRequest, ModelResponse, Usage
from .pricing import Price, price_for
from .providers.base import Model, TextHook
from .providers.http import RetryHook
from .tools.tool import RunContext, Tool
from .tools.toolbox import Toolbox


@dataclass
class RunResult:
    run_id: str
    outcome: Outcome
    answer: str
    reason: str
    usage: Usage
    cost_usd: float
    steps: int
    messages: list[Message]
    error: dict[str, Any] | None = None

    @property
    def exit_status(self) -> int:
        return EXIT_STATUS[self.outcome]


EXIT_STATUS: dict[str, int] = {"done": 0, "failed": 1, "halted": 3, "cancelled": 130}


def close(emitter: Emitter, state: LoopState, why: str) -> None:
    """Close the calls a run left open (see `close_open_calls`), with `tool_result` events for
    those that had none, so every `tool_call` a subscriber saw gets its result."""
    for result in close_open_calls(state.messages, why, state.finished):
        if emitter.active:
            emitter.emit("tool_result", **tool_result_data(result))


@dataclass
class Agent:
    model: Model
    tools: Iterable[Tool] = ()
    system: str | None = None
    budget: Budget = field(default_factory=Budget)
    prices: dict[str, Price] | None = None
    max_output_tokens: int | None = None
    context: ContextPolicy | None = None
    """Keeps requests inside the model's window (trims, then summarises); None: no management."""

    def __post_init__(self) -> None:
        self.toolbox = self.tools if isinstance(self.tools, Toolbox) else Toolbox(self.tools)
        self.price = price_for(self.model.name, self.prices)

    async def run(
        self,
        task: str | None,
        *,
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
        completed work even when the run is cancelled); `task` is appended as a user message.
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
            messages.append(Message.user(task))
        state = LoopState(messages, self.system, self.toolbox.specs, started_at=time.monotonic())
        if inbox is not None:
            state.inbox = inbox
        emitter = emitter or Emitter(run_id, sinks)
        hooks = (approver, limiter)
        b = self.budget
        emitter.emit(
            "run_started",
            task=task,
            provider=self.model.provider,
            model=self.model.name,
            budget={
                "max_steps": b.max_steps,
                "max_tokens": b.max_tokens,
                "max_cost_usd": b.max_cost_usd,
                "max_seconds": b.max_seconds,
            },
        )
        error: dict[str, Any] | None = None
        try:
            if self.budget.max_seconds is None:
                finish = await self._drive(state, ctx, emitter, *hooks)
            else:
                try:
                    async with asyncio.timeout(self.budget.max_seconds):
                        finish = await self._drive(state, ctx, emitter, *hooks)
                except TimeoutError:
                    close(emitter, state, "Cancelled: the run's time limit was reached.")
                    finish = Finish(
                        "halted",
                        last_answer(messages),
                        f"timeout: the limit of {self.budget.max_seconds:g} s was reached",
                    )
        except asyncio.CancelledError:
            close(emitter, state, "Cancelled before the tool finished.")
            cancelled = Finish("cancelled", last_answer(messages), "cancelled")
            result = self._finish(emitter, state, cancelled)
            task_ = asyncio.current_task()
            if reraise_cancel or task_ is None:
                raise
            task_.uncancel()
            return result
        except ProviderError as e:
            close(emitter, state, "Not run: the model call failed.")
            error = e.to_dict()
            finish = Finish("failed", last_answer(messages), str(e))
        except Exception as e:  # a bug in Tether or a user hook: still end with an outcome
            close(emitter, state, "Not run: the run failed.")
            error = {
                "kind": "internal",
                "status": None,
                "message": f"{type(e).__name__}: {e}",
                "retryable": False,
            }
            finish = Finish("failed", last_answer(messages), f"{type(e).__name__}: {e}")
        return self._finish(emitter, state, finish, error)

    async def _drive(
        self,
        state: LoopState,
        ctx: RunContext,
        emitter: Emitter,
        approver: Approver | None,
        limiter: Limiter | None,
    ) -> Finish:
        happened: Happening = Started()
        on_text = (lambda t: emitter.emit("text_delta", text=t)) if emitter.active else None

        def on_retry(attempt: int, delay: float, e: ProviderError) -> None:
            emitter.emit("retry", attempt=attempt, delay=round(delay, 3), error=e.to_dict())

        while True:
            action = step(state, happened, self.budget, self.price, time.monotonic())
            if isinstance(action, Finish):
                return action
            if isinstance(action, CallModel):
                if self.context is not None:
                    self.charge(
                        state,
                        await fit(self.model, state.messages, state.system, self.context, emitter),
                    )
                try:
                    response = await self.call(state, emitter, limiter, on_text, on_retry)
                except ProviderError as e:
                    if self.context is None or not is_context_error(e):
                        raise
                    self.charge(
                        state,
                        await fit(
                            self.model, state.messages, state.system, self.context, emitter, True
                        ),
                    )
                    response = await self.call(state, emitter, limiter, on_text, on_retry)
                if emitter.active:
                    emitter.emit("model_response", **model_response_data(response))
                happened = ModelReplied(response)
            elif isinstance(action, RunTools):
                state.finished = {}
                results = await self.toolbox.run_all(
                    action.calls, ctx, emitter, approver, state.finished
                )
                happened = ToolsDone(results)

    async def call(
        self,
        state: LoopState,
        emitter: Emitter,
        limiter: Limiter | None,
        on_text: TextHook | None,
        on_retry: RetryHook,
    ) -> ModelResponse:
        request = ModelRequest(
            tuple(state.messages), state.tools, state.system, self.max_output_tokens
        )
        if emitter.active:
            emitter.emit("model_request", messages=len(request.messages))
        if limiter is None:
            return await self.model.respond(request, on_text, on_retry)

        def on_queued(position: int) -> None:
            emitter.emit("queued", what="model_call", position=position)

        async with limiter.slot(on_queued) as waited:
            if waited:
                emitter.emit("admitted", what="model_call")
            return await self.model.respond(request, on_text, on_retry)

    def charge(self, state: LoopState, usage: Usage) -> None:
        """Count a model call made outside the loop (a summary) in the run's usage and cost."""
        if usage != Usage():
            state.usage = state.usage + usage
            if self.price is not None:
                state.cost_usd += self.price.cost(usage)

    def _finish(
        self,
        emitter: Emitter,
        state: LoopState,
        finish: Finish,
        error: dict[str, Any] | None = None,
    ) -> RunResult:
        result = RunResult(
            emitter.run_id,
            finish.outcome,
            finish.answer,
            finish.reason,
            state.usage,
            state.cost_usd,
            state.steps,
            state.messages,
            error,
        )
        data: dict[str, Any] = {
            "outcome": result.outcome,
            "answer": result.answer,
            "reason": result.reason,
            "usage": result.usage.to_dict(),
            "cost_usd": round(result.cost_usd, 6),
            "steps": result.steps,
        }
        if error is not None:
            data["error"] = error
        emitter.emit("run_finished", **data)
        return result
