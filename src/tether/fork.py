"""A fork: a new run that starts from another run's conversation as it stood after one of its
steps, optionally with a new user message or a tool result replaced.

A run's conversation is all a new run needs to go on from where another stood: the model reads
the messages, not the process that made them. So a fork is the conversation cut after step K
(K model replies and what followed each: the tool results, the user messages that arrived
before the next call), handed to a new run as its history. Nothing of the prefix runs again,
neither model calls nor tools (the model reads their results), and the original is untouched.
A step here is a model reply, the unit `steps` counts in a run's summary and the page draws;
step 0 is the conversation before the first reply.

Pure functions over messages (`cut`, `replaced`); `Runtime.fork` finds the run, checks its
agent's version and starts the fork.
"""

from __future__ import annotations

import dataclasses

from .errors import ConfigError
from .messages import Message, ToolResult


def steps_of(messages: list[Message]) -> int:
    """How many steps (model replies) a conversation holds."""
    return sum(1 for m in messages if m.role == "assistant")


def cut(messages: list[Message], at: int, run_id: str = "the run") -> list[Message]:
    """The conversation as it stood after step `at`: everything before the model's next reply.
    A step the run does not have is refused, naming how many it has."""
    total = steps_of(messages)
    if not 0 <= at <= total:
        raise ConfigError(f"{run_id} has steps 0 to {total}; there is no step {at} to fork at")
    seen = 0
    for i, message in enumerate(messages):
        if message.role == "assistant":
            if seen == at:
                return list(messages[:i])
            seen += 1
    return list(messages)


def replaced(messages: list[Message], results: dict[str, str]) -> list[Message]:
    """The conversation with the output of each named tool call replaced (an error result
    becomes a plain one); a call id the conversation does not have is refused."""
    left = dict(results)

    def part(p: object) -> object:
        if isinstance(p, ToolResult) and p.call_id in left:
            return dataclasses.replace(p, output=left.pop(p.call_id), is_error=False)
        return p

    out = [Message(m.role, tuple(part(p) for p in m.parts)) for m in messages]  # type: ignore[misc]
    if left:
        raise ConfigError(f"no tool result with the call id {', '.join(sorted(left))} to replace")
    return out


def fork_point(
    messages: list[Message],
    at: int,
    message: str | None,
    results: dict[str, str] | None,
    run_id: str,
) -> list[Message]:
    """What a fork of `run_id` at step `at` starts from, checked: a fork that would have
    nothing to do (its conversation ends with the model's answer, and no message is given)
    is refused with the fix."""
    prefix = replaced(cut(messages, at, run_id), results or {})
    if message is None and (not prefix or prefix[-1].role == "assistant"):
        raise ConfigError(
            f"{run_id} stood with the model's answer after step {at}: give a message for "
            "the fork to answer, or fork at an earlier step"
        )
    return prefix
