"""`tether mcp-serve`: Tether's tools, and a Tether agent as one more tool, for MCP clients.

Over stdio. Each tool keeps its schema, timeout and error results; `run_agent` runs the configured
agent (model, tools, budgets from the command line) on a task and returns its answer. Tool calls
that need approval are denied here (an MCP client has no way to be asked) unless started with
`--approve auto`.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from .agent import RunResult
from .approvals import Approver
from .messages import ToolCall
from .options import CLI_AGENT
from .runtime import Runtime
from .tools.tool import RunContext, Tool, tool
from .tools.toolbox import Toolbox


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
        result: RunResult | None = await run.wait()
        if result is None:
            raise RuntimeError("the agent run did not start")
        if result.outcome != "done":
            raise RuntimeError(f"the agent run {result.outcome}: {result.reason}")
        return result.answer

    return run_agent


async def serve_stdio(
    runtime: Runtime, tools: list[Tool], workspace: Path, approver: Approver
) -> None:
    from mcp import types
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server

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
        "tether", version="0.1.0", on_list_tools=list_tools, on_call_tool=call_tool
    )
    async with runtime, stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())
