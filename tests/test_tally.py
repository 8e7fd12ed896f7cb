"""A run's usage, steps and cost counted from its events (`Tally`) agree with what the loop
counts while it runs, for every reader that has only the events: the page's and `tether runs`'
summary, and a durable run's end filled in from its events."""

from __future__ import annotations

from typing import Any

import pytest

from tether.durable.view import filled
from tether.events import Emitter, Event, model_response_data, tool_result_data
from tether.loop import Budget, LoopState, ModelReplied, ToolsDone, step
from tether.messages import Message, ModelResponse, TextPart, ToolCall, ToolResult, Usage
from tether.pricing import price_for
from tether.result import RunResult
from tether.summaries import summarize
from tether.tally import Tally

RUNS_MODEL, FALLBACK = "gpt-4.1", "gpt-4o-mini"


def a_run() -> tuple[LoopState, list[Event]]:
    """A run that asks for a tool (whose MCP server has the run's model answer it: sampling),
    has its context summarised, and is answered by a fallback model: the loop's state and
    the run's events, not finished."""
    price, events = price_for(RUNS_MODEL), []
    emitter = Emitter("r", [events.append])
    emitter.run_started(task="t", model=RUNS_MODEL)
    state = LoopState(messages=[Message.user("t")])
    call = ToolCall("c1", "search", {"q": "x"})
    first = ModelResponse(
        Message("assistant", (call,)), "tool_use", Usage(1000, 200, 50), model=RUNS_MODEL
    )
    step(state, ModelReplied(first), Budget(), price, 0.0)
    emitter.model_response(**model_response_data(first))
    emitter.tool_call(id="c1", name="search", arguments={"q": "x"})
    result = ToolResult("c1", "search", "found", usage=Usage(300, 0, 40))
    step(state, ToolsDone([result]), Budget(), price, 0.0)
    emitter.tool_result(**tool_result_data(result))
    summary = Usage(800, 0, 120)  # the summary call (Agent.charge's rule)
    state.usage = state.usage + summary
    state.cost_usd += price.cost(summary) if price else 0.0
    emitter.context_summarized(messages_replaced=2, summary="s", usage=summary.to_dict())
    last = ModelResponse(
        Message("assistant", (TextPart("done"),)), "end_turn", Usage(500, 0, 10),
        model="gpt-4o-mini-2024-07-18", served_by=FALLBACK,
    )  # fmt: skip
    step(state, ModelReplied(last, price_for(FALLBACK)), Budget(), price, 0.0)
    emitter.model_response(**model_response_data(last))
    return state, events


def tallied(events: list[Event]) -> Tally:
    tally = Tally()
    for e in events:
        tally(e)
    return tally


def from_tally(events: list[Event]) -> tuple[Usage, int, float]:
    t = tallied(events)
    return t.usage, t.steps, t.cost


def from_summary(events: list[Event]) -> tuple[Usage, int, float]:
    s = summarize(events)
    u = tallied(events).usage
    assert s["tokens"] == u.input_tokens + u.output_tokens
    return u, s["steps"], s["cost_usd"]


def from_durable_end(events: list[Event]) -> tuple[Usage, int, float]:
    cut = filled(RunResult.from_dict("r", {"outcome": "cancelled"}), tallied(events))
    return cut.usage, cut.steps, cut.cost_usd


@pytest.mark.parametrize("read", [from_tally, from_summary, from_durable_end])
def test_every_reader_of_the_events_counts_as_the_loop(read: Any) -> None:
    state, events = a_run()
    usage, steps, cost = read(events)
    assert (usage, steps) == (state.usage, state.steps) == (usage, 2)
    assert cost == pytest.approx(state.cost_usd) and cost > 0


def test_the_summary_shows_the_cost_while_the_run_goes_on() -> None:
    """The page's list read the cost from `run_finished` only: $0 for a running run."""
    state, events = a_run()
    assert state.cost_usd > 0
    assert summarize(events)["cost_usd"] == pytest.approx(state.cost_usd)


def test_a_finished_runs_own_figures_stand() -> None:
    """At its end a run says what it used and cost (priced with its own price table, which
    the events do not carry): the summary shows that."""
    state, events = a_run()
    ended = RunResult.from_dict("r", {"outcome": "done", "answer": "done"})
    ended.usage, ended.steps, ended.cost_usd = state.usage, state.steps, 1.25
    Emitter("r", [events.append]).run_finished(**ended.summary())
    s = summarize(events)
    assert (s["cost_usd"], s["steps"], s["status"]) == (1.25, 2, "done")
