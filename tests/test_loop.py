"""The step function's helpers that decide on a reply before anything runs."""

from __future__ import annotations

import dataclasses
from functools import partial

import pytest

from tether import Budget, Message, ModelRequest, ModelResponse, Price, ToolCall, Usage
from tether.loop import (
    CallModel,
    Finish,
    LoopState,
    ModelReplied,
    RunTools,
    ToolsDone,
    ask_to_check,
    choice_for,
    close_open_calls,
    estimate_next_input,
    last_answer,
    message_chars,
    output_room,
    over_budget,
    step,
    unique_calls,
    with_usage,
)
from tether.messages import IMAGE_TOKENS, ImagePart, StopReason, TextPart, ToolResult, ToolSpec


def reply_with(*ids: str) -> ModelResponse:
    calls = tuple(ToolCall(i, "bash", {"command": f"echo {n}"}, "{}") for n, i in enumerate(ids))
    return ModelResponse(Message("assistant", calls), "tool_use")


def test_ids_repeated_across_turns_within_a_reply_or_empty_become_unique() -> None:
    earlier = [Message.user("go"), reply_with("c0", "c0_2").message]
    fixed = unique_calls(reply_with("c0", "", "x", "x"), earlier)
    ids = [c.id for c in fixed.message.tool_calls]
    assert ids == ["c0_3", "call_2", "x", "x_2"]
    # the calls are otherwise the same, in the same order
    commands = [c.arguments["command"] for c in fixed.message.tool_calls]  # type: ignore[index]
    assert commands == ["echo 0", "echo 1", "echo 2", "echo 3"]


def test_a_reply_with_unique_ids_is_returned_as_it_is() -> None:
    response = reply_with("a", "b")
    assert unique_calls(response, [reply_with("c").message]) is response


# The step function decides everything a run does: each test below names a decision a user
# relies on and pins it to the number (tests/mutate.py breaks these lines one at a time).

SYSTEM = "s" * 8
SPEC = ToolSpec("t", "ddd", {"a": 1})  # 1 + 3 + len("{'a': 1}") = 12 characters


def answered(text: str, stop: StopReason = "stop") -> ModelReplied:
    return ModelReplied(ModelResponse(Message("assistant", (TextPart(text),)), stop))


def calling(*ids: str, text: str = "") -> Message:
    calls = tuple(ToolCall(i, "t", {}, "{}") for i in ids)
    return Message("assistant", ((TextPart(text),) if text else ()) + calls)


def results(*ids: str, output: str = "ok") -> Message:
    return Message("tool", tuple(ToolResult(i, "t", output) for i in ids))


def test_a_message_is_measured_in_characters_with_images_at_a_fixed_price() -> None:
    image = ImagePart("image/png", b"png")
    call = ToolCall("c1", "name5", None, '{"a":1}')
    assert message_chars(Message("assistant", (TextPart("hi"), call))) == 2 + 5 + 7 + 4
    with_image = ToolResult("c1", "t", "abc", images=(image,))
    assert message_chars(Message("tool", (with_image,))) == 3 + 4 * IMAGE_TOKENS + 4
    assert message_chars(Message.user("q", images=(image, image))) == 8 * IMAGE_TOKENS + 1 + 4


def test_the_first_call_is_estimated_from_everything_it_sends() -> None:
    """About four characters a token, rounded up: the system prompt, the tools' names,
    descriptions and schemas, and every message."""
    state = LoopState([Message.user("x" * 40)], system=SYSTEM, tools=(SPEC,))
    assert estimate_next_input(state) == (8 + 12 + 44) // 4 + 1 == 17
    assert estimate_next_input(LoopState([Message.user("x" * 40)])) == 44 // 4 + 1


def test_a_later_call_is_estimated_from_the_last_calls_counts_and_what_was_added() -> None:
    """The last request's input and the reply's output are sent again; the messages after
    the reply (19 characters here) are added at four a token."""
    state = LoopState(
        [Message.user("q"), calling("c1", text="hello"), results("c1", output="x" * 15)]
    )
    state.last_usage = Usage(100, 0, 20)
    assert estimate_next_input(state) == 100 + 20 + 19 // 4
    # a server that counted one input token is believed
    state.last_usage = Usage(1, 0, 20)
    assert estimate_next_input(state) == 1 + 20 + 19 // 4
    # one that counted no input (so sent no usage) is not: the characters are counted
    state.last_usage = Usage(0, 0, 20)
    chars = 1 + 4 + (5 + 1 + 2 + 4) + (15 + 4)
    assert estimate_next_input(state) == chars // 4 + 1


def test_a_reply_without_counts_gets_estimated_ones() -> None:
    request = ModelRequest((Message.user("x" * 40),), tools=(SPEC,), system=SYSTEM)
    reply20 = ModelResponse(Message("assistant", (TextPart("y" * 20),)), "stop")
    usage = with_usage(request, reply20).usage
    assert (usage.input_tokens, usage.output_tokens, usage.estimated) == (17, 6, True)
    reply1 = ModelResponse(Message("assistant", (TextPart("y"),)), "stop")
    assert with_usage(request, reply1).usage.output_tokens == 1
    empty = ModelResponse(Message("assistant", ()), "stop")
    assert with_usage(request, empty).usage.output_tokens == 0


@pytest.mark.parametrize("counted", [Usage(1, 0, 0), Usage(0, 0, 1), Usage(30, 0, 7)])
def test_a_servers_own_counts_stand(counted: Usage) -> None:
    response = ModelResponse(Message("assistant", (TextPart("y" * 400),)), "stop", counted)
    assert with_usage(ModelRequest((Message.user("x" * 400),)), response) is response


def spent(usage: Usage) -> LoopState:
    """A run after one call that used `usage` and answered "a": the next call's input is
    estimated at exactly usage.input + usage.output tokens."""
    state = LoopState([Message.user("q"), Message("assistant", (TextPart("a"),))])
    state.usage = state.last_usage = usage
    return state


def test_each_limit_is_a_ceiling_that_may_be_reached_but_not_passed() -> None:
    """Steps, time and output tokens halt once they are used up; the next call's input, the
    total and the cost halt only when the next call would go past them."""
    s = spent(Usage(100, 0, 20))  # the next call: about 120 tokens in
    s.steps, s.started_at = 3, 0.0
    allowed = partial(over_budget, s, price=None, now=10.0)
    assert allowed(Budget(max_steps=4)) == "" and allowed(Budget(max_steps=3)) != ""
    assert allowed(Budget(max_seconds=10.5)) == ""
    assert allowed(Budget(max_seconds=10)).startswith("timeout")
    assert allowed(Budget(max_output_tokens=21)) == ""
    assert allowed(Budget(max_output_tokens=20)).startswith("max_output_tokens")
    assert allowed(Budget(max_input_tokens=220)) == ""
    assert allowed(Budget(max_input_tokens=219)).startswith("max_input_tokens")
    assert allowed(Budget(max_tokens=240)) == ""
    assert allowed(Budget(max_tokens=239)).startswith("max_tokens")
    s.cost_usd = 30.0
    per_token = Price(1_000_000.0, 0.0, 0.0)  # a dollar a token: the next call costs $120
    assert over_budget(s, Budget(max_cost_usd=150.0), per_token, 10.0) == ""
    assert over_budget(s, Budget(max_cost_usd=149.5), per_token, 10.0).startswith("max_cost")


def test_the_output_room_never_asks_for_less_than_one_token() -> None:
    s = spent(Usage(100, 0, 20))
    assert output_room(s, Budget(max_output_tokens=50), per_call=None) == 30
    assert output_room(s, Budget(max_output_tokens=50), per_call=10) == 10
    assert output_room(s, Budget(max_tokens=300), per_call=None) == 300 - 120 - 120
    assert output_room(s, Budget(max_output_tokens=20), per_call=None) == 1
    assert output_room(s, Budget(), per_call=None) is None


def test_a_final_answer_ends_the_run_unless_a_message_waits_or_the_turn_was_paused() -> None:
    state = LoopState([Message.user("q")])
    done = step(state, answered("four"), Budget(), None, 0.0)
    assert done == Finish("done", "four", "")
    cut = step(LoopState([Message.user("q")]), answered("fo", "max_tokens"), Budget(), None, 0.0)
    assert isinstance(cut, Finish) and cut.answer == "fo" and cut.reason.startswith("max_tokens")
    # a paused turn goes on, and its parts make one answer
    state = LoopState([Message.user("q")])
    assert step(state, answered("fo", "pause"), Budget(), None, 0.0) == CallModel()
    assert step(state, answered("ur"), Budget(), None, 0.0) == Finish("done", "four", "")
    # a message sent while the model answered goes to it, and the run goes on
    state = LoopState([Message.user("q")], inbox=["and five?"])
    assert step(state, answered("four"), Budget(), None, 0.0) == CallModel()
    assert [m.text for m in state.messages] == ["q", "four", "and five?"] and not state.inbox


def test_a_halted_run_answers_with_the_last_thing_the_model_said() -> None:
    state = LoopState([Message.user("go"), calling("c1", text="first look"), results("c1")])
    state.messages.append(calling("c2"))  # a reply of calls only says nothing
    state.steps = 2
    action = step(state, ToolsDone([ToolResult("c2", "t", "ok")]), Budget(max_steps=2), None, 0)
    assert isinstance(action, Finish) and (action.outcome, action.answer) == (
        "halted",
        "first look",
    )
    assert last_answer([Message.user("go"), results("c1")]) == ""


def test_the_model_is_asked_to_check_its_work_once_and_only_with_room_to_answer() -> None:
    state = LoopState([Message.user("q"), Message("assistant", (TextPart("a"),))])
    assert not ask_to_check(state, None, Budget(), None, 0.0)
    assert ask_to_check(state, "Check it.", Budget(), None, 0.0)
    assert state.messages[-1] == Message.user("Check it.")
    assert not ask_to_check(state, "Check it.", Budget(), None, 0.0)  # once a run
    assert len(state.messages) == 3
    full = LoopState([Message.user("q")], steps=1)
    assert not ask_to_check(full, "Check it.", Budget(max_steps=1), None, 0.0)
    assert full.messages == [Message.user("q")]


def test_a_required_tool_choice_holds_until_the_model_has_called_a_tool() -> None:
    asked = [Message.user("q")]
    called = [*asked, calling("c1"), results("c1")]
    paused = [*called, Message("assistant", (TextPart("half an answer"),))]  # then it goes on
    again = [*paused, Message.user("more")]
    every = (asked, called, paused, again)
    for choice in ("required", "t"):
        assert [choice_for(choice, m) for m in every] == [choice, None, None, choice]
    for held in ("auto", "none", None):
        assert [choice_for(held, m) for m in every] == [held] * 4


def test_ids_seen_before_or_empty_are_renamed_even_when_unique_in_their_reply() -> None:
    earlier = [Message.user("go"), calling("c0")]
    fixed = unique_calls(ModelResponse(calling("c0", "c1"), "tool_use"), earlier)
    assert [c.id for c in fixed.message.tool_calls] == ["c0_2", "c1"]
    fixed = unique_calls(ModelResponse(calling("", "b"), "tool_use"), [Message.user("go")])
    assert [c.id for c in fixed.message.tool_calls] == ["call_2", "b"]


def test_closing_open_calls_of_an_empty_or_answered_conversation_adds_nothing() -> None:
    assert close_open_calls([], "cancelled") == []
    answered_ = [Message.user("q"), Message("assistant", (TextPart("a"),))]
    assert close_open_calls(answered_, "cancelled") == [] and len(answered_) == 2
    open_ = [Message.user("q"), calling("c1", "c2")]
    made = close_open_calls(open_, "cancelled", {"c1": ToolResult("c1", "t", "done")})
    assert [(r.call_id, r.output, r.is_error) for r in made] == [("c2", "cancelled", True)]
    assert [r.output for r in open_[-1].tool_results] == ["done", "cancelled"]


@pytest.mark.parametrize(
    "value", [Budget(), answered("a"), ToolsDone([]), RunTools([]), Finish("done")]
)
def test_what_happened_and_what_was_decided_cannot_change_afterward(value: object) -> None:
    """A happening is journaled and a decision acted on as they are made: neither may be
    changed afterward by whoever holds it (a Budget is shared by every run given it)."""
    first = dataclasses.fields(value)[0].name  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, first, None)


def test_a_tool_s_use_of_the_model_counts_in_the_run_s_usage_and_cost() -> None:
    """A tool that asked the run's model (an MCP server's sampling) returns that usage with its
    result: added to the run's usage and, at the run's price, to its cost; a result without
    usage adds nothing, and with no price only the tokens count."""
    per_token = Price(input=1_000_000.0, cached_input=0.0, output=1_000_000.0)  # $1 a token
    state = LoopState([Message.user("q")], usage=Usage(10, output_tokens=5))
    state.cost_usd = 1.0
    results = (
        ToolResult("c1", "ask", "sampled", usage=Usage(3, output_tokens=2)),
        ToolResult("c2", "plain", "no model asked"),
    )
    assert step(state, ToolsDone(results), Budget(), per_token, 0.0) == CallModel()
    assert (state.usage.input_tokens, state.usage.output_tokens) == (13, 7)
    assert state.cost_usd == pytest.approx(6.0)
    unpriced = LoopState([Message.user("q")])
    step(unpriced, ToolsDone(results[:1]), Budget(), None, 0.0)
    assert (unpriced.usage.input_tokens, unpriced.cost_usd) == (3, 0.0)
