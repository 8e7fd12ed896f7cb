"""A scripted model that plays back replies: for tests, demos and trying tools without a key.

    model = ScriptedModel([
        reply(tool_calls=[("get_weather", {"city": "Oslo"})]),
        reply("It is 4 °C in Oslo."),
    ])

A script item is a `ModelResponse`, a `reply(...)`, an exception to raise, or a function (sync
or async) of the request returning one of those. `ScriptedModel.from_file` reads the same as JSON:
`[{"text": ..., "tool_calls": [{"name": ..., "arguments": {...}}], "delay": 0.1}, {"error": ...}]`.

Reply N answers a run's Nth model call, counted by the assistant turns in the conversation, in
code as from a file (`tether run --script`): runs that share the model (the page's, a worker's)
each start at the top, and a durable run resumed in a new process goes on where it was instead
of replaying its script from the first reply. `per_run=False` plays the script once across
every call made to the model instead: one script for several agents or runs that take turns.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson

from ..errors import ConfigError, ProviderProtocolError, status_error
from ..messages import (
    IMAGE_TOKENS,
    Message,
    ModelRequest,
    ModelResponse,
    Part,
    TextPart,
    ToolCall,
    Usage,
)
from .base import TextHook
from .http import RetryHook

ScriptItem = ModelResponse | BaseException | Callable[[ModelRequest], Any]

_ids = itertools.count(1)


def reply(
    text: str = "",
    tool_calls: Sequence[tuple[str, dict[str, Any]] | ToolCall] = (),
    usage: Usage | None = None,
) -> ModelResponse:
    """A model reply with text and/or tool calls."""
    parts: list[Part] = [TextPart(text)] if text else []
    for c in tool_calls:
        if isinstance(c, ToolCall):
            parts.append(c)
        else:
            name, args = c
            parts.append(ToolCall(f"call_{next(_ids)}", name, args, orjson.dumps(args).decode()))
    calls = any(isinstance(p, ToolCall) for p in parts)
    return ModelResponse(
        Message("assistant", tuple(parts)),
        "tool_use" if calls else "end_turn",
        usage or Usage(),
        "scripted",
    )


def estimate_tokens(request: ModelRequest) -> int:
    """About four characters a token: enough for budgets to behave as with a real model."""
    chars = len(request.system or "")
    for m in request.messages:
        for p in m.parts:
            chars += len(getattr(p, "text", "") or getattr(p, "output", "") or "")
            chars += len(getattr(p, "raw_arguments", "") or "")
        chars += 4 * IMAGE_TOKENS * len(m.images)
    return chars // 4 + 1


class ScriptedModel:
    """A model that plays back a script of replies: for tests, demos and trying tools without
    a key. Reply N answers a run's Nth model call (see the module docstring)."""

    provider = "scripted"

    def __init__(
        self, script: Iterable[ScriptItem], name: str = "scripted", *, per_run: bool = True
    ) -> None:
        self.name = name
        self.script = list(script)
        self.per_run = per_run
        """Pick each reply by the run's assistant turns so far (the default), not by the calls
        made to the model (False)."""
        self.requests: list[ModelRequest] = []
        self.raised: dict[int, int] = {}
        """By run: how many of each turn's scripted errors have been raised (see `position`)."""
        self.delays: dict[int, float] = {}

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptedModel:
        return cls.from_json(read_script(path), path)

    @classmethod
    def from_json(cls, items: Any, path: str | Path = "<script>") -> ScriptedModel:
        """A model from a script's JSON: a list of replies (see the module docstring)."""
        if not isinstance(items, list):
            raise ConfigError(f"script {path} must be a JSON list of replies")
        model = cls([])
        for i, item in enumerate(items):
            model.script.append(item_from_json(item, path, i))
            if isinstance(item, dict) and item.get("delay"):
                model.delays[i] = float(item["delay"])
        return model

    async def aclose(self) -> None:
        return None

    async def respond(
        self,
        request: ModelRequest,
        on_text: TextHook | None = None,
        on_retry: RetryHook | None = None,
    ) -> ModelResponse:
        index = self.position(request)
        self.requests.append(request)
        if index >= len(self.script):
            raise ProviderProtocolError(f"the script has no reply number {index + 1}")
        if index in self.delays:
            await asyncio.sleep(self.delays[index])
        item: Any = self.script[index]
        if callable(item) and not isinstance(item, ModelResponse):
            item = item(request)
            if inspect.isawaitable(item):
                item = await item
        if isinstance(item, BaseException):
            raise item
        if not isinstance(item, ModelResponse):
            raise TypeError(f"script item {index} is {type(item).__name__}, not a reply")
        if item.usage == Usage():
            out = sum(len(p.text) for p in item.message.parts if isinstance(p, TextPart)) // 4 + 1
            item = ModelResponse(
                item.message, item.stop_reason, Usage(estimate_tokens(request), 0, out), self.name
            )
        if on_text is not None:
            for word in words(item.message.text):
                on_text(word)
                await asyncio.sleep(0)
        return item  # type: ignore[no-any-return]

    def position(self, request: ModelRequest) -> int:
        """The script index that answers `request`. By run (the default), errors in the script
        belong to the reply after them: a run's turn N raises its errors, one a call, and then
        gets its reply, as a flaky server would (a failed call adds no assistant turn, so the
        turn alone would raise the same error for ever)."""
        if not self.per_run:
            return len(self.requests)
        turn = sum(1 for m in request.messages if m.role == "assistant")
        index, seen = 0, 0
        while index < len(self.script) and seen < turn:
            if not isinstance(self.script[index], BaseException):
                seen += 1
            index += 1
        errors = 0
        while index + errors < len(self.script) and isinstance(
            self.script[index + errors], BaseException
        ):
            errors += 1
        raised = self.raised.get(turn, 0)
        if raised < errors:
            self.raised[turn] = raised + 1
            return index + raised
        return index + errors


def read_script(path: str | Path) -> Any:
    try:
        return orjson.loads(Path(path).read_bytes())
    except (OSError, orjson.JSONDecodeError) as e:
        raise ConfigError(f"cannot read script {path}: {e}") from None


def words(text: str) -> list[str]:
    """Split text into stream deltas of one word each, spaces kept."""
    out: list[str] = []
    for i, w in enumerate(text.split(" ")):
        out.append(w if i == 0 else " " + w)
    return [w for w in out if w]


def item_from_json(item: Any, path: str | Path, i: int) -> ScriptItem:
    if not isinstance(item, dict):
        raise ConfigError(f"script {path}: reply {i + 1} must be an object")
    if "error" in item:
        err = item["error"] if isinstance(item["error"], dict) else {"message": str(item["error"])}
        return status_error(
            int(err.get("status", 500)),
            str(err.get("message", "scripted error")),
            err.get("type"),
            None,
        )
    calls = []
    for c in item.get("tool_calls") or ():
        if not isinstance(c, dict) or "name" not in c:
            raise ConfigError(f"script {path}: reply {i + 1} has a tool call without a name")
        args = c.get("arguments", {})
        calls.append(
            ToolCall(
                c.get("id") or f"call_{next(_ids)}", c["name"], args, orjson.dumps(args).decode()
            )
        )
    return reply(str(item.get("text", "")), calls)
