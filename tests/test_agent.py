"""The loop and its driver: outcomes, budgets that fail closed, cancel that keeps completed work."""

from __future__ import annotations

import asyncio

import pytest

from helpers import nap, until
from tether import (
    Agent,
    Budget,
    Message,
    ModelRequest,
    Price,
    RateLimited,
    ScriptedModel,
    ToolCall,
    Usage,
    reply,
    tool,
)
from tether.events import Event
from tether.loop import CallModel, Finish, LoopState, ModelReplied, RunTools, Started, step


@tool
def add(a: int, b: int) -> int:
    """Add."""
    return a + b


def adds(n: int) -> list:
    return [reply(tool_calls=[("add", {"a": i, "b": 1})]) for i in range(n)]


async def test_done_with_tools_and_events() -> None:
    model = ScriptedModel([*adds(2), reply("The sum is 2.")])
    events: list[Event] = []
    result = await Agent(model, [add]).run("add things", sinks=[events.append])
    assert (result.outcome, result.answer, result.steps) == ("done", "The sum is 2.", 3)
    assert result.exit_status == 0
    assert [e.seq for e in events] == list(range(len(events)))
    assert {e.run_id for e in events} == {result.run_id}
    types = [e.type for e in events]
    assert types[0] == "run_started" and types[-1] == "run_finished"
    assert types.count("model_response") == 3 and types.count("tool_result") == 2
    # the model saw its tool results
    last = model.requests[-1].messages
    assert [m.role for m in last] == ["user", "assistant", "tool", "assistant", "tool"]
    assert last[-1].tool_results[0].output == "2"


async def test_max_steps_halts_before_the_call_that_would_exceed_it() -> None:
    model = ScriptedModel(adds(10))
    result = await Agent(model, [add], budget=Budget(max_steps=3)).run("loop forever")
    assert result.outcome == "halted" and result.exit_status == 3
    assert "max_steps" in result.reason
    assert len(model.requests) == 3  # never a fourth call


async def test_token_budget_counts_the_next_input_before_sending() -> None:
    big = "x" * 4000  # about 1,000 tokens of tool output

    @tool
    def dump() -> str:
        """Print a lot."""
        return big

    script = [reply(tool_calls=[("dump", {})], usage=Usage(100, 0, 10))] * 5
    model = ScriptedModel(script)
    result = await Agent(model, [dump], budget=Budget(max_tokens=1000)).run("go")
    assert result.outcome == "halted" and "max_tokens" in result.reason
    # the first call used 110; the second would send ~1,100 more, so it is never made
    assert len(model.requests) == 1
    assert result.usage.total_tokens <= 1000


async def test_the_last_reply_counts_toward_the_next_calls_input() -> None:
    """The next request sends the last reply back, so a 1,000-token answer is input of the
    call after it: with 1,000 input tokens allowed, that call would exceed them and is never
    made (counting only the small tool result, it would look well within)."""
    long_answer = reply(tool_calls=[("add", {"a": 1, "b": 1})], usage=Usage(100, 0, 1000))
    model = ScriptedModel([long_answer, reply("never asked")])
    result = await Agent(model, [add], budget=Budget(max_input_tokens=1000)).run("go")
    assert result.outcome == "halted" and "max_input_tokens" in result.reason
    assert len(model.requests) == 1


async def test_cost_budget_halts_before_the_call() -> None:
    script = [reply(tool_calls=[("add", {"a": 1, "b": 1})], usage=Usage(1_000_000, 0, 0))] * 5
    model = ScriptedModel(script, name="priced")
    agent = Agent(
        model, [add], budget=Budget(max_cost_usd=2.5), prices={"priced": Price(1.0, 0.1, 4.0)}
    )
    result = await agent.run("spend")
    assert result.outcome == "halted" and "max_cost" in result.reason
    assert len(model.requests) == 2 and result.cost_usd == pytest.approx(2.0)


def test_cached_tokens_are_priced_apart() -> None:
    assert Price(2.0, 0.5, 8.0).cost(Usage(1_000_000, 400_000, 100_000)) == pytest.approx(
        0.6 * 2.0 + 0.4 * 0.5 + 0.1 * 8.0
    )


async def test_wall_clock_limit_halts_even_inside_a_tool() -> None:
    model = ScriptedModel([reply(tool_calls=[("nap", {"seconds": 10})]), reply("never")])
    result = await Agent(model, [nap], budget=Budget(max_seconds=0.3)).run("sleep")
    assert result.outcome == "halted" and "timeout" in result.reason
    tail = result.messages[-1]
    assert tail.role == "tool" and tail.tool_results[0].is_error  # transcript stays valid


async def test_provider_failure_is_a_failed_outcome_with_the_error() -> None:
    model = ScriptedModel([RateLimited("HTTP 429: slow down", status=429, retryable=True)])
    result = await Agent(model).run("hi")
    assert result.outcome == "failed" and result.exit_status == 1
    assert result.error == {
        "kind": "rate_limited",
        "status": 429,
        "error_type": None,
        "message": "HTTP 429: slow down",
        "retryable": True,
    }


async def test_cancel_keeps_completed_work_and_closes_open_calls() -> None:
    model = ScriptedModel(
        [
            reply(tool_calls=[("add", {"a": 1, "b": 1})]),
            reply("thinking", tool_calls=[("nap", {"seconds": 30}), ("add", {"a": 2, "b": 2})]),
        ]
    )
    transcript: list[Message] = []
    events: list[Event] = []
    task = asyncio.create_task(
        Agent(model, [add, nap]).run("work", transcript=transcript, sinks=[events.append])
    )

    def finished() -> int:
        return sum(e.type == "tool_result" for e in events)

    await until(lambda: finished() == 2, "the second add to finish (the nap goes on)")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    roles = [m.role for m in transcript]
    assert roles == ["user", "assistant", "tool", "assistant", "tool"]
    assert transcript[2].tool_results[0].output == "2"  # completed work kept
    napped, added = transcript[4].tool_results  # no call left without a result
    assert napped.is_error and "Cancelled" in napped.output
    assert (added.output, added.is_error) == ("4", False)  # a parallel call that finished: kept
    assert events[-1].type == "run_finished" and events[-1].data["outcome"] == "cancelled"
    calls = [e.data["id"] for e in events if e.type == "tool_call"]
    results = [e.data["id"] for e in events if e.type == "tool_result"]
    assert sorted(calls) == sorted(results)  # subscribers see every call end, once


async def test_conversation_continues_across_runs() -> None:
    model = ScriptedModel([reply("Hi, Ada."), reply("Your name is Ada.")])
    agent = Agent(model)
    transcript: list[Message] = []
    await agent.run("I am Ada", transcript=transcript)
    r = await agent.run("Who am I?", transcript=transcript)
    assert r.answer == "Your name is Ada."
    assert [m.text for m in model.requests[1].messages] == ["I am Ada", "Hi, Ada.", "Who am I?"]


def test_step_function_without_io() -> None:
    state = LoopState([Message.user("hi")])
    budget = Budget(max_steps=1)
    assert step(state, Started(), budget, None, 0.0) == CallModel()
    call = ToolCall("c1", "add", {"a": 1, "b": 2})
    action = step(state, ModelReplied(reply(tool_calls=[call])), budget, None, 0.0)
    assert action == RunTools([call])
    assert state.steps == 1
    from tether.loop import ToolsDone
    from tether.messages import ToolResult

    action = step(state, ToolsDone([ToolResult("c1", "add", "3")]), budget, None, 0.0)
    assert isinstance(action, Finish) and action.outcome == "halted"


async def test_scripted_model_streams_words() -> None:
    model = ScriptedModel([reply("one two three")])
    deltas: list[str] = []
    await model.respond(ModelRequest((Message.user("x"),)), on_text=deltas.append)
    assert deltas == ["one", " two", " three"]


def test_a_tool_choice_must_name_a_choice_or_a_tool() -> None:
    with pytest.raises(ValueError, match="tool_choice 'ad' is none of auto, required, none"):
        Agent(ScriptedModel([]), [add], tool_choice="ad")
    assert Agent(ScriptedModel([]), [add], tool_choice="add").tool_choice == "add"
