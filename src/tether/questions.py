"""Questions: a tool asks the person behind a run for a few values, in the middle of a call.

An MCP server does this with elicitation ("which account?", "confirm the amount"): a message
and a flat JSON Schema of the fields wanted. It goes to a person as an approval does, through
an `Asker`: the terminal asks inline (`tether run`), `answer_defaults` accepts a request whose
fields all have defaults (`--approve auto`), `decline_all` says no one is here (a question is
never left hanging). The reply is checked against the schema before it is sent back: a person's
typo is asked again at the terminal, never passed on as a value the server did not ask for.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

Action = Literal["accept", "decline", "cancel"]


@dataclass(frozen=True, slots=True)
class Question:
    """What is asked, by whom, for which run."""

    message: str
    schema: dict[str, Any]
    """A JSON Schema of an object whose properties are plain values (MCP's restricted form)."""
    asker: str
    """Who asks: the MCP server, as the run was told of it (`--mcp`)."""
    run_id: str = ""
    call_id: str = ""
    url: str = ""
    """Set when the person is asked to visit a page (to sign in elsewhere, say), not to type."""
    id: str = field(default_factory=lambda: f"q_{uuid.uuid4().hex[:12]}")

    def fields(self) -> dict[str, dict[str, Any]]:
        props = self.schema.get("properties") or {}
        return {k: v for k, v in props.items() if isinstance(v, dict)}

    def defaults(self) -> dict[str, Any] | None:
        """Every field's default, or None when a field has none."""
        found = {k: p["default"] for k, p in self.fields().items() if "default" in p}
        return found if len(found) == len(self.fields()) else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "question_id": self.id,
            "asker": self.asker,
            "message": self.message,
            "schema": self.schema,
            "url": self.url,
            "id": self.call_id,
        }


@dataclass(frozen=True, slots=True)
class Answer:
    action: Action
    content: dict[str, Any] | None = None
    reason: str = ""


Asker = Callable[[Question], Awaitable[Answer]]


async def decline_all(question: Question) -> Answer:
    """No one is here to answer: the server is told so, at once."""
    return Answer("decline", reason="no one is here to answer it")


async def answer_defaults(question: Question) -> Answer:
    """`--approve auto`: a question whose fields all have defaults is answered with them;
    any other is declined (a value only a person knows is never made up)."""
    found = question.defaults()
    if question.url:
        return Answer("decline", reason="a page to visit is never opened by policy")
    if found is None:
        return Answer("decline", reason="a field has no default and no one is here to fill it")
    return Answer("accept", found, "answered with the defaults (--approve auto)")


def problems(question: Question, content: dict[str, Any]) -> str:
    """What is wrong with `content` as an answer to `question` ("" when nothing is)."""
    from jsonschema.validators import validator_for

    schema = question.schema
    errors = sorted(validator_for(schema)(schema).iter_errors(content), key=lambda e: e.path)
    return "; ".join(
        f"{'.'.join(map(str, e.path)) or 'the answer'}: {e.message}" for e in errors[:3]
    )


def parse_value(spec: dict[str, Any], text: str) -> Any:
    """A value typed at the terminal as the field's type wants it; ValueError when it is not."""
    kind = spec.get("type")
    text = text.strip()
    if kind == "boolean":
        if text.lower() in ("y", "yes", "true", "1"):
            return True
        if text.lower() in ("n", "no", "false", "0"):
            return False
        raise ValueError("answer yes or no")
    if kind == "integer":
        return int(text)
    if kind == "number":
        return float(text)
    if kind == "array":
        return [part.strip() for part in text.split(",") if part.strip()]
    return text
