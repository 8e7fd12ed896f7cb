"""What an MCP server sends, as Tether's values: a call's result as a tool's output (its text,
its images by their bytes, notes for what the model cannot be shown), a sampling request's
messages as messages, and a tool's input schema checked. Bounded as a model server's replies
are: a result's text is kept to its first and last `RESULT_KEEP` characters.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import orjson

from ..errors import ConfigError
from ..messages import ImagePart, Message, TextPart, image_type

RESULT_KEEP = 100_000
"""Characters of a result's text kept at its head, and as many at its tail."""


class MCPToolError(Exception):
    """The server answered the call with an error result."""


def sampled_message(m: Any) -> Message:
    """A message of a sampling request as a message of ours: its text and images (anything
    else is named in a note, never dropped unsaid)."""
    blocks = m.content if isinstance(m.content, list) else [m.content]
    parts: list[Any] = []
    for block in blocks:
        image = block_image(block) if m.role == "user" else None
        parts.append(image if image is not None else TextPart(block_text(block)))
    return Message("assistant" if m.role == "assistant" else "user", tuple(parts))


def call_output(result: Any) -> str | list[Any]:
    """A call's result as a tool's output: text, with its images beside it."""
    images: list[ImagePart] = []
    texts: list[str] = []
    for block in result.content:  # an image is shown as one, anything else as text
        image = block_image(block)
        if image is not None:
            images.append(image)
        else:
            texts.append(block_text(block))
    text = "\n".join(filter(None, texts))
    if not text and not images and result.structured_content is not None:
        # the result's JSON when its content says nothing; an image's structured copy is
        # the image again, in base64 (an image-only result went twice: 200 k characters)
        text = orjson.dumps(result.structured_content).decode()
    text = kept(text)
    if result.is_error:
        raise MCPToolError(text or "the MCP server reported an error")
    return [text, *images] if images else text


def kept(text: str) -> str:
    """A result's text, its middle cut when it is longer than twice `RESULT_KEEP`."""
    if len(text) <= 2 * RESULT_KEEP:
        return text
    cut = len(text) - 2 * RESULT_KEEP
    return (
        f"{text[:RESULT_KEEP]}\n[... {cut} characters of the result cut ...]\n{text[-RESULT_KEEP:]}"
    )


def check_schema(spec: str, name: str, schema: Any) -> None:
    """A tool's input schema must be a JSON Schema of an object: the model is sent it, and
    calls are checked against it (a bad one was a traceback when the agent was built)."""
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    why_not = ""
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        why_not = "it is not a schema of an object"
    else:
        try:
            validator_for(schema).check_schema(schema)
        except SchemaError as e:
            why_not = e.message
    if why_not:
        raise ConfigError(f"--mcp {spec!r}: tool {name!r} has an invalid input schema: {why_not}")


def block_image(block: Any) -> ImagePart | None:
    """An image content block as an image the model is shown (see `tool.tool_output`), its
    media type read from its bytes: a server's own word for it (any `mimeType`, an SVG, HTML)
    went to the model and the page as it was; what is not a PNG, JPEG, GIF or WebP image is
    left out, said so."""
    if getattr(block, "type", "") != "image":
        return None
    try:
        data = base64.b64decode(block.data, validate=True)
        return ImagePart(image_type(data), data)
    except (binascii.Error, TypeError, ValueError):
        return None  # not an image after all: `block_text` says it is left out


def block_text(block: Any) -> str:
    """A content block as the model will read it: text as it is, anything else as a note."""
    kind = getattr(block, "type", "")
    if kind == "text":
        return str(block.text)
    if kind in ("image", "audio"):
        size = len(getattr(block, "data", "") or "") * 3 // 4
        return (
            f"[left out: an {kind} ({mime_of(block)}, about "
            f"{size} bytes); tool results reach the model as text]"
        )
    if kind == "resource":
        res = block.resource
        if getattr(res, "text", None) is not None:
            return f"[resource {res.uri}]\n{res.text}"
        size = len(getattr(res, "blob", "") or "") * 3 // 4
        return (
            f"[left out: resource {res.uri} ({mime_of(res) or 'binary'}, about {size} bytes); "
            "tool results reach the model as text]"
        )
    if kind == "resource_link":
        return f"[resource link: {block.uri}{' ' + block.name if block.name else ''}]"
    return f"[left out: a {kind or 'content'} block the model cannot be shown]"


def mime_of(block: Any) -> str:
    """A block's media type, under the SDK's older or newer field name."""
    return str(getattr(block, "mime_type", None) or getattr(block, "mimeType", None) or "")
