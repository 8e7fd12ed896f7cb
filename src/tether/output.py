"""Typed answers: `Agent(output_type=Invoice)` (a pydantic model) or a JSON Schema (a dict).

The schema goes to the model in each protocol's own way (Chat `response_format`, Responses
`text.format`, Anthropic a `final_answer` tool, which it has no native form for), and the
answer is checked here: `RunResult.output` is the typed value (`run_finished.output` its JSON).
An answer that does not match goes back to the model with what is wrong, within the run's
budget and `OUTPUT_TRIES` answers in all; then the run ends `failed` with `OutputInvalid`.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from .messages import OutputFormat

OUTPUT_TRIES = 3
"""Answers a model may give in all before a run whose answers never match ends `failed`."""

FENCE = re.compile(r"^\s*```(?:json)?\s*\n(.*)\n\s*```\s*$", re.S)


class Output:
    """An agent's output type: its schema for the model, and the check of an answer."""

    def __init__(self, output_type: Any) -> None:
        from pydantic import BaseModel

        self.model: type[BaseModel] | None = None
        if isinstance(output_type, type) and issubclass(output_type, BaseModel):
            self.model = output_type
            self.format = OutputFormat(output_type.__name__, output_type.model_json_schema())
        elif isinstance(output_type, dict):
            from jsonschema import Draft202012Validator, SchemaError

            try:
                Draft202012Validator.check_schema(output_type)  # a bad schema fails at once
            except SchemaError as e:
                raise ValueError(f"not a valid JSON Schema: {e.message}") from None
            self.validator = Draft202012Validator(output_type)
            name = re.sub(r"[^A-Za-z0-9_-]", "_", str(output_type.get("title") or "answer"))
            self.format = OutputFormat(name[:64], output_type)
        else:
            raise TypeError("output_type is a pydantic model class or a JSON Schema (a dict)")

    def parse(self, answer: str) -> Any:
        """The typed value of a final answer; ValueError says what does not match."""
        fenced = FENCE.match(answer)
        text = fenced.group(1) if fenced else answer
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError as e:
            raise ValueError(f"it is not JSON ({e})") from None
        return self.typed(data)

    def typed(self, data: Any) -> Any:
        """A JSON value as the output type (a durable run's recorded output, say)."""
        if self.model is not None:
            from pydantic import ValidationError

            try:
                return self.model.model_validate(data)
            except ValidationError as e:
                raise ValueError(str(e)) from None
        errors = sorted(self.validator.iter_errors(data), key=lambda e: list(e.path))
        if errors:
            where = "/".join(str(p) for p in errors[0].path) or "the answer"
            raise ValueError(f"{where}: {errors[0].message}")
        return data


def jsonable(value: Any) -> Any:
    """An output as JSON: a pydantic model dumped, anything else as it is."""
    dump = getattr(value, "model_dump", None)
    return dump(mode="json") if callable(dump) else value


def retry_message(error: ValueError) -> str:
    return (
        f"Your answer does not match the required output schema: {error}. "
        "Answer again with only the JSON that matches it."
    )
