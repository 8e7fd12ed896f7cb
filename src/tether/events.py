"""The one event schema: what a run tells the world, on the wire (`--json`), in logs and traces.

Every event is a flat JSON object with `type`, `run_id`, `seq` (0, 1, 2 ... within a run) and
`ts` (Unix time in seconds) plus the fields of its type. Each type's fields are declared once,
in `event_types` (a `TypedDict` per type); `SCHEMA` is read from there, the docs' event
reference from `SCHEMA`, and an event is emitted by the `Emitter` method of its type's name,
which takes those fields: no site names an event by a string, mypy checks what each sends, and
a test holds the methods to the declarations.

A child run (an agent used as a tool, see `tree`) adds `parent_run_id` and `root_run_id` to
every one of its events, and the `tool_call` that starts it carries its `child_run_id`.

`usage` is {input_tokens, cached_input_tokens, output_tokens, reasoning_tokens}; `outcome` is one
of done, halted, cancelled, failed. Types may gain fields; none is ever renamed or removed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Unpack, get_type_hints

import orjson

from .errors import ProviderError
from .event_types import (
    TYPES,
    AdmittedFields,
    ApprovalDecidedFields,
    ApprovalRequestedFields,
    ContextSummarizedFields,
    ContextTrimmedFields,
    FallbackFields,
    GaveUpFields,
    GuardrailFields,
    IdleFields,
    ModelRequestFields,
    ModelResponseFields,
    QuestionAnsweredFields,
    QuestionAskedFields,
    QueuedFields,
    RestartingFields,
    RetryFields,
    RunCrashedFields,
    RunFinishedFields,
    RunResumedFields,
    RunStartedFields,
    SampledFields,
    TextDeltaFields,
    ToolCallFields,
    ToolProgressFields,
    ToolResultFields,
    UpgradedFields,
    UserMessageFields,
)
from .frozen import quick_init
from .messages import ImagePart, ModelResponse, ToolCall, ToolResult, Usage


@quick_init
@dataclass(frozen=True, slots=True)
class Event:
    """One thing a run did: its `type`, the run it belongs to, its number in the run (`seq`),
    the fields of its type (`data`) and when it happened (`ts`). `to_dict()` is the flat JSON
    object of `tether run --json`; `SCHEMA` lists every type and field."""

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
        """`to_dict` as JSON; a value JSON cannot say (a hook's own object) as its `str`."""
        return orjson.dumps(self.to_dict(), default=str)

    @classmethod
    def of(cls, d: dict[str, Any]) -> Event:
        """The event a flat JSON object (`to_dict`'s) says: a journal's line."""
        data = {k: v for k, v in d.items() if k not in ENVELOPE}
        return cls(d["type"], d["run_id"], d["seq"], data, d.get("ts", 0.0))


ENVELOPE = frozenset({"type", "run_id", "seq", "ts"})
"""The fields every event has (`Event`'s own); the rest are its type's (`data`)."""


Sink = Callable[[Event], None]


class Record(Protocol):
    """A run's own log of events (`bus.EventLog`), which takes an event's parts as they are."""

    def add(self, type: str, seq: int, ts: float, data: dict[str, Any]) -> None: ...


@dataclass(frozen=True, slots=True)
class EventType:
    """One event type of the schema: what it means and what each of its fields holds."""

    summary: str
    fields: dict[str, str]


COMMON = {
    "type": "the event's type, one of the names below",
    "run_id": "the run it belongs to",
    "seq": "its number within the run: 0, 1, 2 ...",
    "ts": "when it happened, Unix time in seconds",
    "parent_run_id": "a child run's parent (an agent called as a tool); absent on a root run",
    "root_run_id": "a child run's root run; absent on a root run",
}


def event_type(fields: type) -> EventType:
    """An event type as `event_types` declares it: its docstring is what it means, each
    field's annotation what the field holds."""
    doc = " ".join((fields.__doc__ or "").split()).rstrip(".")
    hints = get_type_hints(fields, include_extras=True)
    return EventType(doc[:1].lower() + doc[1:], {f: h.__metadata__[0] for f, h in hints.items()})


SCHEMA: dict[str, EventType] = {name: event_type(fields) for name, fields in TYPES.items()}
"""Every event type, its meaning and its fields (`event_types`)."""


class Emitter:
    """Numbers a run's events and hands them to its log and its sinks, in order, synchronously.

    The run's own log takes an event's parts (`Record.add`): an `Event` is made only for sinks,
    so a run watched by no one makes none (0.5 µs and a tracked object an event, seven events
    a turn)."""

    __slots__ = ("lineage", "log", "run_id", "seq", "sinks")

    def __init__(
        self, run_id: str, sinks: Sequence[Sink] | None = None, log: Record | None = None
    ) -> None:
        self.run_id = run_id
        self.seq = 0
        self.sinks: Sequence[Sink] = sinks or ()
        """Who sees each event as an `Event` (none for most runs: then no list is made, one
        tracked object less for each run a process holds)."""
        self.log = log
        self.lineage: dict[str, str] | None = None
        """A child run's `parent_run_id` and `root_run_id`, added to each of its events."""

    def watch(self, sinks: Sequence[Sink]) -> None:
        """Have `sinks` see this run's events too, from the next one."""
        self.sinks = [*self.sinks, *sinks]

    now = staticmethod(time.time)
    """When an event happens: now (a replay of a store's record says when it did). The clock
    itself, not a method around it: a Python call an event, seven events a turn."""

    @property
    def active(self) -> bool:
        return self.log is not None or bool(self.sinks)

    def send(self, type: str, fields: Mapping[str, Any]) -> None:
        """Number the event and hand it to the log, then the sinks (the typed methods below
        call it: one per event type, named as the type, taking its fields). `fields` is kept
        as it is: each method's keywords are a dict of its own."""
        seq = self.seq
        self.seq = seq + 1
        if self.log is None and not self.sinks:
            return
        data: dict[str, Any] = fields  # type: ignore[assignment]  # (a cast costs 0.15 µs)
        if self.lineage is not None:
            data.update(self.lineage)
        ts = self.now()
        if self.log is not None:
            self.log.add(type, seq, ts, data)
        if self.sinks:
            event = Event(type, self.run_id, seq, data, ts)
            for sink in self.sinks:
                sink(event)

    def run_started(self, **data: Unpack[RunStartedFields]) -> None:
        self.send("run_started", data)

    def run_resumed(self, **data: Unpack[RunResumedFields]) -> None:
        self.send("run_resumed", data)

    def model_request(self, **data: Unpack[ModelRequestFields]) -> None:
        self.send("model_request", data)

    def text_delta(self, **data: Unpack[TextDeltaFields]) -> None:
        self.send("text_delta", data)

    def model_response(self, **data: Unpack[ModelResponseFields]) -> None:
        self.send("model_response", data)

    def tool_call(self, **data: Unpack[ToolCallFields]) -> None:
        self.send("tool_call", data)

    def tool_result(self, **data: Unpack[ToolResultFields]) -> None:
        self.send("tool_result", data)

    def retry(self, **data: Unpack[RetryFields]) -> None:
        self.send("retry", data)

    def fallback(self, **data: Unpack[FallbackFields]) -> None:
        self.send("fallback", data)

    def guardrail(self, **data: Unpack[GuardrailFields]) -> None:
        self.send("guardrail", data)

    def user_message(self, **data: Unpack[UserMessageFields]) -> None:
        self.send("user_message", data)

    def approval_requested(self, **data: Unpack[ApprovalRequestedFields]) -> None:
        self.send("approval_requested", data)

    def approval_decided(self, **data: Unpack[ApprovalDecidedFields]) -> None:
        self.send("approval_decided", data)

    def tool_progress(self, **data: Unpack[ToolProgressFields]) -> None:
        self.send("tool_progress", data)

    def question_asked(self, **data: Unpack[QuestionAskedFields]) -> None:
        self.send("question_asked", data)

    def sampled(self, **data: Unpack[SampledFields]) -> None:
        self.send("sampled", data)

    def question_answered(self, **data: Unpack[QuestionAnsweredFields]) -> None:
        self.send("question_answered", data)

    def upgraded(self, **data: Unpack[UpgradedFields]) -> None:
        self.send("upgraded", data)

    def queued(self, **data: Unpack[QueuedFields]) -> None:
        self.send("queued", data)

    def admitted(self, **data: Unpack[AdmittedFields]) -> None:
        self.send("admitted", data)

    def context_trimmed(self, **data: Unpack[ContextTrimmedFields]) -> None:
        self.send("context_trimmed", data)

    def context_summarized(self, **data: Unpack[ContextSummarizedFields]) -> None:
        self.send("context_summarized", data)

    def idle(self, **data: Unpack[IdleFields]) -> None:
        self.send("idle", data)

    def run_crashed(self, **data: Unpack[RunCrashedFields]) -> None:
        self.send("run_crashed", data)

    def restarting(self, **data: Unpack[RestartingFields]) -> None:
        self.send("restarting", data)

    def gave_up(self, **data: Unpack[GaveUpFields]) -> None:
        self.send("gave_up", data)

    def run_finished(self, **data: Unpack[RunFinishedFields]) -> None:
        self.send("run_finished", data)

    # a model call's hooks, as methods: no closure is made per call

    def streamed(self, text: str) -> None:
        """A model call's text as it streams (its `on_text`), as `text_delta`."""
        self.text_delta(text=text)

    def retried(self, attempt: int, delay: float, e: ProviderError) -> None:
        """A model call retried (its `on_retry`), as `retry`."""
        self.retry(attempt=attempt, delay=round(delay, 3), error=e.to_dict())


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
    if result.usage is not None:
        data["usage"] = result.usage.to_dict()
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
