"""Questions: a tool asks the person behind a run for a few values, in the middle of a call.

An MCP server does this with elicitation ("which account?", "confirm the amount"): a message
and a flat JSON Schema of the fields wanted. It goes to a person as an approval does, through
an `Asker`: the terminal asks inline (`tether run`), `answer_defaults` accepts a request whose
fields all have defaults (`--approve auto`), `decline_all` says no one is here (a question is
never left hanging). The reply is checked against the schema before it is sent back: a person's
typo is asked again at the terminal, never passed on as a value the server did not ask for.

Where no one is at a terminal (the page, a worker, a program), a question waits on `Questions`
until it is answered (`Runtime.answer`, the page's form, `tether answer`), as an approval
waits. A durable run's questions are kept in its store (`Recorder`): answered from any
process, and a question asked again after a restart (an idempotent call made again) is
answered from there at once, so the person answers once.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from .errors import QuestionError

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

    @classmethod
    def from_dict(cls, d: dict[str, Any], run_id: str) -> Question:
        """A question as `to_dict` gave it (a store keeps it so), for the run `run_id`."""
        return cls(
            message=str(d["message"]),
            schema=dict(d["schema"]),
            asker=str(d["asker"]),
            run_id=run_id,
            call_id=str(d.get("id") or ""),
            url=str(d.get("url") or ""),
            id=str(d["question_id"]),
        )


@dataclass(frozen=True, slots=True)
class Answer:
    action: Action
    content: dict[str, Any] | None = None
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "content": self.content, "reason": self.reason}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Answer:
        action = d.get("action")
        if action not in ("accept", "decline", "cancel"):
            raise QuestionError(f"an answer's action is accept, decline or cancel, not {action!r}")
        content = d.get("content")
        if content is not None and not isinstance(content, dict):
            raise QuestionError("an answer's content is a JSON object of the fields asked for")
        return cls(action, content, str(d.get("reason") or ""))


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


def fitted(question: Question, answer: Answer) -> Answer:
    """`answer` if it may go to the server: an acceptance whose values fit the question's
    schema (a page to visit is accepted without values). QuestionError says what is wrong."""
    if answer.action != "accept":
        return Answer(answer.action, None, answer.reason)
    if question.url:
        return Answer("accept", None, answer.reason)
    wrong = problems(question, answer.content or {})
    if wrong:
        raise QuestionError(f"the answer does not fit question {question.id}: {wrong}")
    return Answer("accept", dict(answer.content or {}), answer.reason)


class Recorder(Protocol):
    """Where a durable run's questions are kept (its store's ledger)."""

    async def ask(self, question: Question) -> Answer | None:
        """Keep the question (once, by its id); the answer given to it already, if any."""
        ...

    async def answered(self, question: Question) -> Answer | None:
        """The answer given to it since, from any process, if any."""
        ...

    async def answer(self, question: Question, answer: Answer) -> bool:
        """Keep the answer; False if the question had one already."""
        ...


class Questions:
    """The questions runs wait on in this process, each answered once (`answer`). With a
    `recorder`, a durable run's: kept in its store, where an answer given by another process
    is seen within `POLL` seconds, and a question asked again after a restart finds its
    answer at once."""

    POLL = 0.5

    def __init__(self, recorder: Recorder | None = None) -> None:
        self.recorder = recorder
        self.waiting: dict[tuple[str, str], tuple[Question, asyncio.Future[Answer]]] = {}
        """By run id and question id (two runs' calls may have the same id, and so their
        questions)."""

    async def ask(self, question: Question) -> Answer:
        """The `Asker` of runs with no one at a terminal: wait for the answer."""
        if not question.run_id:
            return Answer("decline", reason="the question names no run, so no one can answer it")
        if self.recorder is not None:
            found = await self.recorder.ask(question)
            if found is not None:
                return found
        answered: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self.waiting[question.run_id, question.id] = (question, answered)
        try:
            while True:
                poll = self.POLL if self.recorder is not None else None
                await asyncio.wait({answered}, timeout=poll)
                if answered.done():
                    return answered.result()
                if self.recorder is not None:
                    found = await self.recorder.answered(question)
                    if found is not None:
                        return found
        finally:
            self.waiting.pop((question.run_id, question.id), None)

    def waits(self, run_id: str, question_id: str) -> bool:
        return (run_id, question_id) in self.waiting

    def of_run(self, run_id: str) -> list[Question]:
        return [q for q, _ in self.waiting.values() if q.run_id == run_id]

    async def answer(self, run_id: str, question_id: str, answer: Answer) -> None:
        """Answer a question a run of this process waits on (QuestionError if none does, or
        the answer does not fit it)."""
        found = self.waiting.get((run_id, question_id))
        if found is None:
            raise QuestionError(f"run {run_id} waits for no question {question_id} here")
        question, answered = found
        checked = fitted(question, answer)
        if self.recorder is not None and not await self.recorder.answer(question, checked):
            raise QuestionError(f"question {question_id} was answered already")
        if not answered.done():
            answered.set_result(checked)
