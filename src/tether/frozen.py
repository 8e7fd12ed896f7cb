"""A cheaper `__init__` for the frozen value classes a run makes by the thousand.

A `@dataclass(frozen=True, slots=True)` sets each field through `object.__setattr__`, looked up
again for every field of every instance: 1.2 µs for the five fields of an `Event` on the
benchmark machine, where a plain slots class takes 0.25 µs. A turn of a run makes about thirty
such values (its events, messages, tool calls and results, usage), so those setters were some
4% of a turn's CPU. `quick_init` gives such a class an `__init__` that sets each slot through
its own descriptor, looked up once when the class is made: 0.55 µs. The class stays what it
was: frozen (assigning a field raises `FrozenInstanceError`), compared, hashed and printed as
the dataclass says, with the same parameters and defaults.
"""

from __future__ import annotations

import dataclasses
from typing import Any


class Unset:
    """A parameter whose field has a default factory, not given (shown as dataclasses
    show it in a signature)."""

    def __repr__(self) -> str:
        return "<factory>"


UNSET = Unset()


def quick_init[T: type](cls: T) -> T:
    """Give a frozen slots dataclass the faster `__init__` (the module docstring says why).
    Use it above `@dataclass(frozen=True, slots=True)`."""
    params, body = [], []
    scope: dict[str, Any] = {"UNSET": UNSET}
    for f in dataclasses.fields(cls):
        if not f.init or f.kw_only:
            raise TypeError(f"quick_init: {cls.__name__}.{f.name} is not a plain init field")
        scope[f"set_{f.name}"] = getattr(cls, f.name).__set__  # the slot's own setter
        if f.default is not dataclasses.MISSING:
            scope[f"default_{f.name}"] = f.default
            params.append(f"{f.name}=default_{f.name}")
        elif f.default_factory is not dataclasses.MISSING:
            scope[f"make_{f.name}"] = f.default_factory
            params.append(f"{f.name}=UNSET")
            body.append(f"if {f.name} is UNSET: {f.name} = make_{f.name}()")
        else:
            params.append(f.name)
        body.append(f"set_{f.name}(self, {f.name})")
    if hasattr(cls, "__post_init__"):
        body.append("self.__post_init__()")
    lines = "".join(f"    {line}\n" for line in body or ["pass"])
    exec(f"def __init__(self, {', '.join(params)}):\n{lines}", scope)  # as dataclasses does
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__annotations__ = vars(cls)["__init__"].__annotations__  # the dataclass's
    setattr(cls, "__init__", init)  # noqa: B010 - mypy refuses `cls.__init__ = init`
    return cls
