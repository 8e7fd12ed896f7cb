"""Tether's MCP client under the MCP project's conformance suite (`scripts/mcp-conformance`).

    python client.py SERVER_URL

The suite starts a server for one scenario and runs this with its URL. This connects the way
`tether run --mcp URL` does (`tools.mcp.mcp_tools`), and a scripted model calls the first tool
the server lists, with arguments made from its schema (what a model would do), then answers.
Exit status: the run's (0 done).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from tether import Agent, ModelRequest, ScriptedModel, reply
from tether.tools.mcp import mcp_tools

PLAIN = {"number": 1, "integer": 1, "string": "x", "boolean": True}


def arguments(schema: dict[str, Any]) -> dict[str, Any]:
    """A value of the right kind for each required property (and each one with a type)."""
    props = schema.get("properties") or {}
    return {k: PLAIN.get(str(p.get("type")), "x") for k, p in props.items() if isinstance(p, dict)}


def first_tool(request: ModelRequest) -> Any:
    if not request.tools:
        return reply("The server has no tools.")
    spec = request.tools[0]
    return reply(tool_calls=[(spec.name, arguments(spec.parameters))])


async def main(url: str) -> int:
    async with mcp_tools([url], connect_timeout=20) as tools:
        model = ScriptedModel([first_tool, reply("Done.")])
        result = await Agent(model, tools).run("Use the server's tool.")
    for message in result.messages:
        for r in message.tool_results:
            print(f"{r.name}: {'error: ' if r.is_error else ''}{r.output[:200]}")
    print(result.outcome, result.reason)
    return result.exit_status


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[-1])))
