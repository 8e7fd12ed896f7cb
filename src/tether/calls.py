"""A model call as a run makes it: in a slot of its endpoint's limiter (a wait for one is an
event), its fallbacks said, and the usage a server left out estimated. The same for a run in
memory and a durable run's model step."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from .admission import Limiter
from .errors import ProviderError
from .events import Emitter, model_response_data
from .loop import unique_calls, with_usage
from .messages import ModelRequest, ModelResponse
from .providers.base import Model, TextHook
from .providers.fallback import FallbackModel
from .providers.http import RetryHook


async def respond(
    model: Model,
    request: ModelRequest,
    emitter: Emitter,
    limiter: Limiter | None,
    on_text: TextHook | None,
    on_retry: RetryHook,
    said: bool = False,
) -> ModelResponse:
    """A model call in a slot of the endpoint's limiter (a wait for one shows as `queued`,
    then `admitted`); what the server left out of its usage is estimated; with `said`, the
    reply is `answered`. (No context manager, closure or coroutine more than the call needs:
    a run in flight holds each, and thousands of runs make them thousands of objects for the
    garbage collector.)"""
    if limiter is None:
        response = await call(model, request, emitter, on_text, on_retry)
    else:
        if not limiter.take():  # in the queue: its place said, then its admission
            turn = limiter.queue()
            emitter.queued(what="model_call", position=limiter.queued)
            try:
                await turn
            except asyncio.CancelledError:
                limiter.leave(turn)  # its place, or the slot if it came
                raise
            emitter.admitted(what="model_call")
        try:
            response = await call(model, request, emitter, on_text, on_retry)
        finally:
            limiter.release()
    response = with_usage(request, response)
    return answered(request, response, emitter) if said else response


def answered(request: ModelRequest, response: ModelResponse, emitter: Emitter) -> ModelResponse:
    """The reply as the run takes it, said as `model_response`: its tool calls' ids made
    unique in the conversation (a durable run records it so: a replay agrees)."""
    response = unique_calls(response, request.messages)
    if emitter.active:
        emitter.model_response(**model_response_data(response))
    return response


def call(
    model: Model,
    request: ModelRequest,
    emitter: Emitter,
    on_text: TextHook | None,
    on_retry: RetryHook,
) -> Awaitable[ModelResponse]:
    """`model.respond`; a `FallbackModel` also says each fallback, as a `fallback` event."""
    if not isinstance(model, FallbackModel):
        return model.respond(request, on_text, on_retry)

    def on_fallback(failed: Model, after: Model, e: ProviderError) -> None:
        emitter.fallback(failed=failed.name, to=after.name, error=e.to_dict())

    return model.respond(request, on_text, on_retry, on_fallback)
