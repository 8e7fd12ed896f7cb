"""The seam between the loop and a model: one method, `respond`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import orjson

from ..messages import Message, ModelRequest, ModelResponse
from .http import RetryHook

TextHook = Callable[[str], None]


def wire_items(
    request: ModelRequest, kind: str, convert: Callable[[Message], list[dict[str, Any]]]
) -> list[Any]:
    """A request's messages as `kind`'s wire items (`convert` makes a message's). With the
    run's memo (`WireMemo`), each message is written as JSON once a run, which a body takes
    as it is; without one, all are converted now."""
    memo = request.memo
    if memo is None:
        return [item for m in request.messages for item in convert(m)]

    def written(m: Message) -> list[Any]:
        return [orjson.Fragment(orjson.dumps(item)) for item in convert(m)]

    return list(memo.of(request.messages, kind, written))


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
