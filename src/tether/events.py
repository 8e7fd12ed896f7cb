"""The one event schema: what a run tells the world, on the wire (`--json`), in logs and traces.

Every event is a flat JSON object with `type`, `run_id`, `seq` (0, 1, 2 ... within a run) and
`ts` (Unix time in seconds) plus the fields of its type:

    run_started     {task, provider, model}
    model_request   {messages}                               a model call starts
    text_delta      {text}                                   while streaming
    model_response  {text, tool_calls [{id, name, arguments}], stop_reason, usage}
    tool_call       {id, name, arguments}
    tool_result     {id, name, output, is_error}
    retry           {attempt, delay, error}                  a model call is being retried
    guardrail       {name, kind, passed, message}            a guardrail's verdict
    run_finished    {outcome, answer, reason, usage, cost_usd, steps, error?}

A child run (an agent used as a tool, see `tree`) adds `parent_run_id` and `root_run_id` to
every one of its events, and the `tool_call` that starts it carries its `child_run_id`.

`usage` is {input_tokens, cached_input_tokens, output_tokens, reasoning_tokens}; `outcome` is one
of done, halted, cancelled, failed. Types may gain fields; none is ever renamed or removed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from .messages import ImagePart, ModelResponse, ToolCall, ToolResult, Usage


@dataclass(frozen=True, slots=True)
class Event:
    type: str
    run_id: str
    seq: int
    data: dict[str, Any]
    ts: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "run_id": self.run_id,
            "seq": self.seq,
            "ts": self.ts,
            **self.data,
        }

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict())


Sink = Callable[[Event], None]


class Emitter:
    """Numbers a run's events and hands them to its sinks, in order, synchronously."""

    __slots__ = ("lineage", "run_id", "seq", "sinks")

    def __init__(self, run_id: str, sinks: list[Sink] | None = None) -> None:
        self.run_id = run_id
        self.seq = 0
        self.sinks: list[Sink] = sinks or []
        self.lineage: dict[str, str] | None = None
        """A child run's `parent_run_id` and `root_run_id`, added to each of its events."""

    @property
    def active(self) -> bool:
        return bool(self.sinks)

    def emit(self, type: str, **data: Any) -> None:
        if not self.sinks:
            self.seq += 1
            return
        if self.lineage is not None:
            data.update(self.lineage)
        event = Event(type, self.run_id, self.seq, data, time.time())
        self.seq += 1
        for sink in self.sinks:
            sink(event)


def call_dict(call: ToolCall) -> dict[str, Any]:
    out: dict[str, Any] = {"id": call.id, "name": call.name, "arguments": call.arguments or {}}
    if call.arguments is None:
        out["raw_arguments"] = call.raw_arguments
    return out


def model_response_data(response: ModelResponse) -> dict[str, Any]:
    return {
        "text": response.message.text,
        "tool_calls": [call_dict(c) for c in response.message.tool_calls],
        "stop_reason": response.stop_reason,
        "usage": response.usage.to_dict(),
        "model": response.served_by or response.model,
    }


def tool_result_data(result: ToolResult) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": result.call_id,
        "name": result.name,
        "output": result.output,
        "is_error": result.is_error,
    }
    data.update(images_data(result.images))
    return data


def images_data(images: Sequence[ImagePart]) -> dict[str, Any]:
    """An event's `images` (none when there are none): each named, never inlined, since an
    event stream carries no image's bytes."""
    return {"images": [i.describe() for i in images]} if images else {}


def usage_from_dict(d: dict[str, Any]) -> Usage:
    return Usage(
        d.get("input_tokens", 0),
        d.get("cached_input_tokens", 0),
        d.get("output_tokens", 0),
        d.get("reasoning_tokens", 0),
    )
