"""`quick_init`: the value classes a run makes by the thousand keep what their dataclass says
(parameters, defaults, factories, frozen, equality) with the cheaper constructor."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field

import pytest

from tether.events import Event
from tether.frozen import quick_init
from tether.loop import Finish
from tether.messages import Message, ModelResponse, TextPart, ToolCall, ToolResult, Usage


@quick_init
@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    count: int = 3
    tags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.count < 0:
            raise ValueError("count is below 0")


def test_quick_init_keeps_defaults_factories_post_init_and_frozen() -> None:
    a, b = Sample("a"), Sample("b", 5, ["x"])
    assert (a.name, a.count, a.tags, b.count, b.tags) == ("a", 3, [], 5, ["x"])
    assert Sample("a").tags is not a.tags  # a fresh value from the factory each time
    assert Sample(name="a", count=3) == a and Sample("c") != Sample("c", 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.count = 4  # type: ignore[misc]
    with pytest.raises(ValueError, match="below 0"):
        Sample("a", -1)
    with pytest.raises(TypeError):
        Sample()  # type: ignore[call-arg]
    params = inspect.signature(Sample).parameters
    assert list(params) == ["name", "count", "tags"] and params["count"].default == 3
    assert repr(params["tags"].default) == "<factory>"


@pytest.mark.parametrize(
    "made",
    [
        Event("tool_call", "r1", 2, {"id": "c1"}, 1.5),
        Message("assistant", (TextPart("hi"), ToolCall("c1", "f", {"a": 1}, '{"a": 1}'))),
        ToolResult("c1", "f", "out"),
        ModelResponse(Message("assistant", ()), "end_turn"),
        Usage(1, 2, 3),
        Finish("done", "answer"),
    ],
)
def test_the_values_a_run_makes_are_their_dataclasses(made: object) -> None:
    """Each is what `dataclasses` would make of the same arguments: the same fields, equal,
    and frozen."""
    values = {f.name: getattr(made, f.name) for f in dataclasses.fields(made)}  # type: ignore[arg-type]
    assert type(made)(**values) == made
    assert dataclasses.replace(made, **values) == made  # type: ignore[type-var]
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, next(iter(values)), None)
    assert ModelResponse(Message("assistant", ()), "end_turn").usage == Usage()
