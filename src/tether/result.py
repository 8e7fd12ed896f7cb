"""How a run ended (`RunResult`): what `Agent.run` returns, what `run_finished` reports (its
`summary`), what a store records as a run's output (`to_dict`), and the exit status of `tether`."""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass
from typing import Any

from .compact import Compact, expand, pack, unpack
from .events import Emitter, tool_result_data
from .loop import Finish, LoopState, Outcome, close_open_calls
from .messages import Message, Usage
from .output import jsonable


@dataclass
class RunResult:
    """How a run ended: `outcome` (done, halted, cancelled, failed), the `answer`, why it
    ended (`reason`), tokens (`usage`), `cost_usd`, model calls made (`steps`), the transcript
    (`messages`), a failure's `error` and, with an output type, the typed `output`."""

    run_id: str
    outcome: Outcome
    answer: str
    reason: str
    usage: Usage
    cost_usd: float
    steps: int
    messages: list[Message]
    error: dict[str, Any] | None = None
    output: Any = None
    """The typed answer of an agent with an `output_type` (on a store, where the agent is not
    known, its JSON)."""

    @property
    def exit_status(self) -> int:
        return EXIT_STATUS[self.outcome]

    def summary(self) -> dict[str, Any]:
        """The `run_finished` event's data: everything but the transcript. Built here only, so
        every path (memory, durable, a cancel, a failure) reports every documented field."""
        data: dict[str, Any] = {
            "outcome": self.outcome,
            "answer": self.answer,
            "reason": self.reason,
            "usage": self.usage.to_dict(),
            "cost_usd": round(self.cost_usd, 6),
            "steps": self.steps,
        }
        if self.error is not None:
            data["error"] = self.error
        if self.output is not None:
            data["output"] = jsonable(self.output)
        return data

    def to_dict(self) -> dict[str, Any]:
        """The summary and the transcript: what a durable run records as its result."""
        return {**self.summary(), "messages": self.messages}

    @classmethod
    def from_dict(cls, run_id: str, d: dict[str, Any]) -> RunResult:
        return cls(
            run_id,
            d["outcome"],
            d.get("answer", ""),
            d.get("reason", ""),
            Usage.from_dict(d.get("usage") or {}),
            float(d.get("cost_usd") or 0.0),
            int(d.get("steps") or 0),
            list(d.get("messages") or []),
            d.get("error"),
            d.get("output"),
        )


EXIT_STATUS: dict[str, int] = {"done": 0, "failed": 1, "halted": 3, "cancelled": 130}


def close(emitter: Emitter, state: LoopState, why: str) -> None:
    """Close the calls a run left open (see `close_open_calls`), with `tool_result` events for
    those that had none, so every `tool_call` a subscriber saw gets its result."""
    for result in close_open_calls(state.messages, why, state.finished):
        if emitter.active:
            emitter.tool_result(**tool_result_data(result))


def internal_error(e: BaseException) -> dict[str, Any]:
    return {
        "kind": "internal",
        "status": None,
        "message": f"{type(e).__name__}: {e}",
        "retryable": False,
    }


def finish_run(
    emitter: Emitter, state: LoopState, finish: Finish, error: dict[str, Any] | None = None
) -> RunResult:
    result = RunResult(
        emitter.run_id,
        finish.outcome,
        finish.answer,
        finish.reason,
        state.usage,
        state.cost_usd,
        state.steps,
        state.messages,
        error,
        state.output if finish.outcome == "done" else None,
    )
    emitter.run_finished(**result.summary())
    return result


USAGE = operator.attrgetter(*(f.name for f in dataclasses.fields(Usage)))
"""A usage's fields in the order `Usage(*fields)` takes them back."""


def compact_result(result: RunResult, own: Compact | None) -> Compact:
    """`result` compact (`compact.pack`); `own`: its transcript compacted by the caller, None
    when it is the run's transcript, kept beside it (a run's result and its transcript are
    most often one list)."""
    r = result
    head = [r.run_id, r.outcome, r.answer, r.reason, r.cost_usd, r.steps, r.error, r.output]
    return pack([*head, *USAGE(r.usage), own])


def expand_result(kept: Compact, transcript: Compact) -> RunResult:
    """The result `compact_result` was given, made again: its transcript the compact
    `transcript` unless it kept one of its own."""
    run_id, outcome, answer, reason, cost, steps, error, output, *usage, own = unpack(kept)
    messages = expand(transcript if own is None else own)
    return RunResult(
        run_id, outcome, answer, reason, Usage(*usage), cost, steps, messages, error, output
    )
