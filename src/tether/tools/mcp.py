"""MCP client: the tools of MCP servers, used in a run like any other tool.

    async with mcp_tools(["python my_server.py", "http://127.0.0.1:9000/mcp"]) as tools:
        agent = Agent(model, [*tools, *other_tools])

A server is a command (spoken to over stdio) or a streamable HTTP URL. Its tools keep their
JSON schemas; calls get the same timeouts, error results and approvals as every other tool (an
MCP error result reaches the model as an error result). A result's text, text resources and
images reach the model; audio and binary resources are named in a note saying they were left
out, never dropped unsaid. Needs the `mcp` extra.
"""

from __future__ import annotations

import base64
import binascii
import shlex
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import orjson

from ..approvals import Policy
from ..errors import ConfigError
from ..messages import ImagePart, image_type
from .tool import DEFAULT_TIMEOUT, Tool


class MCPToolError(Exception):
    """The server answered the call with an error result."""


@asynccontextmanager
async def mcp_tools(
    servers: list[str], *, tool_timeout: float = DEFAULT_TIMEOUT, approval: Policy = "never"
) -> AsyncIterator[list[Tool]]:
    """Connect to each server, list its tools, and keep the connections open while in use."""
    try:
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters
    except ImportError:
        raise ConfigError("--mcp needs the mcp extra: pip install 'tether[mcp]'") from None
    async with AsyncExitStack() as stack:
        tools: list[Tool] = []
        for spec in servers:
            target: Any
            if spec.startswith(("http://", "https://")):
                target = spec
            else:
                argv = shlex.split(spec)
                if not argv:
                    raise ConfigError("--mcp: an empty command")
                target = StdioServerParameters(command=argv[0], args=argv[1:])
            try:
                client = await stack.enter_async_context(Client(target))
                listed = await client.list_tools()
            except Exception as e:
                raise ConfigError(f"--mcp {spec!r}: cannot reach the server: {why(e)}") from e
            for t in listed.tools:
                tools.append(
                    Tool(
                        t.name,
                        t.description or "",
                        remote_call(client, t.name),
                        None,
                        timeout=tool_timeout,
                        approval=approval,
                        schema=t.input_schema,
                    )
                )
        yield tools


def remote_call(client: Any, name: str) -> Callable[..., Coroutine[Any, Any, Any]]:
    async def call(**arguments: Any) -> str | list[Any]:
        result = await client.call_tool(name, arguments)
        images: list[ImagePart] = []
        texts: list[str] = []
        for block in result.content:  # an image is shown as one, anything else as text
            image = block_image(block)
            if image is not None:
                images.append(image)
            else:
                texts.append(block_text(block))
        text = "\n".join(filter(None, texts))
        if not text and result.structured_content is not None:
            text = orjson.dumps(result.structured_content).decode()
        if result.is_error:
            raise MCPToolError(text or "the MCP server reported an error")
        return [text, *images] if images else text

    return call


def block_image(block: Any) -> ImagePart | None:
    """An image content block as an image the model is shown (see `tool.tool_output`)."""
    if getattr(block, "type", "") != "image":
        return None
    try:
        data = base64.b64decode(block.data, validate=True)
        return ImagePart(mime_of(block) or image_type(data), data)
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


def why(e: BaseException) -> str:
    """The cause itself, not the task group that carried it ("unhandled errors in a
    TaskGroup" says nothing)."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    text = str(e) or type(e).__name__
    cause = e.__cause__ or e.__context__
    if cause is not None and str(cause) and str(cause) not in text:
        text += f" ({why(cause)})"
    return text
