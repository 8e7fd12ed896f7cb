"""The loop and its driver: outcomes, budgets that fail closed, cancel that keeps completed work."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from helpers import nap, until
from tether import (
    Agent,
    Budget,
    Message,
    ModelRequest,
    ModelResponse,
    Price,
    RateLimited,
    ScriptedModel,
    ToolCall,
    ToolResult,
    Usage,
    reply,
    tool,
)
from tether.approvals import ApprovalRequest, Decision
from tether.events import Event
from tether.loop import CallModel, Finish, LoopState, ModelReplied, RunTools, Started, step
from tether.messages import ImagePart
from tether.result import RunResult


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


@tool(name="add")
def add_floats(a: float, b: float) -> float:
    """Add."""
    return a + b


def test_an_agent_s_version_is_given_or_the_fingerprint_of_what_changes_behaviour() -> None:
    """The same definition built twice is one version (a restart of the same code); a
    changed prompt, model, tool schema, output type or tool choice is another; a given version
    wins, and a blank one is refused."""

    def version(**changes: Any) -> str:
        settings: dict[str, Any] = {"model": ScriptedModel([]), "tools": [add], "system": "Be."}
        return Agent(**{**settings, **changes}).effective_version

    base = version()
    assert base == version() and len(base) == 12
    others = [
        version(system="Be brief."),
        version(model=ScriptedModel([], name="another")),
        version(tools=[add_floats]),  # the same name, another schema
        version(tools=[]),
        version(output_type={"type": "object"}),
        version(tool_choice="required"),
    ]
    assert base not in others and len(set(others)) == len(others)
    assert version(version="7") == "7"
    assert version(budget=Budget(max_steps=3)) == base  # a limit, not the agent's behaviour
    with pytest.raises(ValueError, match="version: give a name"):
        version(version=" ")


async def test_a_run_says_which_version_of_its_agent_started_it() -> None:
    agent = Agent(ScriptedModel([reply("Done.")]), version="3")
    events: list[Event] = []
    await agent.run("hi", sinks=[events.append])
    started = [e.data for e in events if e.type == "run_started"]
    assert started[0]["agent"] == "agent" and started[0]["version"] == "3"


def test_a_result_keeps_its_fields_through_its_record() -> None:
    """What a durable run records is read back whole; a record that lacks a field (one of an
    earlier version) reads as nothing spent, never as one step."""
    result = RunResult("r1", "failed", "a", "why", Usage(10, 2, 5), 0.123456789, 3, [], {"k": 1})
    data = result.to_dict()
    assert data["cost_usd"] == 0.123457 and data["error"] == {"k": 1}
    back = RunResult.from_dict("r1", data)
    assert (back.usage, back.cost_usd, back.steps, back.error) == (
        Usage(10, 2, 5),
        0.123457,
        3,
        {"k": 1},
    )
    bare = RunResult.from_dict("r2", {"outcome": "done", "messages": [{"role": "user"}]})
    assert (bare.usage, bare.cost_usd, bare.steps, bare.messages) == (
        Usage(),
        0.0,
        0,
        [{"role": "user"}],
    )
    assert "error" not in RunResult("r3", "done", "a", "", Usage(), 0.0, 1, []).summary()


def test_a_tool_choice_of_an_agent_without_tools_says_there_are_none() -> None:
    with pytest.raises(ValueError, match=r"\(no tools\)"):
        Agent(ScriptedModel([]), tool_choice="lookup")


async def test_the_check_before_the_answer_is_said_as_a_user_message() -> None:
    model = ScriptedModel([reply("4"), reply("4, checked")])
    events: list[Event] = []
    result = await Agent(model, check="Check it.").run("2+2?", sinks=[events.append])
    assert result.answer == "4, checked"
    said = [e.data["text"] for e in events if e.type == "user_message"]
    assert said == ["Check it."]


async def test_a_halted_run_is_not_judged_by_the_output_guardrails() -> None:
    """The output guardrails judge an answer; a run halted by its budget gave none."""
    judged: list[str] = []

    def never(answer: str) -> bool:
        judged.append(answer)
        return False

    model = ScriptedModel(adds(3))
    agent = Agent(model, [add], budget=Budget(max_steps=1), output_guardrails=[never])
    result = await agent.run("add")
    assert result.outcome == "halted" and result.reason.startswith("max_steps") and not judged


async def test_an_input_guardrail_still_running_when_the_run_ends_is_stopped() -> None:
    started, stopped = asyncio.Event(), asyncio.Event()

    async def slow(task: str) -> bool:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            stopped.set()
            raise
        return True

    result = await Agent(Broken(after=started), input_guardrails=[slow]).run("hi")
    assert result.outcome == "failed"
    await asyncio.wait_for(stopped.wait(), 5)


class Broken:
    """A model with a bug: not a provider's error, an exception of any kind (raised once
    `after` is set, if given)."""

    name, provider = "broken", "test"

    def __init__(self, after: asyncio.Event | None = None) -> None:
        self.after = after

    async def respond(
        self, request: ModelRequest, on_text: Any = None, on_retry: Any = None
    ) -> Any:
        if self.after is not None:
            await self.after.wait()
        raise KeyError("oops")

    async def aclose(self) -> None:
        pass


class Retried:
    """A model that reports one retry, after 12.3456 ms, before it answers."""

    name, provider = "retried", "test"

    async def respond(
        self, request: ModelRequest, on_text: Any = None, on_retry: Any = None
    ) -> Any:
        on_retry(1, 0.0123456, RateLimited("HTTP 429", status=429, retryable=True))
        return reply("ok")

    async def aclose(self) -> None:
        pass


async def test_a_bug_ends_the_run_failed_and_not_to_be_retried() -> None:
    result = await Agent(Broken()).run("hi")
    assert result.outcome == "failed"
    assert result.error is not None and result.error["kind"] == "internal"
    assert result.error["retryable"] is False and "KeyError" in result.error["message"]


async def test_a_retry_is_said_with_its_delay_to_the_millisecond() -> None:
    events: list[Event] = []
    await Agent(Retried()).run("hi", sinks=[events.append])
    [retry] = [e for e in events if e.type == "retry"]
    assert (retry.data["attempt"], retry.data["delay"]) == (1, 0.012)


async def test_the_images_of_the_task_are_named_as_the_run_starts() -> None:
    events: list[Event] = []
    image = ImagePart("image/png", b"png")
    await Agent(ScriptedModel([reply("a cat")])).run("what?", images=[image], sinks=[events.append])
    started = events[0]
    assert started.type == "run_started" and image.sha256 in str(started.data)
    events.clear()
    await Agent(ScriptedModel([reply("hi")])).run("hello", sinks=[events.append])
    assert "sha256" not in str(events[0].data)
    # a run that goes on from a transcript, with no task, names no image of it as new
    events.clear()
    transcript = [Message.user("look", images=(image,))]
    await Agent(ScriptedModel([reply("a cat")])).run(
        None, transcript=transcript, sinks=[events.append]
    )
    assert events[0].type == "run_started" and "sha256" not in str(events[0].data)


def test_an_approver_cannot_change_the_call_it_is_asked_about_or_a_decision() -> None:
    """The request binds the call to the hash of its arguments, and a decision is final: an
    approver (user code) that changed either would approve another call than it was shown."""
    call = ToolCall("c1", "bash", {"command": "ls"}, '{"command": "ls"}')
    request = ApprovalRequest.for_call(call, ttl=None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.call = dataclasses.replace(call, arguments={"command": "rm -rf ~"})  # type: ignore[misc]
    denied = Decision(False, "no")
    with pytest.raises(dataclasses.FrozenInstanceError):
        denied.approved = True  # type: ignore[misc]


def test_an_agent_as_a_tool_is_described_by_its_name_unless_told() -> None:
    researcher = Agent(ScriptedModel([]), name="researcher")
    assert researcher.as_tool().spec.description.startswith(
        "Hand a task to the agent researcher and get its answer."
    )
    assert researcher.as_tool(description="Looks things up.").spec.description.startswith(
        "Looks things up."
    )


def test_a_fallback_that_answered_is_priced_at_its_own_price_and_a_summary_is_charged() -> None:
    prices = {"main": Price(1.0, 0.1, 2.0), "backup": Price(10.0, 1.0, 20.0)}
    agent = Agent(ScriptedModel([], name="main"), prices=prices)
    answered_by = {
        by: agent.price_of(ModelResponse(Message("assistant", ()), "end_turn", served_by=by))
        for by in ("", "main", "backup")
    }
    assert answered_by == {"": None, "main": None, "backup": prices["backup"]}
    state = LoopState([Message.user("q")])
    agent.charge(state, Usage(1_000_000, 0, 500_000))  # a summary made to fit the context
    assert state.usage == Usage(1_000_000, 0, 500_000) and state.cost_usd == pytest.approx(2.0)
    agent.charge(state, Usage())
    assert state.cost_usd == pytest.approx(2.0)


def test_a_plain_typed_function_is_a_tool_and_anything_else_says_what_a_tool_is() -> None:
    """A newcomer's first agent passes a function without `@tool`: it is made a tool as `@tool`
    would (its docstring and types the schema); a value that is no function is a TypeError that
    says what a tool is, where the agent is made."""

    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    model = ScriptedModel([reply(tool_calls=[("add", {"a": 2, "b": 3})]), reply("5")])
    agent = Agent(model, [add])
    assert [s.name for s in agent.toolbox.specs] == ["add"]
    assert agent.toolbox.specs[0].description == "Add two numbers."
    result = asyncio.run(agent.run("2 + 3?"))
    assert result.outcome == "done"
    results = [p for m in result.messages for p in m.parts if isinstance(p, ToolResult)]
    assert [r.output for r in results] == ["5"]
    with pytest.raises(TypeError, match="a tool is a function"):
        Agent(model, ["add"])  # type: ignore[list-item]
