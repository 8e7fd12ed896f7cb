"""The step function's helpers that decide on a reply before anything runs."""

from __future__ import annotations

from tether import Message, ModelResponse, ToolCall
from tether.loop import unique_calls


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
