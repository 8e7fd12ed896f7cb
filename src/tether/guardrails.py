"""Guardrails: checks on a run's input, its tool calls and its answer that can stop the run.

    def no_passwords(text: str) -> str | None:
        return "asks for a password" if "password" in text.lower() else None

    agent = Agent(model, tools, input_guardrails=[no_passwords], output_guardrails=[is_polite],
                  tool_guardrails=[no_rm_rf])

A guardrail is a function (sync or async), or an agent (`agent_check`), of the task (input), of
each tool call the model asks for before it runs (tool: a `ToolCall`), or of the final answer,
the typed output when the agent has an `output_type` (output). It passes by returning None or
True; any other value trips it (False, or a message saying why), and so does an exception (a
check that cannot run does not let the run through). A tripped guardrail ends the run `halted`
with the reason `guardrail NAME: message` (the calls of a reply that tripped one run none);
every verdict is a `guardrail` event.

Input guardrails run while the first model call is under way, so they add no latency, but no
tool call runs and no answer is given before every one has passed: peers let tools run after
a guardrail had tripped (openai-agents-python#991, #624). On a store the verdicts are recorded
steps (asked once, before the first model call), so a resume does not ask again.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import orjson
import pydantic_core

from .messages import ToolCall

Kind = Literal["input", "output", "tool"]


@dataclass(frozen=True, slots=True)
class Guardrail:
    """A named check of a run's task, a tool call or its answer (see the module docstring):
    `check` returns None or True to pass, False or a message to trip. A plain function is
    wrapped in one by its name; give a `Guardrail` to name a lambda."""

    check: Callable[[Any], Any]
    name: str = ""

    @classmethod
    def of(cls, given: Any) -> Guardrail:
        """A guardrail from itself, a plain function (named after it) or an agent (by its
        name, see `agent_check`)."""
        if isinstance(given, Guardrail):
            return given
        if callable(getattr(given, "run", None)) and hasattr(given, "model"):
            return cls(agent_check(given), str(getattr(given, "name", "agent")))
        if not callable(given):
            raise TypeError(f"a guardrail is a function, an agent or a Guardrail, not {given!r}")
        return cls(given, getattr(given, "__name__", "guardrail"))


def agent_check(agent: Any) -> Callable[[Any], Awaitable[str | None]]:
    """An agent as a check: it runs on the value as text and passes it when its typed output
    has `passed` true (else its `reason` or `message` says why), or when its answer begins
    with PASS (else the answer says why). A run that does not end `done` trips it."""

    async def check(value: Any) -> str | None:
        result = await agent.run(as_text(value))
        if result.outcome != "done":
            return f"the {agent.name} agent ended {result.outcome}: {result.reason}"
        return judged(result.output if result.output is not None else result.answer)

    return check


def judged(said: Any) -> str | None:
    """A checking agent's verdict from its output (see `agent_check`): None when it passes."""
    if isinstance(said, str):
        text = said.strip()
        return None if text.upper().startswith("PASS") else text[:500] or "tripped"
    found = said if isinstance(said, dict) else getattr(said, "__dict__", {})
    if "passed" not in found:
        return f"the checking agent's output has no 'passed': {said!r}"[:500]
    if found["passed"]:
        return None
    return str(found.get("reason") or found.get("message") or "tripped")


def as_text(value: Any) -> str:
    """What a checking agent reads: a task or answer as it is, a tool call as `name(args)`,
    anything else as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, ToolCall):
        return f"{value.name}({orjson.dumps(value.arguments).decode()})"
    return pydantic_core.to_json(value, fallback=str).decode()


@dataclass(frozen=True, slots=True)
class Verdict:
    name: str
    kind: Kind
    passed: bool
    message: str = ""

    @property
    def reason(self) -> str:
        return f"guardrail {self.name}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "passed": self.passed,
            "message": self.message,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Verdict:
        return cls(d["name"], d["kind"], bool(d["passed"]), d.get("message", ""))


async def verdict(guard: Guardrail, kind: Kind, value: Any) -> Verdict:
    """One guardrail's verdict on `value`; a sync check runs in a thread (it may be slow)."""
    try:
        if inspect.iscoroutinefunction(guard.check):
            out = await guard.check(value)
        else:
            out = await asyncio.to_thread(guard.check, value)
            if inspect.isawaitable(out):
                out = await out
    except Exception as e:  # a check that cannot run lets nothing through
        return Verdict(guard.name, kind, False, f"the check failed: {type(e).__name__}: {e}")
    if out is None or out is True:
        return Verdict(guard.name, kind, True)
    return Verdict(guard.name, kind, False, "tripped" if out is False else str(out))


async def verdicts(guards: Iterable[Guardrail], kind: Kind, value: Any) -> list[Verdict]:
    """Every guardrail's verdict, the checks run at the same time, in the order given."""
    return list(await asyncio.gather(*(verdict(g, kind, value) for g in guards)))


def tripped(found: list[Verdict]) -> Verdict | None:
    """The first guardrail that did not pass, if any."""
    return next((v for v in found if not v.passed), None)
