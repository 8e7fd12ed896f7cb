"""An ended run's transcript kept compact (`compact.py`): every part comes back equal, of its
own type, whether the transcript was kept as JSON bytes or, for values JSON would change, as a
tuple holding them."""

from __future__ import annotations

import math

import pytest

from tether.compact import compact, expand
from tether.messages import (
    ImagePart,
    Message,
    ReasoningPart,
    TextPart,
    ToolCall,
    ToolResult,
    Usage,
)
from tether.result import RunResult, compact_result, expand_result

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 8


def conversation(arguments: dict[str, object]) -> list[Message]:
    return [
        Message.user("look at a and b"),
        Message(
            "assistant",
            (
                ReasoningPart("think", signature="sig", encrypted=None, id="r1", provider="x"),
                TextPart("calling"),
                ToolCall("c1", "look", arguments, '{"raw": true}'),
                ToolCall("c2", "look", None, "not json"),
            ),
        ),
        Message(
            "tool",
            (
                ToolResult("c1", "look", "a: a file"),
                ToolResult("c2", "look", "bad arguments", is_error=True),
            ),
        ),
        Message("assistant", (TextPart("done, é ✓"),)),
    ]


def same(a: list[Message], b: list[Message]) -> bool:
    """Equal, and every part and argument of the same type (JSON would turn a tuple into a
    list, which compares unequal anyway, and True into 1, which compares equal)."""
    kinds = [[type(p) for p in m.parts] for m in a] == [[type(p) for p in m.parts] for m in b]
    args = [
        {k: type(v) for k, v in (p.arguments or {}).items()}
        for m in a
        for p in m.parts
        if isinstance(p, ToolCall)
    ] == [
        {k: type(v) for k, v in (p.arguments or {}).items()}
        for m in b
        for p in m.parts
        if isinstance(p, ToolCall)
    ]
    return a == b and kinds and args


def test_a_plain_transcript_is_kept_as_bytes_and_comes_back_equal() -> None:
    messages = conversation({"path": "a", "n": 2, "ratio": 0.5, "all": True, "none": None})
    kept = compact(messages)
    assert isinstance(kept, bytes)
    back = expand(kept)
    assert same(back, messages)
    assert back[1].parts[2].arguments == {  # type: ignore[union-attr]
        "path": "a", "n": 2, "ratio": 0.5, "all": True, "none": None,
    }  # fmt: skip


@pytest.mark.parametrize(
    "arguments",
    [
        {"paths": ["a", "b"], "opts": {"deep": True}},  # nested: the dict itself
        {"pair": (1, 2)},  # a tuple JSON would make a list
        {"big": 2**70},  # past what JSON numbers keep here
        {"x": float("inf")},
        {"bad": "\ud800"},  # a lone surrogate, no valid UTF-8
    ],
)
def test_values_json_would_change_are_kept_as_they_are(arguments: dict[str, object]) -> None:
    messages = conversation(arguments)
    back = expand(compact(messages))
    assert same(back, messages)


def test_a_nan_argument_stays_nan() -> None:
    messages = conversation({"x": float("nan")})
    (call,) = [p for p in expand(compact(messages))[1].parts if isinstance(p, ToolCall)][:1]
    assert call.arguments is not None and math.isnan(call.arguments["x"])


def test_images_and_a_tools_model_usage_come_back() -> None:
    image = ImagePart.of(PNG)
    messages = [
        Message.user("what is this?", (image,)),
        Message(
            "tool", (ToolResult("c1", "see", "a picture", images=(image,), usage=Usage(3, 1)),)
        ),
    ]
    back = expand(compact(messages))
    assert same(back, messages)
    assert back[0].images[0].data == PNG and back[1].tool_results[0].usage == Usage(3, 1)


def test_a_result_comes_back_with_its_transcript_or_its_own() -> None:
    messages = conversation({"path": "a"})
    result = RunResult("r1", "done", "done", "", Usage(10, 2, 3, 1, True), 0.25, 2, messages)
    kept = compact(messages)
    assert expand_result(compact_result(result, None), kept) == result
    own = messages[:1]
    other = RunResult("r1", "failed", "", "boom", Usage(), 0.0, 0, own, {"kind": "internal"})
    assert expand_result(compact_result(other, compact(own)), kept) == other


def test_a_subclass_of_str_keeps_its_type() -> None:
    class Name(str):
        pass

    messages = [Message("assistant", (TextPart(Name("a name")),))]
    kept = compact(messages)
    assert not isinstance(kept, bytes)
    assert type(expand(kept)[0].parts[0].text) is Name  # type: ignore[union-attr]
