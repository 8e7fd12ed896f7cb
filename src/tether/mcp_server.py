"""`tether mcp-serve`: Tether's tools, and a Tether agent as one more tool, for MCP clients.

Over stdio, or streamable HTTP on 127.0.0.1 (`--http`). Each tool keeps its schema, timeout and
error results; `run_agent` runs the configured agent (model, tools, budgets from the command
line) on a task and returns its answer. Tool calls that need approval are denied here (an MCP
client has no way to be asked) unless started with `--approve auto`.

Over HTTP the server is guarded as the page is: every request carries the bearer token (a new
one is printed at start; `--no-token` for a local client that cannot send one), and a Host or
Origin header that is not this machine's is refused, so a web page the user visits cannot reach
it by DNS rebinding (the SDK's check, on for a loopback address).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import socket
import uuid
from pathlib import Path
from typing import Any

from .approvals import Approver
from .messages import ToolCall
from .options import CLI_AGENT
from .result import RunResult
from .runtime import Runtime
from .tools.tool import RunContext, Tool, tool
from .tools.toolbox import Toolbox
from .version import __version__


def agent_tool(
    runtime: Runtime, options: dict[str, Any], workspace: Path, approver: Approver
) -> Tool:
    """`run_agent`: a run of the options' agent on the runtime (open while the server is)."""

    @tool(name="run_agent", timeout=3600)
    async def run_agent(task: str) -> str:
        """Give a task to a Tether agent, which works on it with its own tools, and get its
        answer.

        Args:
            task: What the agent should do, in plain words.
        """
        run = await runtime.start(
            CLI_AGENT,
            task,
            options=options,
            context=RunContext(workspace=workspace),
            approver=approver,
        )
        try:
            result: RunResult = await run.wait()
        except asyncio.CancelledError:  # the client cancelled its call: the run goes too
            runtime.cancel(run.id)  # (it went on: its bash made a file 11 s later)
            with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(run.wait()), CANCEL_WAIT_S)
            raise
        if result is None:
            raise RuntimeError("the agent run did not start")
        if result.outcome != "done":
            raise RuntimeError(f"the agent run {result.outcome}: {result.reason}")
        return result.answer

    return run_agent


def mcp_server(tools: list[Tool], workspace: Path, approver: Approver) -> Any:
    """The SDK's server for these tools."""
    from mcp import types
    from mcp.server.lowlevel import Server

    toolbox = Toolbox(tools)
    ctx = RunContext(run_id="mcp", workspace=workspace)

    async def list_tools(context: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[
                types.Tool(name=t.name, description=t.description, input_schema=t.parameters)
                for t in toolbox.tools.values()
            ]
        )

    async def call_tool(context: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        call = ToolCall(uuid.uuid4().hex[:12], params.name, dict(params.arguments or {}))
        result = await toolbox.run(call, ctx, approver)
        return types.CallToolResult(
            content=[types.TextContent(text=result.output)], is_error=result.is_error
        )

    server: Server[Any] = Server(
        "tether", version=__version__, on_list_tools=list_tools, on_call_tool=call_tool
    )
    return server


async def serve_stdio(
    runtime: Runtime, tools: list[Tool], workspace: Path, approver: Approver
) -> None:
    from mcp.server.stdio import stdio_server

    server = mcp_server(tools, workspace, approver)
    async with runtime, stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


MAX_CONNECTIONS = 128
"""Connections and requests `mcp-serve --http` serves at once; more are answered 503 at once,
so that clients without the token (answered 401 from their headers, before any body is read)
cannot hold every slot."""
HEADERS_MAX = 64 * 1024
"""The most bytes of a request's headers read before it is refused."""


CANCEL_WAIT_S = 10.0
"""How long a cancelled `run_agent` call waits for its run to end (its tool calls' processes
killed) before it answers the cancel."""


async def serve_http(
    runtime: Runtime,
    tools: list[Tool],
    workspace: Path,
    approver: Approver,
    sock: socket.socket,
    token: str | None,
) -> None:
    """Streamable HTTP at /mcp on the bound `sock`, until the process is stopped."""
    import uvicorn

    server = mcp_server(tools, workspace, approver)
    host = sock.getsockname()[0]
    app = server.streamable_http_app(streamable_http_path="/mcp", host=host)
    guarded = app if token is None else bearer(app, token)
    config = uvicorn.Config(
        guarded,
        log_level="warning",
        lifespan="on",
        limit_concurrency=MAX_CONNECTIONS,  # past it, 503 at once: no client holds them all
        timeout_keep_alive=5,
        h11_max_incomplete_event_size=HEADERS_MAX,
    )
    async with runtime:
        await uvicorn.Server(config).serve(sockets=[sock])


def bearer(app: Any, token: str) -> Any:
    """`app`, answering 401 to a request without `Authorization: Bearer <token>`."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, expected):
                body = b'{"error": "unauthorized: send Authorization: Bearer <the token>"}'
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b'Bearer realm="tether"'),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return guarded
