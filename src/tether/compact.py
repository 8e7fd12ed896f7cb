"""An ended run's transcript kept compact: what a process holds of the runs it keeps after they
end (a `Runtime` keeps the last 10,000 for `get` and the page), read back when someone asks.

As message objects, an ended run held some fifty objects the host's garbage collector walked at
every full collection, and their strings and small objects stayed scattered among the pages new
ones are made in. Measured in the benchmark rig's 1,000-run scenario (3,000 runs kept, pinned,
alternating runs of each tree; CPU a model turn): forgetting ended runs at once was 6.5-8% less
than keeping them as they were; keeping them as tuples of plain values 2% less; as one bytes
object each (this module), most of the way to forgetting them.

A transcript is laid out flat: each message is its role and its number of parts, then each
part: a text as its string; a call, a result or reasoning as its number (`CALL`, `RESULT`,
`REASONING`) and its fields (a call's arguments of plain values flat too: their number, then
each name and value); an image as itself. When every value is one JSON keeps exactly (a
string, a finite float, an int of 64 bits, a bool, None) the flat list is kept as JSON bytes;
otherwise (images, a tool's model usage, nested arguments) as a tuple holding those values
themselves. Either way `expand` gives equal messages back.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Collection, Iterable, Sequence
from itertools import chain
from typing import Any, cast

import orjson

from .messages import Message, Part, ReasoningPart, TextPart, ToolCall, ToolResult

CALL, RESULT, REASONING = 1, 2, 3
"""How a compact transcript names a call, a result and a reasoning part (a text is its string;
an image is kept as itself)."""
REASONING_FIELDS = operator.attrgetter(*(f.name for f in dataclasses.fields(ReasoningPart)))
REASONING_WIDTH = len(dataclasses.fields(ReasoningPart))
PLAIN = frozenset({str, int, float, bool, type(None)})


def all_plain(values: Collection[Any]) -> bool:
    """Whether JSON gives every one of `values` back as it is (but for what only `written`
    finds out: an int past 64 bits, a string that is no valid UTF-8): a str, a finite float,
    an int, a bool or None, and no subclass of them. Asked in C, their types at once and then
    the floats' finiteness if there are floats: a Python call a value was a fifth of the
    bytecodes an ended run's compaction took in the benchmark rig's runs."""
    kinds = set(map(type, values))
    if not kinds <= PLAIN:
        return False
    return float not in kinds or all(map(math.isfinite, [v for v in values if type(v) is float]))


Compact = bytes | tuple[Any, ...]


def compact(messages: Iterable[Message]) -> Compact:
    """The transcript, compact (see the module docstring)."""
    flat: list[Any] = []
    exact = True  # every value one JSON gives back as it is (checked as it is laid out)
    for m in messages:
        flat += (m.role, len(m.parts))
        for p in m.parts:
            kind = type(p)
            if kind is TextPart:
                flat.append(cast(TextPart, p).text)
            elif kind is ToolCall:
                call = cast(ToolCall, p)
                flat += (CALL, call.id, call.name, call.raw_arguments)
                exact = arguments(flat, call.arguments) and exact
            elif kind is ToolResult:
                r = cast(ToolResult, p)
                flat += (RESULT, r.call_id, r.name, r.output, r.is_error)
                if r.images or r.usage is not None:
                    flat.append((r.images, r.usage))
                    exact = False
                else:
                    flat.append(0)
            elif kind is ReasoningPart:
                fields = REASONING_FIELDS(p)
                flat.append(REASONING)
                flat += fields
                exact = exact and all_plain(fields)
            else:
                flat.append(p)  # an image, or a part of no kind here: as it is
                exact = False
    return written(flat) if exact else tuple(flat)


def arguments(flat: list[Any], given: dict[str, Any] | None) -> bool:
    """A call's arguments: their number, then each name and value, when every value is
    plain; else the dict itself (or None). Whether JSON gives them back as they are."""
    if given is None:
        flat.append(None)
        return True
    if not all_plain(given.values()):
        flat.append(given)
        return False
    flat.append(len(given))
    flat += chain.from_iterable(given.items())
    return True


def pack(flat: list[Any]) -> Compact:
    """`flat` as JSON bytes when JSON gives back every value exactly; else as a tuple."""
    return written(flat) if all_plain(flat) else tuple(flat)


def written(flat: list[Any]) -> Compact:
    """`flat`, each value plain, as JSON bytes; as a tuple where JSON would change one (a
    subclass of str or int, an int past 64 bits, a string that is no valid UTF-8)."""
    try:
        text = orjson.dumps(flat, option=orjson.OPT_PASSTHROUGH_SUBCLASS)
    except orjson.JSONEncodeError:
        return tuple(flat)
    return bytes(memoryview(text))  # a copy of its size: orjson's held the buffer it grew


def unpack(kept: Compact) -> Sequence[Any]:
    return cast(list[Any], orjson.loads(kept)) if type(kept) is bytes else cast(tuple[Any], kept)


def expand(kept: Compact) -> list[Message]:
    """The messages `compact` was given, made again."""
    flat = unpack(kept)
    messages = []
    i, end = 0, len(flat)
    while i < end:
        role, n = flat[i], flat[i + 1]
        i += 2
        parts: list[Part] = []
        for _ in range(n):
            part, i = expand_part(flat, i)
            parts.append(part)
        messages.append(Message(role, tuple(parts)))
    return messages


def expand_part(flat: Sequence[Any], i: int) -> tuple[Part, int]:
    """The part that starts at `flat[i]`, and where the next one starts."""
    item = flat[i]
    if isinstance(item, str):  # (a subclass of str too, kept in a tuple)
        return TextPart(item), i + 1
    if type(item) is not int:
        return cast(Part, item), i + 1
    if item == CALL:
        call_id, name, raw, given = flat[i + 1 : i + 5]
        i += 5
        if type(given) is int:
            pairs = flat[i : i + 2 * given]
            i += 2 * given
            given = dict(zip(pairs[::2], pairs[1::2], strict=True))
        return ToolCall(call_id, name, given, raw), i
    if item == RESULT:
        call_id, name, output, is_error, extra = flat[i + 1 : i + 6]
        images, usage = ((), None) if extra == 0 else extra
        return ToolResult(call_id, name, output, is_error, images, usage), i + 6
    end = i + 1 + REASONING_WIDTH  # item == REASONING
    return ReasoningPart(*flat[i + 1 : end]), end
