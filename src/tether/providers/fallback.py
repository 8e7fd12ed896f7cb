"""`FallbackModel`: when a model cannot serve now, the next one answers.

    model = FallbackModel(OpenAIChatModel("gpt-4.1"), AnthropicModel("claude-sonnet-4-5"))

Each model keeps its own retries (`HTTPSettings.max_retries`); only once they are spent does
the next model get the request. It falls back on errors that say the provider cannot serve now
(429 rate or quota, 5xx, 529 overloaded, a connection that fails, a time-out), never on an
error of the request itself (a 400-class status, which the next model would refuse as well,
or charge for), nor on a reply it cannot read. Every attempt counts against the run's one
budget; the run's `fallback` event says which model failed and why, the `model_response` event
and `ModelResponse.served_by` which model answered, and its price is that model's (the
agent's `prices`). In a durable run the reply is recorded with the model that gave it, so a
replay never switches models.

A model that fails after streaming part of its reply has shown that part already: the
`fallback` event marks where the next model's reply begins.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Self

from ..errors import (
    ConfigError,
    ProviderConnectionError,
    ProviderError,
    ProviderTimeout,
    RateLimited,
    ServerError,
)
from ..messages import ModelRequest, ModelResponse
from .base import Model, TextHook
from .http import RetryHook

FallbackHook = Callable[[Model, Model, ProviderError], None]
"""Told (the model that failed, the one that answers next, the error) at each fallback."""


def cannot_serve_now(e: ProviderError) -> bool:
    """Whether another provider may answer what this one could not, now."""
    if isinstance(e, (ProviderConnectionError, ProviderTimeout, RateLimited, ServerError)):
        return True  # 429 and 5xx are classed so by their status (`errors.status_error`)
    return (
        e.status == 408
    )  # the server gave up waiting for the request: a 4xx that is not its fault


class FallbackModel:
    """Models tried in order, each after the one before cannot serve now (see the module)."""

    def __init__(self, first: Model, *rest: Model) -> None:
        if not rest:
            raise ConfigError("a FallbackModel needs at least one model to fall back to")
        self.models: tuple[Model, ...] = (first, *rest)
        self.name = first.name  # keys the agent's price, as a model of its own would
        self.provider = first.provider

    async def respond(
        self,
        request: ModelRequest,
        on_text: TextHook | None = None,
        on_retry: RetryHook | None = None,
        on_fallback: FallbackHook | None = None,
    ) -> ModelResponse:
        for model, after in zip(self.models, (*self.models[1:], None), strict=True):
            try:
                response = await model.respond(request, on_text, on_retry)
            except ProviderError as e:
                if after is None or not cannot_serve_now(e):
                    raise
                if on_fallback is not None:
                    on_fallback(model, after, e)
                continue
            return dataclasses.replace(response, served_by=model.name)
        raise AssertionError("the last model answers or raises")

    async def aclose(self) -> None:
        for model in self.models:
            await model.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
