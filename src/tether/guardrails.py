"""Guardrails: checks on a run's input and its answer that can stop the run.

    def no_passwords(text: str) -> str | None:
        return "asks for a password" if "password" in text.lower() else None

    agent = Agent(model, tools, input_guardrails=[no_passwords], output_guardrails=[is_polite])

A guardrail is a function (sync or async) of the task (input) or of the final answer, the typed
output when the agent has an `output_type` (output). It passes by returning None or True; any
other value trips it (False, or a message saying why), and so does an exception (a check that
cannot run does not let the run through). A tripped guardrail ends the run `halted` with the
reason `guardrail NAME: message`; every verdict is a `guardrail` event.

Input guardrails run while the first model call is under way, so they add no latency, but no
tool call runs and no answer is given before every one has passed: peers let tools run after
a guardrail had tripped (openai-agents-python#991, #624). On a store the verdicts are recorded
steps (asked once, before the first model call), so a resume does not ask again.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["input", "output"]


@dataclass(frozen=True, slots=True)
class Guardrail:
    check: Callable[[Any], Any]
    name: str = ""

    @classmethod
    def of(cls, given: Any) -> Guardrail:
        """A guardrail from itself or from a plain function (named after the function)."""
        if isinstance(given, Guardrail):
            return given
        if not callable(given):
            raise TypeError(f"a guardrail is a function or a Guardrail, not {given!r}")
        return cls(given, getattr(given, "__name__", "guardrail"))


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
