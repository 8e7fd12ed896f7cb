"""Provider-neutral value types: messages, their parts, usage and a model's response.

Pure data, no behaviour beyond arithmetic and small conveniences. Every provider client translates
its wire format to and from these, so the loop, the tools and the journal never see a provider's
shape. They are immutable so a transcript can be shared between a run, its subscribers and a
journal without copies.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .frozen import quick_init

Role = Literal["system", "user", "assistant", "tool"]


StopReason = Literal["end_turn", "tool_use", "max_tokens", "content_filter", "pause", "other"]
"""Why the model stopped, mapped from each provider's own words. `pause` is a turn the server
paused (Anthropic's `pause_turn`): not an answer; sent back, the model goes on with it."""


@quick_init
@dataclass(frozen=True, slots=True)
class TextPart:
    """Text in a message."""

    text: str


@quick_init
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


IMAGE_TYPES = {
    b"\x89PNG\r\n\x1a\n": "image/png",
    b"\xff\xd8\xff": "image/jpeg",
    b"GIF87a": "image/gif",
    b"GIF89a": "image/gif",
}


def image_type(data: bytes) -> str:
    """The media type of a PNG, JPEG, GIF or WebP image, from its first bytes (every protocol
    takes these four); ValueError for anything else."""
    for magic, media_type in IMAGE_TYPES.items():
        if data.startswith(magic):
            return media_type
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    raise ValueError("not a PNG, JPEG, GIF or WebP image")


IMAGE_TOKENS = 1000
"""What an image is taken to cost in input tokens where budgets estimate (providers charge
from 85 to about 1,600, by its size)."""


@dataclass(frozen=True, slots=True)
class ImagePart:
    """An image in a user message or a tool result. Its `sha256` names it: a durable store
    keeps the bytes once under that name, and its records carry the image without them
    (`data` is then None until the run reads them back, see `durable.Blobs`)."""

    media_type: str
    data: bytes | None
    sha256: str = ""

    def __post_init__(self) -> None:
        if not self.sha256:
            if self.data is None:
                raise ValueError("an image needs its bytes or its sha256")
            object.__setattr__(self, "sha256", hashlib.sha256(self.data).hexdigest())

    @classmethod
    def of(cls, data: bytes, media_type: str | None = None) -> ImagePart:
        """An image from its bytes; the media type is read from them unless given."""
        return cls(media_type or image_type(data), data)

    @classmethod
    def load(cls, path: str | Path) -> ImagePart:
        """An image from a file (PNG, JPEG, GIF or WebP); ValueError names the file."""
        data = Path(path).read_bytes()
        try:
            return cls.of(data)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None

    @property
    def base64(self) -> str:
        if self.data is None:
            raise ValueError(f"image {self.sha256[:12]} has not been read back from its store")
        return base64.b64encode(self.data).decode()

    @property
    def data_url(self) -> str:
        return f"data:{self.media_type};base64,{self.base64}"

    def hollow(self) -> ImagePart:
        """The image without its bytes, as records carry it."""
        return self if self.data is None else ImagePart(self.media_type, None, self.sha256)

    @property
    def ref(self) -> list[str]:
        """How a record names the image: its media type and sha256 (`from_ref` reads it)."""
        return [self.media_type, self.sha256]

    @classmethod
    def from_ref(cls, ref: Any) -> ImagePart:
        """The image a record names (`ref`), without its bytes."""
        media_type, sha256 = ref
        return cls(media_type, None, sha256)

    def describe(self) -> dict[str, Any]:
        """What events and transcripts say of it (never the bytes)."""
        d: dict[str, Any] = {"media_type": self.media_type, "sha256": self.sha256}
        if self.data is not None:
            d["bytes"] = len(self.data)
        return d


@quick_init
@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool call returned, as the model reads it: the call's id and tool, its output,
    whether it is an error, and any images."""

    call_id: str
    name: str
    output: str
    is_error: bool = False
    images: tuple[ImagePart, ...] = ()
    """Images the tool returned beside its text (sent in each protocol's own way)."""
    usage: Usage | None = None
    """The run's model, asked by the tool on the run's behalf (an MCP server's sampling):
    counted in the run's usage and cost as the result arrives, and recorded with it."""


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


Part = TextPart | ToolCall | ToolResult | ReasoningPart | ImagePart


@quick_init
@dataclass(frozen=True, slots=True)
class Message:
    """One message of a conversation: its role (`user`, `assistant`, `tool`) and its parts
    (text, tool calls, tool results, reasoning), with images where there are some."""

    role: Role
    parts: tuple[Part, ...]

    @classmethod
    def user(cls, text: str, images: tuple[ImagePart, ...] = ()) -> Message:
        """A user message; its images go first, as Anthropic advises (any order works)."""
        return cls("user", (*images, TextPart(text)))

    @classmethod
    def system(cls, text: str) -> Message:
        return cls("system", (TextPart(text),))

    @property
    def text(self) -> str:
        return "".join([p.text for p in self.parts if isinstance(p, TextPart)])  # no generator

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [p for p in self.parts if isinstance(p, ToolCall)]

    @property
    def tool_results(self) -> list[ToolResult]:
        return [p for p in self.parts if isinstance(p, ToolResult)]

    @property
    def images(self) -> list[ImagePart]:
        """The message's images, those of its tool results included."""
        found: list[ImagePart] = []
        for p in self.parts:
            if isinstance(p, ImagePart):
                found.append(p)
            elif isinstance(p, ToolResult):
                found.extend(p.images)
        return found


@quick_init
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


class WireMemo:
    """A run's messages as a provider sends them, each converted once a run, not once a call.

    A conversation only grows between calls, and every call sent all of it: each message was
    made into its wire form again at every turn (in the benchmark rig, a turn's request of up
    to seven messages was a tenth of Tether's own Python, in bytecodes counted). A run's
    `LoopState` owns one and each of its requests carries it (`ModelRequest.memo`); a provider
    asks it for the wire forms (`of`) and converts only the messages added since its last
    call. Kept only while the conversation starts with the very messages it was made from:
    when a context policy rewrites the conversation, or another provider (a fallback's) asks,
    it starts again."""

    __slots__ = ("kind", "made", "said")

    def __init__(self) -> None:
        self.kind = ""
        """Whose wire form (the provider's name)."""
        self.made: Sequence[Message] = ()
        """The messages `said` says, in order."""
        self.said: list[Any] = []
        """Their wire forms, as the provider made them (one or more items a message)."""

    def of(
        self, messages: Sequence[Message], kind: str, make: Callable[[Message], list[Any]]
    ) -> list[Any]:
        """`messages` in `kind`'s wire form: what `make` gave for each, made for the ones
        new since the last call. The list is the memo's own: read it, do not change it."""
        n = len(self.made)
        if kind != self.kind or n > len(messages) or self.made != messages[:n]:
            self.kind, self.said, n = kind, [], 0  # (equal messages say the same)
        said = self.said
        for m in messages[n:]:
            said += make(m)
        self.made = messages
        return said


@quick_init
@dataclass(frozen=True, slots=True)
class ModelRequest:
    """What a model is sent for one call: the conversation, the system prompt, the tools it
    may call, the tool choice, the output schema and the output limit."""

    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    system: str | None = None
    max_output_tokens: int | None = None
    tool_choice: str | None = None
    """None or "auto" (the model decides), "required" (some tool), "none", or a tool's name."""
    output: OutputFormat | None = None
    """The schema the final answer must match (see `output`), in each protocol's own way."""
    memo: WireMemo | None = field(default=None, compare=False, repr=False)
    """The run's memo of its messages' wire forms (None: each call converts them all)."""


@quick_init
@dataclass(frozen=True, slots=True)
class ModelResponse:
    """A model's reply: the assistant message (text and tool calls), why it stopped, the
    tokens it used, and which model answered (with fallbacks, the one that served)."""

    message: Message
    stop_reason: StopReason
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    """The model the server says answered."""
    served_by: str = ""
    """Which of a `FallbackModel`'s models answered (its configured name); "" otherwise."""


def with_images(message: Message, change: Callable[[ImagePart], ImagePart]) -> Message:
    """The message with `change` made to every image, its tool results' too."""
    if not message.images:
        return message

    def part(p: Part) -> Part:
        if isinstance(p, ImagePart):
            return change(p)
        if isinstance(p, ToolResult) and p.images:
            return dataclasses.replace(p, images=tuple(map(change, p.images)))
        return p

    return Message(message.role, tuple(part(p) for p in message.parts))


def hollow(message: Message) -> Message:
    """The message with every image without its bytes: what a durable record holds, the
    bytes being kept once beside it (`Ledger.keep_images`)."""
    return with_images(message, ImagePart.hollow)


def hollow_result(r: ToolResult) -> ToolResult:
    (hollowed,) = hollow(Message("tool", (r,))).tool_results
    return hollowed


def filled(message: Message, data: dict[str, bytes]) -> Message:
    """The message with its hollow images given their bytes back from `data` (by sha256)."""

    def fill(i: ImagePart) -> ImagePart:
        return i if i.data is not None else ImagePart(i.media_type, data[i.sha256], i.sha256)

    return with_images(message, fill)


def message_chars(m: Message) -> int:
    """A message's size in characters as a request carries it: its text, its tool calls'
    names and arguments, its tool results' outputs, and each image as `IMAGE_TOKENS` (a
    budget's and an account's estimates count the whole request, tool calls and results
    included)."""
    n = 0
    for p in m.parts:
        if isinstance(p, ToolCall):
            n += len(p.name) + len(p.raw_arguments)
        elif isinstance(p, ToolResult):
            n += len(p.output) + 4 * IMAGE_TOKENS * len(p.images)
        elif isinstance(p, ImagePart):
            n += 4 * IMAGE_TOKENS
        else:
            n += len(p.text)
    return n + 4
