"""The one event schema: what a run tells the world, on the wire (`--json`), in logs and traces.

Every event is a flat JSON object with `type`, `run_id`, `seq` (0, 1, 2 ... within a run) and
`ts` (Unix time in seconds) plus the fields of its type. `SCHEMA` below lists every type and
field; the docs' event reference is generated from it, and a test checks that every type the
code emits is in it, so the two cannot drift.

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
        return orjson.dumps(self.to_dict())


Sink = Callable[[Event], None]


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

USAGE = (
    "{input_tokens (all prompt tokens, cached included), cached_input_tokens, output_tokens,"
    " reasoning_tokens}, with estimated: true where the server sent no counts"
)
IMAGES = "[{media_type, sha256, bytes}] when there are images: named, never inlined"

SCHEMA: dict[str, EventType] = {
    "run_started": EventType(
        "a run begins",
        {
            "task": "the task as given (null: a fork that goes on with no new message)",
            "provider": "the model's protocol",
            "model": "the model's name",
            "agent": "the agent's name",
            "version": "the agent's version (given, or its definition's fingerprint)",
            "images": IMAGES,
            "forked_from": "a fork's: the run it was forked from",
            "at": "a fork's: the step of that run it starts after",
            "account": "the account the run belongs to, if it has one (tether limits)",
        },
    ),
    "run_resumed": EventType("a durable run goes on in this process after a crash or a stop", {}),
    "model_request": EventType(
        "a model call starts", {"messages": "how many messages the request holds"}
    ),
    "text_delta": EventType("a piece of the model's text, while it streams", {"text": "the piece"}),
    "model_response": EventType(
        "the model answered",
        {
            "text": "its text",
            "tool_calls": "[{id, name, arguments}] the tools it asks for",
            "stop_reason": "end_turn, tool_use, max_tokens ...",
            "usage": USAGE,
            "model": "the model that answered (with fallback models, the one that served)",
        },
    ),
    "tool_call": EventType(
        "a tool call starts",
        {
            "id": "the call's id, unique within the run",
            "name": "the tool",
            "arguments": "its arguments, an object",
            "raw_arguments": "the model's text when it was not a JSON object",
            "child_run_id": "the child run an agent tool starts",
        },
    ),
    "tool_result": EventType(
        "a tool call ended",
        {
            "id": "the call's id",
            "name": "the tool",
            "output": "what goes back to the model",
            "is_error": "true when the call failed (bad arguments, exception, timeout, denial ...)",
            "images": IMAGES,
            "usage": "the run's model, asked by the call (MCP sampling): counted in the run's "
            "usage; absent when it was not",
        },
    ),
    "retry": EventType(
        "a model call failed and is tried again",
        {
            "attempt": "1, 2 ...",
            "delay": "seconds before the next try",
            "error": "{kind, status, message, retryable}",
        },
    ),
    "fallback": EventType(
        "a model could not serve now and the next one answers",
        {
            "failed": "the model that failed",
            "to": "the model that answers next",
            "error": "{kind, status, message, retryable}: why the first could not serve",
        },
    ),
    "guardrail": EventType(
        "a guardrail's verdict",
        {
            "name": "the guardrail",
            "kind": "input, tool or output",
            "passed": "true or false",
            "message": "why it tripped",
            "id": "a tool guardrail's call id",
        },
    ),
    "user_message": EventType(
        "a message reached a live run (delivered before its next model call)",
        {"text": "the message", "by": "check when it is the check-your-work turn"},
    ),
    "approval_requested": EventType(
        "a tool call waits for a human",
        {
            "approval_id": "what approve and deny name",
            "id": "the call's id",
            "name": "the tool",
            "arguments": "its exact arguments",
            "args_hash": "SHA-256 of those arguments",
            "expires_at": "when the request expires (Unix time), or null",
        },
    ),
    "approval_decided": EventType(
        "a waiting call was approved or denied",
        {
            "approval_id": "the request",
            "id": "the call's id",
            "approved": "true or false",
            "reason": "why (a denial's reason reaches the model)",
        },
    ),
    "tool_progress": EventType(
        "a running tool call reports how far it has come (an MCP server's progress)",
        {
            "id": "the call's id",
            "progress": "how much is done",
            "total": "how much there is, or null",
            "message": "what it says it is doing, or null",
        },
    ),
    "question_asked": EventType(
        "a tool call asks the person behind the run for values (MCP elicitation)",
        {
            "question_id": "what answer names",
            "asker": "who asks (the MCP server)",
            "message": "the question",
            "schema": "a JSON Schema of the values wanted",
            "url": "a page the person is asked to visit instead, or empty",
            "id": "the call's id",
        },
    ),
    "sampled": EventType(
        "an MCP server had the run's model answer a request in the middle of a call (sampling)",
        {
            "id": "the call's id",
            "asker": "the MCP server",
            "messages": "how many messages it sent",
            "text": "the model's answer",
            "usage": "the tokens it used (the run's, added when the call ends)",
        },
    ),
    "question_answered": EventType(
        "the question was answered, declined or cancelled",
        {
            "question_id": "the question",
            "action": "accept, decline or cancel",
            "reason": "who or what answered",
        },
    ),
    "upgraded": EventType(
        "a run goes on under another version of its agent than it began with (tether upgrade)",
        {"from": "the version it began with", "to": "the version it goes on under"},
    ),
    "queued": EventType(
        "work waits for a free slot (admission), a new run for room in its account's budget, "
        "or a model call's attempt for its endpoint's rate limit or a server's pause",
        {
            "what": "run, model_call, account (a limit with when_over queue) or rate",
            "position": "its place in the queue (run, model_call)",
            "account": "the account (account)",
            "endpoint": "the provider, URL and a hash of the key (rate)",
            "reason": "the limit reached, as a halt would say it (account); the rate, or "
            "until when the server asked for no requests (rate)",
        },
    ),
    "admitted": EventType(
        "queued work got its slot, its account room or its endpoint's rate room",
        {"what": "run, model_call, account or rate", "endpoint": "(rate)"},
    ),
    "context_trimmed": EventType(
        "old tool outputs were cut to head and tail to fit the context window",
        {
            "outputs": "how many",
            "characters_saved": "characters cut",
            "estimated_tokens": "the request's estimate after",
        },
    ),
    "context_summarized": EventType(
        "older turns were summarised by the model to fit the context window",
        {
            "messages_replaced": "how many messages the summary replaced",
            "summary": "its text",
            "estimated_tokens": "the request's estimate after",
            "usage": USAGE,
        },
    ),
    "idle": EventType("a permanent run waits for its next message", {}),
    "run_crashed": EventType(
        "the run's own code raised (a bug, not a model or tool error)",
        {"error": "the exception's type and message"},
    ),
    "restarting": EventType(
        "a restart policy starts the run again",
        {"attempt": "1, 2 ...", "reason": "why the last attempt ended"},
    ),
    "gave_up": EventType(
        "restarts passed the policy's intensity limit",
        {
            "restarts": "how many were made",
            "within": "the policy's window in seconds",
            "reason": "why the last attempt ended",
        },
    ),
    "run_finished": EventType(
        "the run ended; always the last event",
        {
            "outcome": "done, halted, cancelled or failed",
            "answer": "the final answer",
            "reason": "why it ended (a budget, a guardrail, an error ...)",
            "usage": USAGE,
            "cost_usd": "what its model calls cost, where prices are known",
            "steps": "model calls made",
            "output": "the typed answer as JSON, with an output type",
            "error": "for failed: {kind, status, message, retryable}",
        },
    ),
}


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
