"""MCP client: the tools of MCP servers, used in a run like any other tool.

    async with mcp_tools(["python my_server.py", "http://127.0.0.1:9000/mcp"]) as tools:
        agent = Agent(model, [*tools, *other_tools])

A server is a command (spoken to over stdio) or a streamable HTTP URL. Its tools keep their
JSON schemas; calls get the same timeouts, error results and approvals as every other tool (an
MCP error result reaches the model as an error result). Needs the `mcp` extra.
"""

from __future__ import annotations

import shlex
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import orjson

from ..approvals import Policy
from ..errors import ConfigError
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
                raise ConfigError(f"--mcp {spec!r}: cannot reach the server: {e}") from e
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


def remote_call(client: Any, name: str) -> Callable[..., Coroutine[Any, Any, str]]:
    async def call(**arguments: Any) -> str:
        result = await client.call_tool(name, arguments)
        text = "\n".join(
            getattr(block, "text", "") for block in result.content if hasattr(block, "text")
        )
        if not text and result.structured_content is not None:
            text = orjson.dumps(result.structured_content).decode()
        if result.is_error:
            raise MCPToolError(text or "the MCP server reported an error")
        return text

    return call
