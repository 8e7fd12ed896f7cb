"""Tether's MCP client under the MCP project's conformance suite (`scripts/mcp-conformance`).

    python client.py SERVER_URL

The suite starts a server for one scenario and runs this with its URL. This connects the way
`tether run --mcp URL` does (`tools.mcp.mcp_tools`), and a scripted model calls the first tool
the server lists, with arguments made from its schema (what a model would do), then answers.
Exit status: the run's (0 done).

A scenario's context (`MCP_CONFORMANCE_CONTEXT`: pre-registered credentials) is written to a
file and read as `--mcp-auth FILE` is; a sign-in opens `browser.py` as the user's browser.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from tether import Agent, ModelRequest, ScriptedModel, reply
from tether.approvals import approve_all
from tether.questions import answer_defaults
from tether.tools.mcp import mcp_tools
from tether.tools.mcp_auth import AuthSettings

AUTH_FIELDS = ("client_id", "client_secret")
"""What a scenario's context holds that a user's --mcp-auth file would."""
METADATA_URL = "https://conformance-test.local/client-metadata.json"
"""Where the suite takes this client's metadata document to be (it fetches none): used as
its id by an authorization server that accepts such ids, as a user's own would be."""

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


def auth_settings(folder: Path) -> AuthSettings:
    """The scenario's credentials as a user's --mcp-auth file, with the client-credentials
    grant for the scenarios that test it."""
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    settings = {k: context[k] for k in AUTH_FIELDS if k in context}
    if "client-credentials" in os.environ.get("MCP_CONFORMANCE_SCENARIO", ""):
        settings["grant"] = "client_credentials"
    if "private_key_pem" in context:  # a key that signs the client's assertions
        (folder / "client.pem").write_text(context["private_key_pem"])
        settings["private_key_file"] = "client.pem"  # beside the settings file
        settings["signing_algorithm"] = context.get("signing_algorithm", "RS256")
    else:
        settings["client_metadata_url"] = METADATA_URL
    path = folder / "auth.json"
    path.write_text(json.dumps(settings))
    return AuthSettings.load(path)


async def main(url: str) -> int:
    os.environ["BROWSER"] = f"{sys.executable} {Path(__file__).with_name('browser.py')} %s"
    with tempfile.TemporaryDirectory() as folder:
        return await run(url, auth_settings(Path(folder)))


async def run(url: str, auth: AuthSettings) -> int:
    # as `--approve auto` does: a question whose fields all have defaults gets them
    async with mcp_tools([url], connect_timeout=20, auth=auth, asker=answer_defaults) as tools:
        model = ScriptedModel([first_tool, reply("Done.")])
        result = await Agent(model, tools).run("Use the server's tool.", approver=approve_all)
    for message in result.messages:
        for r in message.tool_results:
            print(f"{r.name}: {'error: ' if r.is_error else ''}{r.output[:200]}")
    print(result.outcome, result.reason)
    return result.exit_status


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[-1])))
