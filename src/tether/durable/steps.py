"""A durable run's steps as typed values: what each kind of step keeps, written and read here.

A run on a store is a sequence of steps (`effects.py`), each a row of the ledger: its number,
its kind, and its output as a record (`records.py`). The output is kept as the list of its
fields in order, the bytes it has had since steps were first kept as records (the golden
record in `tests/test_ledger.py` says so); here it becomes a typed value. The executor's replay
and the store's readers (`tether show`, the page, `messages_of`) decode a step with `read` and
use its fields by name, never by position, and a kind is one of `KINDS`, never matched by a
suffix.

    MODEL    a model reply, with the inbox messages that went in before it and after it
    CONTEXT  the conversation fitted to the window, the summary's usage, what was replaced
    TOOLS    the results of one reply's tool calls
    INBOX    whether the inbox held a message the run had not seen (a permanent run's wait)
    GUARD    the verdicts of the guardrails of one kind
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..errors import RecordError
from ..messages import Message, ModelResponse, ToolResult, Usage
from .records import dumps, loads

Inbox = list[tuple[int, str]]
"""Inbox messages as (number, text)."""


@dataclass(frozen=True, slots=True)
class ModelStep:
    response: ModelResponse
    began: float
    ended: float
    arrived: Inbox
    """The messages sent since the last step, which went in before the reply."""
    late: Inbox
    """Those that came while an answer was made, which reopen it."""


@dataclass(frozen=True, slots=True)
class ContextStep:
    messages: list[Message]
    usage: Usage
    happened: list[tuple[str, dict[str, Any]]]
    """The events of the fit (`context_trimmed`, `context_summarized`), as (type, data)."""


@dataclass(frozen=True, slots=True)
class ToolsStep:
    results: list[ToolResult]
    ended: float


@dataclass(frozen=True, slots=True)
class InboxStep:
    unseen: bool


@dataclass(frozen=True, slots=True)
class GuardStep:
    verdicts: list[dict[str, Any]]


Step = ModelStep | ContextStep | ToolsStep | InboxStep | GuardStep

MODEL, CONTEXT, TOOLS, INBOX, GUARD = (
    "tether.model_step",
    "tether.context_step",
    "tether.tools_step",
    "tether.inbox_step",
    "tether.guard_step",
)
KINDS: dict[str, type[Step]] = {
    MODEL: ModelStep,
    CONTEXT: ContextStep,
    TOOLS: ToolsStep,
    INBOX: InboxStep,
    GUARD: GuardStep,
}
"""Each kind of step, by the name the ledger records it under."""
KIND_OF: dict[type, str] = {cls: kind for kind, cls in KINDS.items()}
SINGLE = (InboxStep, GuardStep)
"""Kinds kept as their one field itself, not a list of one."""


def kind_of(step: Step) -> str:
    return KIND_OF[type(step)]


def record(step: Step) -> bytes:
    """The step's output as the ledger keeps it."""
    fields = tuple(getattr(step, f.name) for f in dataclasses.fields(step))
    return dumps(fields[0] if isinstance(step, SINGLE) else fields)


def read(kind: str, output: bytes, what: str) -> Step:
    """The step a row holds (`what` names it in an error): RecordError if its kind is not one
    of `KINDS` or its fields are not that kind's."""
    return built(kind, loads(output, what), what)


def built(kind: str, value: Any, what: str) -> Step:
    """The step of `kind` from its recorded value (its fields in order)."""
    cls = KINDS.get(kind)
    if cls is None:
        raise RecordError(f"{what} is of an unknown kind {kind!r}")
    fields = (value,) if cls in SINGLE else value
    if not isinstance(fields, (tuple, list)) or len(fields) != len(dataclasses.fields(cls)):
        raise RecordError(f"{what} does not hold the fields of a {kind}")
    step: Step = cls(*fields)
    return step
