"""Records are data: how a run's recorded steps are written to a store and read back.

A store's rows are read by every process that shows or executes a run: `tether show`, the
page, `tether resume`, every worker on every machine. A pickle is a program, so with pickled
steps whoever could write one row could run code in all of them (an audit did it from a
sandboxed command through a reachable Postgres socket). A record here is JSON of plain values
and of our message types only, checked as it is read: an object names one of `TYPES` and
holds that type's fields, each of the kind its annotation says where that is a plain kind.
Reading a record builds frozen dataclasses from checked values; it calls nothing else.

    {"$t": "ToolResult", "call_id": "c1", "name": "add", "output": "42", ...}
    {"$tuple": [...]}   {"$d": {...}}   {"$b": "base64"}   lists, strings, numbers, null

Every record begins with `RECORD_FORMAT` (`formats.py`); one without it (a pickle written by
an earlier version) is refused with `RecordError`, never unpickled. `tether migrate`
(`migrate.py`) rewrites a store written before 0.1.0, reading its pickles with an unpickler
that builds our types only.

What DBOS keeps of a run (its inputs, its result, the messages and events that carry
approvals) goes through the same codec (`RecordSerializer`), and DBOS's own pickle reader is
replaced by one that refuses (`PicklesRefused`, put in place by `dbos_private.refuse_pickles`):
a row's `serialization` column is data too, and one rewritten to say `py_pickle` must not make
DBOS unpickle it.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import typing
from typing import Any

import orjson

from ..errors import RecordError, TetherError
from ..messages import (
    ImagePart,
    Message,
    ModelResponse,
    ReasoningPart,
    TextPart,
    ToolCall,
    ToolResult,
    Usage,
)
from .formats import RECORD_FORMAT

TYPES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        TextPart, ToolCall, ImagePart, ToolResult, ReasoningPart, Message, Usage, ModelResponse
    )
}  # fmt: skip
PLAIN = {"str": str, "int": int, "float": (int, float), "bool": bool}
SCALARS = frozenset({str, int, float, bool, type(None)})
FIELDS: dict[type, tuple[str, ...]] = {
    cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in TYPES.values()
}
"""Each of `TYPES` and its fields' names, in order (what `dataclasses.fields` gives each time)."""


NOT_OURS = (
    "refused, never unpickled (a store written before 0.1.0 is rewritten as records, once, by "
    "`tether migrate --store STORE`; a row written by someone else stays refused)"
)


class RecordedFailure(TetherError):
    """A failure as a store keeps it: the name of its exception's type (`kind`) and its
    message. The exception itself is never stored."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def dumps(value: Any) -> bytes:
    """`value` as a record: `RECORD_FORMAT`, then JSON."""
    return RECORD_FORMAT + orjson.dumps(encode(value))


def loads(record: bytes, what: str = "a record") -> Any:
    """A record read back, checked; `what` names it in an error (a run's step)."""
    if not bytes(record).startswith(RECORD_FORMAT):
        raise RecordError(f"{what} is not in Tether's record format: {NOT_OURS}")
    try:
        return decode(orjson.loads(bytes(record)[len(RECORD_FORMAT) :]))
    except (orjson.JSONDecodeError, TypeError, ValueError, KeyError) as e:
        raise RecordError(f"{what} is not a valid record: {e}") from None


def encode(value: Any) -> Any:
    """`value` as plain JSON values (the module's docstring). Values of exactly a plain type, a
    list, a tuple or one of `TYPES` take the short way here; the rest (a subclass, an error,
    bytes, a mapping) `encode_other`, which gives an exact one the same. Every durable step, a
    run's inputs and its result are encoded, some forty calls a record: a model step's 17.1 us
    became 8.1, a tool step's 9.2 became 4.1 (`bench/records_encode.py`), the same bytes."""
    kind = type(value)
    if kind in SCALARS:
        return value
    if kind is list:
        return [encode(v) for v in value]
    if kind is tuple:
        return {"$tuple": [encode(v) for v in value]}
    names = FIELDS.get(kind)
    if names is not None:
        out = {"$t": kind.__name__}
        for name in names:
            out[name] = encode(getattr(value, name))
        return out
    return encode_other(value)


def encode_other(value: Any) -> Any:
    """What `encode` leaves: a subclass is recorded as its plain kind would be."""
    if isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, BaseException):  # DBOS keeps a failed workflow's error: its words
        return {"$error": {"type": type(value).__name__, "message": str(value)}}
    if isinstance(value, list):
        return encode(list(value))
    if isinstance(value, tuple):
        return encode(tuple(value))
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError("a record's mapping has keys that are not strings")
        return {"$d": {k: encode(v) for k, v in value.items()}}
    if isinstance(value, (bytes, bytearray)):
        return {"$b": base64.b64encode(value).decode()}
    raise TypeError(f"{type(value).__name__} cannot be recorded")  # ours are in `FIELDS`


def decode(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict) or len(value) == 0:
        raise ValueError(f"unexpected {type(value).__name__} in a record")
    if "$t" in value:
        return build(value)
    (tag, inner), *rest = value.items()
    if rest:
        raise ValueError(f"unexpected object with keys {sorted(value)}")
    if tag == "$tuple" and isinstance(inner, list):
        return tuple(decode(v) for v in inner)
    if tag == "$d" and isinstance(inner, dict):
        return {str(k): decode(v) for k, v in inner.items()}
    if tag == "$b" and isinstance(inner, str):
        return base64.b64decode(inner, validate=True)
    if tag == "$error" and isinstance(inner, dict):
        return RecordedFailure(str(inner.get("message", "")), str(inner.get("type", "")))
    raise ValueError(f"unexpected object {tag!r}")


def build(value: dict[str, Any]) -> Any:
    """One of `TYPES` from its recorded fields: the names must be the type's own, and a field
    annotated as a plain kind (str, int, float, bool) must hold one."""
    name = value["$t"]
    cls = TYPES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"type {name!r} is not one a record may hold")
    given = {k: v for k, v in value.items() if k != "$t"}
    kinds = field_kinds(cls)
    unknown = set(given) - set(kinds)
    if unknown:
        raise ValueError(f"{name} has no field {sorted(unknown)[0]!r}")
    args = {}
    for key, raw in given.items():
        field = decode(raw)
        kind = kinds[key]
        if kind is not None and not isinstance(field, kind):
            raise ValueError(f"{name}.{key} holds {type(field).__name__}")
        args[key] = field
    return cls(**args)


@functools.cache
def field_kinds(cls: type) -> dict[str, Any]:
    """Each field of `cls` and the plain kind its value must be (None: checked by shape only,
    a union, a tuple of parts, a mapping ...)."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        out[f.name] = PLAIN.get(hint.__name__) if isinstance(hint, type) else None
    return out


class RecordSerializer:
    """DBOS's serializer (its `Serializer` interface) for what it keeps of a run: records."""

    def name(self) -> str:
        return "tether_records"

    def serialize(self, data: Any) -> str:
        return orjson.dumps(encode(data)).decode()

    def deserialize(self, serialized_data: str) -> Any:
        try:
            return decode(orjson.loads(serialized_data))
        except (orjson.JSONDecodeError, TypeError, ValueError, KeyError) as e:
            raise RecordError(f"a run's record in the store is not valid: {e}") from None


class PicklesRefused:
    """In place of DBOS's pickle serializer: reading a row that says it is a pickle is refused,
    and nothing is ever written as one."""

    def name(self) -> str:
        return "py_pickle"

    def serialize(self, data: Any) -> str:
        raise TypeError("Tether records no pickles")

    def deserialize(self, serialized_data: str) -> Any:
        raise RecordError(f"a run's record in the store is a pickle: {NOT_OURS}")
