"""Tools described once: schema, validation, context, and every failure as an error result."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Annotated

import pydantic
import pytest

from tether import RunContext, Toolbox, ToolCall, tool
from tether.deadlines import Limit
from tether.events import Emitter, Event


@tool
def add(a: int, b: int = 0) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number,
            which defaults to zero.
    """
    return a + b


@tool(timeout=0.3)
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return "woke"


@tool
async def pause(seconds: float) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return "paused"


@tool
def boom() -> str:
    """Always fails."""
    raise RuntimeError("the disk is on fire")


@tool
def whoami(ctx: RunContext, greeting: str = "hi") -> str:
    """Say who the run belongs to."""
    return f"{greeting} {ctx.account_id} in {ctx.workspace}"


@tool
def blocking(seconds: float) -> str:
    """A sync tool that blocks its thread."""
    time.sleep(seconds)
    return "done blocking"


def call(name: str, args: dict | None, raw: str = "") -> ToolCall:
    return ToolCall(f"id_{name}", name, args, raw)


def box() -> Toolbox:
    return Toolbox([add, slow, pause, boom, whoami, blocking])


def test_schema_from_signature_and_docstring() -> None:
    assert add.name == "add"
    assert add.description == "Add two integers."
    assert add.parameters == {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "description": "The first number."},
            "b": {
                "type": "integer",
                "default": 0,
                "description": "The second number, which defaults to zero.",
            },
        },
        "required": ["a"],
        "additionalProperties": False,
    }


def test_context_parameter_is_not_in_the_schema() -> None:
    assert set(whoami.parameters["properties"]) == {"greeting"}


def test_decorated_function_still_callable() -> None:
    assert add(2, b=3) == 5


async def test_valid_call_runs() -> None:
    r = await box().run(call("add", {"a": 2, "b": 40}), RunContext())
    assert (r.output, r.is_error) == ("42", False)


async def test_schema_violation_tells_the_model_what_to_fix() -> None:
    r = await box().run(call("add", {"a": "two", "c": 1}), RunContext())
    assert r.is_error
    assert "a: Input should be a valid integer" in r.output
    assert "c: unknown argument" in r.output
    assert "Fix the arguments" in r.output


async def test_a_huge_bad_argument_is_not_echoed_whole() -> None:
    """The error names the argument and shows its head and tail: a 2 MB one came back whole,
    into the model's context and the transcript."""
    r = await box().run(call("add", {"a": "x" * 2_000_000}), RunContext())
    assert r.is_error and "a: Input should be a valid integer" in r.output
    assert len(r.output) < 1_000 and "characters cut" in r.output


async def test_missing_argument() -> None:
    r = await box().run(call("add", {}), RunContext())
    assert r.is_error and "a: Field required" in r.output


async def test_malformed_json_arguments() -> None:
    r = await box().run(call("add", None, '{"a": 1,'), RunContext())
    assert r.is_error and "not a JSON object" in r.output and '{"a": 1,' in r.output


async def test_unknown_tool_lists_the_known_ones() -> None:
    r = await box().run(call("multiply", {}), RunContext())
    assert r.is_error and "Unknown tool 'multiply'" in r.output and "add" in r.output


async def test_exception_becomes_error_result() -> None:
    r = await box().run(call("boom", {}), RunContext())
    assert r.is_error and "RuntimeError: the disk is on fire" in r.output


async def test_timeout_becomes_error_result() -> None:
    t0 = time.monotonic()
    r = await box().run(call("slow", {"seconds": 5}), RunContext())
    assert r.is_error and "timed out after 0.3 s" in r.output
    assert time.monotonic() - t0 < 1


async def test_each_call_of_a_reply_has_its_own_time_limit() -> None:
    """Calls of one reply share one timer: the slow tool's call is stopped at its 0.3 s, the
    others keep going to their answers."""
    calls = [call("slow", {"seconds": 5}), call("pause", {"seconds": 0.6}), call("add", {"a": 2})]
    t0 = time.monotonic()
    slow_r, pause_r, add_r = await box().run_all(calls, RunContext(), Emitter("r"))
    assert slow_r.is_error and "timed out after 0.3 s" in slow_r.output
    assert pause_r.output == "paused" and add_r.output == "2"
    assert 0.55 < time.monotonic() - t0 < 2


async def test_a_cancel_from_outside_is_not_taken_for_a_timeout() -> None:
    """A run cancelled while its call is in flight is cancelled, even when the cancel comes in
    the same instant as the call's time limit: the limit takes back only its own."""
    toolbox = box()

    @tool(timeout=0.2)
    async def cut(seconds: float) -> str:
        """Sleep; the run is cancelled when the limit fires."""
        task = asyncio.current_task()
        assert task is not None and toolbox.limits is not None
        deadline = max(limit.when() or 0.0 for limit in toolbox.limits.live.values())
        asyncio.get_running_loop().call_at(deadline, task.cancel)  # after the limit's timer
        await asyncio.sleep(seconds)
        return "woke"

    toolbox.add(cut)
    with pytest.raises(asyncio.CancelledError):
        await toolbox.run(call("cut", {"seconds": 5}), RunContext())
    outer = asyncio.ensure_future(toolbox.run(call("pause", {"seconds": 5}), RunContext()))
    await asyncio.sleep(0.05)
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer


async def test_a_call_that_outlives_its_cancel_leaves_its_task_clean() -> None:
    """A tool that catches the cancel of its time limit and answers anyway gives its answer,
    and the limit's cancel does not reach the next thing the run awaits."""

    @tool(timeout=0.1)
    async def stubborn() -> str:
        """Ignore one cancel."""
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            return "kept going"
        return "woke"

    toolbox = box()
    toolbox.add(stubborn)
    r = await toolbox.run(call("stubborn", {}), RunContext())
    assert r.output == "kept going" and not r.is_error
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0.01)  # no CancelledError left pending


async def test_ended_calls_do_not_pile_up_and_later_limits_still_fire() -> None:
    toolbox = box()
    for _ in range(20):
        await toolbox.run_all([call("add", {"a": 1})] * 50, RunContext(), Emitter("r"))
    assert toolbox.limits is not None and len(toolbox.limits.heap) <= 130
    r = await toolbox.run(call("slow", {"seconds": 5}), RunContext())
    assert r.is_error and "timed out after 0.3 s" in r.output


def test_a_toolbox_keeps_its_limits_on_a_second_event_loop() -> None:
    """An agent's toolbox outlives `asyncio.run`: a second loop's calls are limited too."""
    toolbox = box()
    for _ in range(2):
        r = asyncio.run(toolbox.run(call("slow", {"seconds": 5}), RunContext()))
        assert r.is_error and "timed out after 0.3 s" in r.output


async def test_context_reaches_tools_and_cannot_be_set_by_the_model(tmp_path: Path) -> None:
    ctx = RunContext(run_id="r1", workspace=tmp_path, account_id="acct-7")
    ok = await box().run(call("whoami", {"greeting": "hello"}), ctx)
    assert ok.output == f"hello acct-7 in {tmp_path}"
    forged = await box().run(call("whoami", {"ctx": {"account_id": "admin"}}), ctx)
    assert forged.is_error and "ctx: unknown argument" in forged.output


async def test_calls_run_concurrently_and_results_keep_call_order() -> None:
    events: list[Event] = []
    calls = [
        ToolCall("c1", "pause", {"seconds": 0.4}),
        ToolCall("c2", "add", {"a": 1}),
        ToolCall("c3", "pause", {"seconds": 0.2}),
        ToolCall("c4", "nope", {}),
    ]
    t0 = time.monotonic()
    results = await box().run_all(calls, RunContext(), Emitter("r", [events.append]))
    elapsed = time.monotonic() - t0
    assert [r.call_id for r in results] == ["c1", "c2", "c3", "c4"]
    assert elapsed < 0.55  # 0.4 + 0.2 in sequence would be 0.6
    kinds = [(e.type, e.data["id"]) for e in events]
    assert kinds[:4] == [
        ("tool_call", "c1"),
        ("tool_call", "c2"),
        ("tool_call", "c3"),
        ("tool_call", "c4"),
    ]
    # results are emitted as they finish: the slowest last
    assert kinds[-1] == ("tool_result", "c1")


async def test_blocking_sync_tool_does_not_block_the_event_loop() -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    t = asyncio.create_task(ticker())
    calls = [
        ToolCall("b1", "blocking", {"seconds": 0.3}),
        ToolCall("b2", "blocking", {"seconds": 0.3}),
    ]
    t0 = time.monotonic()
    results = await box().run_all(calls, RunContext(), Emitter("r"))
    elapsed = time.monotonic() - t0
    t.cancel()
    assert [r.output for r in results] == ["done blocking", "done blocking"]
    assert elapsed < 0.55  # two blocking tools ran side by side
    assert ticks >= 10  # the loop kept turning meanwhile


def test_duplicate_names_are_refused() -> None:
    other = tool(name="add")(lambda a: a)
    with pytest.raises(ValueError, match="two tools"):
        Toolbox([add, other])


class Opaque:
    """A type no JSON Schema describes."""


def test_an_argument_type_a_model_cannot_be_told_is_an_error_where_the_agent_is_made() -> None:
    """A tool's schema is built when it joins an agent (the built-ins, unused, cost nothing
    at start): a type pydantic cannot describe fails there, before any run."""
    import pydantic

    from tether import Agent
    from tether.providers.scripted import ScriptedModel

    @tool
    def takes(thing: Opaque) -> str:
        """Takes something no schema can describe."""
        return "never"

    with pytest.raises(pydantic.PydanticSchemaGenerationError):
        Agent(ScriptedModel([]), [takes])


def test_sphinx_docstring() -> None:
    @tool
    def f(x: str) -> str:
        """Echo.

        :param x: the text to echo
        """
        return x

    assert f.parameters["properties"]["x"]["description"] == "the text to echo"
    assert f.description == "Echo."


def test_a_context_copy_is_what_dataclasses_replace_made() -> None:
    """`RunContext.copy` stands in for `dataclasses.replace` on the hot path: the same
    fields, the changes applied, the original untouched, and shallow (a run's calls share
    its `kept` dict and its allowance)."""
    import dataclasses

    ctx = RunContext(run_id="r1", workspace=Path("/tmp/w"), config={"a": 1})
    ctx.kept["shell"] = object()
    copied = ctx.copy(call_id="c1")
    replaced = dataclasses.replace(ctx, call_id="c1")
    assert copied == replaced and type(copied) is RunContext
    assert ctx.call_id is None and copied.call_id == "c1"
    assert copied.kept is ctx.kept and copied.config is ctx.config


async def test_a_finished_call_lets_go_of_its_task() -> None:
    """A call that ended leaves only its deadline on the toolbox's heap until a sweep (a pair
    of a float and an int); its limit, and the call's task (its coroutine and context), go
    with the call: with thousands of calls at once, those were thousands of objects for the
    collector to walk."""
    import gc
    import weakref

    tasks: list[weakref.ref[asyncio.Task[object]]] = []
    limits: set[int] = set()

    @tool
    async def look(path: str) -> str:
        """Look."""
        task = asyncio.current_task()
        assert task is not None and box.limits is not None
        tasks.append(weakref.ref(task))
        limits.update(id(v) for v in box.limits.live.values() if v.task is task)
        await asyncio.sleep(0)  # both calls in flight at once
        return path

    box = Toolbox([look])
    calls = [ToolCall(f"c{i}", "look", {"path": str(i)}, "") for i in range(2)]
    results = await box.run_all(calls, RunContext(), Emitter("r"))
    assert [r.output for r in results] == ["0", "1"] and len(tasks) == len(limits) == 2
    assert box.limits is not None and len(box.limits.heap) == 2  # still there, unswept
    assert not box.limits.live
    await asyncio.sleep(0)  # the loop lets go of the gathered tasks' last callbacks
    gc.collect()
    assert [t() for t in tasks] == [None, None]
    assert not [o for o in gc.get_objects() if type(o) is Limit and id(o) in limits]


def test_arguments_of_exactly_their_kinds_are_taken_as_pydantic_would_give_them() -> None:
    """A tool of plain required fields takes arguments of exactly their kinds without a
    pydantic model: what it takes is what pydantic gives, and anything else (a missing or
    extra argument, another kind, a bool for an int, an int for a float) still goes through
    pydantic, to the same values or the same error."""
    from tether.tools.tool import ToolArgumentsError

    @tool
    def plain(ms: int, text: str, ratio: float, flag: bool) -> str:
        """All four plain kinds."""
        return ""

    assert plain.exact == {"ms": int, "text": str, "ratio": float, "flag": bool}
    model = plain.model()
    assert model is not None
    given: list[dict[str, object]] = [
        {"ms": 5, "text": "a b", "ratio": 0.5, "flag": True},
        {"ms": 2**70, "text": "", "ratio": float("inf"), "flag": False},
        {"ms": True, "text": "a", "ratio": 1.0, "flag": False},
        {"ms": 5, "text": "a", "ratio": 1, "flag": False},
        {"ms": "5", "text": "a", "ratio": "1.5", "flag": "true"},
        {"ms": 5, "text": "a", "ratio": 1.0},
        {"ms": 5, "text": "a", "ratio": 1.0, "flag": True, "extra": 1},
        {"ms": None, "text": "a", "ratio": 1.0, "flag": True},
    ]
    for arguments in given:
        try:
            want = dict(model(**arguments).__dict__)
        except pydantic.ValidationError:
            with pytest.raises(ToolArgumentsError):
                plain.validate(arguments)
            continue
        got = plain.validate(arguments)
        kinds = [type(v) for v in want.values()]
        assert got == want and [type(v) for v in got.values()] == kinds, arguments
        assert got is not arguments  # a dict of the call's own (a context may be added)


def test_a_tool_whose_fields_may_change_a_value_always_asks_pydantic() -> None:
    @tool
    def defaulted(ms: int = 5) -> str:
        """A default."""
        return ""

    @tool
    def bounded(ms: Annotated[int, pydantic.Field(ge=0)]) -> str:
        """A constraint."""
        return ""

    @tool
    def listed(items: list[int]) -> str:
        """A kind that is not plain."""
        return ""

    assert defaulted.exact is None and bounded.exact is None and listed.exact is None
    with pytest.raises(Exception, match="greater than or equal"):
        bounded.validate({"ms": -1})  # its own Field's constraint holds (it was dropped)
    assert bounded.parameters["properties"]["ms"]["minimum"] == 0  # and the model is told it
