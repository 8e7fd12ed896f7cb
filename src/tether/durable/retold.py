"""A run's events told again from its store, for a reader in another process (`tether runs`,
the page, `mcp-serve` on a store): what it started with, its recorded steps (model answers,
tool calls and results, the approvals asked and decided), the upgrades noted in the ledger, and
its end. Each event is said by its `Emitter` method, as the run said it live, at the time its
step recorded."""

from __future__ import annotations

from typing import Any

from ..approvals import ApprovalRequest, approval_id
from ..events import Emitter, Event, Sink, images_data, model_response_data, tool_result_data
from ..messages import ToolCall
from ..result import RunResult
from ..tally import Tally
from .dbos_private import all_events
from .formats import RunRecord, WorkflowInput
from .steps import ContextStep, ModelStep, ToolsStep
from .versions import wanted
from .view import decision_in, filled, status_of


def events_of(store: Any, run_id: str) -> list[Event]:
    """A durable run's persisted history as events: its completed model replies and tool
    results (step outputs), the approvals it asked a person for, and its end (the workflow's
    result, or how it was stopped).

    Read again while the run goes on, the list only grows: what a new step adds comes after
    what was there (a page follows a run executed elsewhere by reading this again). So an
    approval is shown once its reply's step is read, and its decision only with the results
    of its calls; the steps are read before the approvals, which were set after them."""
    out: list[Event] = []
    told = Retold(run_id, [out.append])

    status = status_of(store, run_id)
    given = WorkflowInput.of(status)  # read once: the task and the record
    task, record = (given.task, given.record) if given is not None else ("", RunRecord())
    steps = store.steps(status)
    approvals = all_events(store, run_id)
    first = next((s.response for s, _ in steps if isinstance(s, ModelStep)), None)
    told.at = (status.created_at or 0) / 1000
    told.run_started(
        task=task,
        provider=record.provider,
        model=first.model if first is not None else None,
        agent=record.agent,
        version=record.version,
        **images_data(record.images),
        **record.origin,
    )
    # only a run of a registered agent's version can be upgraded: no read for the others
    upgrades = store.ledger.upgrades_of(run_id) if wanted(record, None) else []

    def upgraded_before(n: int) -> None:  # it went on under another version from step n
        while upgrades and upgrades[0][0] <= n:
            _, was, to, ts = upgrades.pop(0)
            told.at = ts
            told.upgraded(**{"from": was, "to": to})

    for n, (step, at) in enumerate(steps):
        upgraded_before(n)
        if isinstance(step, ModelStep):
            told.at, calls = step.ended, step.response.message.tool_calls
            for _, text in step.arrived:
                told.user_message(text=text)
            told.model_response(**model_response_data(step.response))
            for c in calls:
                told.tool_call(id=c.id, name=c.name, arguments=c.arguments or {})
            for _, text in step.late:
                told.user_message(text=text)
            for c in calls:
                asked = approvals.get(approval_id(c.id))
                if isinstance(asked, dict) and "args_hash" in asked:
                    told.approval_requested(**requested(c.id, asked))
        elif isinstance(step, ContextStep):
            told.at = at
            for type_, data in step.happened:  # recorded as they were emitted
                told.send(type_, dict(data))
        elif isinstance(step, ToolsStep):
            results, told.at = step.results, step.ended
            for result in results:
                decision = decision_in(approvals.get(approval_id(result.call_id)))
                if decision is not None:
                    told.approval_decided(
                        **decision.event(approval_id(result.call_id), result.call_id)
                    )
            for result in results:
                told.tool_result(**tool_result_data(result))
    upgraded_before(len(steps))
    end = ending(status, out)
    if end is not None:
        told.at = (status.updated_at or 0) / 1000
        told.run_finished(**end)
    return out


class Retold(Emitter):
    """A run's events told again from its store: each at the time its step recorded (`at`)."""

    __slots__ = ("at",)

    def __init__(self, run_id: str, sinks: list[Sink]) -> None:
        super().__init__(run_id, sinks)
        self.at = 0.0

    def now(self) -> float:
        return self.at


def requested(call_id: str, asked: dict[str, Any]) -> dict[str, Any]:
    """An `approval_requested` event's data from what the run recorded when it asked."""
    call = ToolCall(call_id, str(asked.get("name", "")), asked.get("arguments") or {})
    return ApprovalRequest(approval_id(call_id), call, str(asked.get("args_hash"))).to_dict()


def ending(status: Any, events: list[Event]) -> dict[str, Any] | None:
    """The `run_finished` data of a run that ended: what it reported, or, for one stopped in
    the store (cancelled, or failed inside DBOS), what its recorded steps add up to."""
    if status.status == "SUCCESS" and isinstance(status.output, dict):
        return {k: v for k, v in status.output.items() if k != "messages"}
    if status.status not in ("ERROR", "CANCELLED"):
        return None
    tally = Tally()
    for event in events:
        tally(event)
    cancelled = status.status == "CANCELLED"
    reason = "cancelled" if cancelled else str(status.error or "failed")
    stopped = {"outcome": "cancelled" if cancelled else "failed", "reason": reason}
    return filled(RunResult.from_dict(status.workflow_id, stopped), tally).summary()
