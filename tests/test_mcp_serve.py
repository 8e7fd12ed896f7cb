"""`tether mcp-serve` as MCP clients use it beyond its tools: the run's events as log messages
to a client that asks for them (per request on MCP 2026-07-28, by `logging/setLevel` before),
and runs as resources whose ids the client completes. Real processes, the SDK's client."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import cli_env
from wire_server import WireServer

pytest.importorskip("mcp", reason="needs the mcp extra")


def serve(wire: WireServer, workspace: Path) -> Any:
    from mcp.client.stdio import StdioServerParameters

    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "tether", "mcp-serve", "--base-url", wire.url, "--tools", "read_file",
              "--workspace", str(workspace)],
        env=cli_env(OPENAI_API_KEY="k"),
    )  # fmt: skip


def script_note_run(wire: WireServer, workspace: Path) -> None:
    (workspace / "notes.txt").write_text("remember the milk")
    wire.add(calls=[("read_file", {"path": "notes.txt"})]).add(text="The note says: milk.")


async def test_a_client_that_asks_for_a_log_sees_the_agents_run_at_its_level(
    tmp_path: Path, wire: WireServer
) -> None:
    """A 2026-07-28 client asks per request (`log_level`): at `info` it is told of the tool
    call and the run's end, not of each model request (`debug`); a client that asks nothing
    is sent nothing."""
    from mcp import Client

    got: list[Any] = []

    async def logged(params: Any) -> None:
        got.append(params)

    script_note_run(wire, tmp_path)
    async with Client(serve(wire, tmp_path), logging_callback=logged, log_level="info") as c:
        answer = await c.call_tool("run_agent", {"task": "What does my note say?"})
        assert answer.content[0].text == "The note says: milk."
    types = [p.data["type"] for p in got]
    assert types[0] == "run_started" and types[-1] == "run_finished", types
    assert "tool_call" in types and "model_request" not in types
    call = got[types.index("tool_call")]
    assert call.level == "info" and call.data["name"] == "read_file"
    assert call.logger == f"tether.run.{call.data['run_id']}"

    got.clear()
    script_note_run(wire, tmp_path)
    async with Client(serve(wire, tmp_path), logging_callback=logged) as c:
        answer = await c.call_tool("run_agent", {"task": "What does my note say?"})
        assert answer.content[0].text == "The note says: milk."
    assert got == []


@pytest.mark.filterwarnings("ignore:The logging capability is deprecated")
async def test_an_older_client_sets_its_level_once_for_the_connection(
    tmp_path: Path, wire: WireServer
) -> None:
    """A client of the handshake era: nothing before `logging/setLevel`, everything at or
    above the level after it (here `debug`: the model requests too)."""
    from mcp import Client

    got: list[Any] = []

    async def logged(params: Any) -> None:
        got.append(params)

    async with Client(serve(wire, tmp_path), mode="legacy", logging_callback=logged) as c:
        assert c.protocol_version < "2026"
        script_note_run(wire, tmp_path)
        await c.call_tool("run_agent", {"task": "What does my note say?"})
        assert got == []
        await c.set_logging_level("debug")
        script_note_run(wire, tmp_path)
        await c.call_tool("run_agent", {"task": "What does my note say?"})
    levels = {p.data["type"]: p.level for p in got}
    assert levels["model_request"] == "debug" and levels["run_finished"] == "info"


async def test_runs_are_resources_and_their_ids_complete(tmp_path: Path, wire: WireServer) -> None:
    """After a run, `tether://runs/<id>` is listed and reads as `run_status` does; the
    template's `run_id` completes from a prefix; an unknown run is an error that says so."""
    from mcp import Client
    from mcp.shared.exceptions import MCPError
    from mcp.types import ResourceTemplateReference

    script_note_run(wire, tmp_path)
    async with Client(serve(wire, tmp_path)) as c:
        started = await c.call_tool("start_run", {"task": "What does my note say?"})
        run_id = json.loads(started.content[0].text)["run_id"]
        await c.call_tool("run_events", {"run_id": run_id, "wait": 10})
        (template,) = (await c.list_resource_templates()).resource_templates
        assert template.uri_template == "tether://runs/{run_id}"
        listed = [str(r.uri) for r in (await c.list_resources()).resources]
        assert listed == [f"tether://runs/{run_id}"]
        read = await c.read_resource(f"tether://runs/{run_id}")
        status = json.loads(read.contents[0].text)
        assert status["status"] == "done" and status["answer"] == "The note says: milk."
        ref = ResourceTemplateReference(uri=template.uri_template)
        done = await c.complete(ref, {"name": "run_id", "value": run_id[:3]})
        assert done.completion.values == [run_id]
        none = await c.complete(ref, {"name": "run_id", "value": "zz-no-such"})
        assert none.completion.values == []
        with pytest.raises(MCPError, match="no run 'nope'"):
            await c.read_resource("tether://runs/nope")
