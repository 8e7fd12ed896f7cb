"""Provider-neutral value types: messages, their parts, usage and a model's response.

Pure data, no behaviour beyond arithmetic and small conveniences. Every provider client translates
its wire format to and from these, so the loop, the tools and the journal never see a provider's
shape. They are immutable so a transcript can be shared between a run, its subscribers and a
journal without copies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]

StopReason = Literal["end_turn", "tool_use", "max_tokens", "content_filter", "pause", "other"]
"""Why the model stopped, mapped from each provider's own words. `pause` is a turn the server
paused (Anthropic's `pause_turn`): not an answer; sent back, the model goes on with it."""


@dataclass(frozen=True, slots=True)
class TextPart:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call the model asked for.

    `arguments` is the parsed JSON object, or None when the model sent something that is not a JSON
    object; `raw_arguments` is exactly what the model sent, so it can be echoed back unchanged.
    """

    id: str
    name: str
    arguments: dict[str, Any] | None
    raw_arguments: str = ""


@dataclass(frozen=True, slots=True)
class ToolResult:
    call_id: str
    name: str
    output: str
    is_error: bool = False


@dataclass(frozen=True, slots=True)
class ReasoningPart:
    """Model reasoning. `signature` / `encrypted` are opaque provider data that must be sent back
    unchanged on the next turn for reasoning models to continue their chain of thought; `provider`
    names who made them, since no other provider can read them."""

    text: str
    signature: str | None = None
    encrypted: str | None = None
    id: str | None = None
    provider: str | None = None


Part = TextPart | ToolCall | ToolResult | ReasoningPart


@dataclass(frozen=True, slots=True)
class Message:
    role: Role
    parts: tuple[Part, ...]

    @classmethod
    def user(cls, text: str) -> Message:
        return cls("user", (TextPart(text),))

    @classmethod
    def system(cls, text: str) -> Message:
        return cls("system", (TextPart(text),))

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [p for p in self.parts if isinstance(p, ToolCall)]

    @property
    def tool_results(self) -> list[ToolResult]:
        return [p for p in self.parts if isinstance(p, ToolResult)]


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts, normalized: `input_tokens` counts every prompt token, cached ones included."""

    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    estimated: bool = False
    """Some counts were estimated, because the server left them out (see `loop.with_usage`)."""

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.cached_input_tokens + other.cached_input_tokens,
            self.output_tokens + other.output_tokens,
            self.reasoning_tokens + other.reasoning_tokens,
            self.estimated or other.estimated,
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Usage:
        """The inverse of `to_dict` (as events carry it); missing counts are 0."""
        return cls(
            int(d.get("input_tokens", 0)),
            int(d.get("cached_input_tokens", 0)),
            int(d.get("output_tokens", 0)),
            int(d.get("reasoning_tokens", 0)),
            bool(d.get("estimated", False)),
        )

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def to_dict(self) -> dict[str, int | bool]:
        """The counts, and `"estimated": true` when some were (the key is absent otherwise)."""
        d: dict[str, int | bool] = {
            "input_tokens": self.input_tokens,
            "cached_input_tokens": self.cached_input_tokens,
            "output_tokens": self.output_tokens,
            "reasoning_tokens": self.reasoning_tokens,
        }
        if self.estimated:
            d["estimated"] = True
        return d


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """What the model is told about a tool: its name, description and JSON schema."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class OutputFormat:
    """The shape a final answer must have: a JSON Schema, with the name protocols ask for."""

    name: str
    schema: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ModelRequest:
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    system: str | None = None
    max_output_tokens: int | None = None
    tool_choice: str | None = None
    """None or "auto" (the model decides), "required" (some tool), "none", or a tool's name."""
    output: OutputFormat | None = None
    """The schema the final answer must match (see `output`), in each protocol's own way."""


@dataclass(frozen=True, slots=True)
class ModelResponse:
    message: Message
    stop_reason: StopReason
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    """The model the server says answered."""
    served_by: str = ""
    """Which of a `FallbackModel`'s models answered (its configured name); "" otherwise."""
