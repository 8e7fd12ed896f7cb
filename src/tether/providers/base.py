"""The seam between the loop and a model: one method, `respond`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..messages import ModelRequest, ModelResponse
from .http import RetryHook

TextHook = Callable[[str], None]


class Model(Protocol):
    """A chat model. `name` is the model id (it keys the price table)."""

    name: str
    provider: str

    async def respond(
        self,
        request: ModelRequest,
        on_text: TextHook | None = None,
        on_retry: RetryHook | None = None,
    ) -> ModelResponse:
        """Answer `request`; call `on_text` with each text delta while streaming."""
        ...

    async def aclose(self) -> None: ...
