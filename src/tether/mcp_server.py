"""`tether mcp-serve`: Tether's tools, and a Tether agent as one more tool, for MCP clients.

Over stdio, or streamable HTTP on 127.0.0.1 (`--http`). Each tool keeps its schema, timeout and
error results, and its images go as images; `run_agent` runs the configured agent (model,
tools, budgets from the command line) on a task and returns its answer. Tool calls that need
approval are denied here (an MCP client has no way to be asked) unless started with
`--approve auto`.

With the agent come the supervisor's tools, so that an MCP client runs agents as the page
does: `start_run` (returns at once; under `--approve ask`, the default, its calls that need
approval wait for `decide_call`), `list_runs`, `run_status` (with what waits for a person),
`run_events` (a page of the run's events at a time), `decide_call`, `answer_question` and
`cancel_run`.

Over HTTP the server is guarded as the page is: every request carries the bearer token (a new
one is printed at start; `--no-token` for a local client that cannot send one), and a Host or
Origin header that is not this machine's is refused, so a web page the user visits cannot reach
it by DNS rebinding (the SDK's check, on for a loopback address).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import socket
import uuid
from pathlib import Path
from typing import Any

import orjson

from .approvals import Approver
from .errors import NoSuchRun
from .messages import ToolCall
from .options import CLI_AGENT
from .overview import Overview, act
from .questions import Action
from .result import RunResult
from .run_filter import RunFilter
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


EVENTS_PER_CALL = 200
"""The most events one `run_events` call returns (a run's token deltas are left out)."""


class Supervisor:
    """The tools an MCP client supervises runs with, as the page does: start, list, read,
    decide, answer, cancel. Runs start with `approver` (None: their calls that need approval
    wait for `decide_call`). Each answers in JSON; a run that is not there is an error result
    that says so."""

    def __init__(
        self,
        runtime: Runtime,
        options: dict[str, Any],
        workspace: Path,
        approver: Approver | None,
    ) -> None:
        self.runtime, self.options = runtime, options
        self.workspace, self.approver = workspace, approver
        self.overview = Overview(runtime)

    def tools(self) -> list[Tool]:
        methods = (
            self.start_run, self.list_runs, self.run_status, self.run_events,
            self.decide_call, self.answer_question, self.cancel_run,
        )  # fmt: skip
        return [tool(name=m.__name__)(m) for m in methods]

    async def start_run(self, task: str) -> str:
        """Start a Tether agent on a task and return its run id at once (follow it with
        run_status and run_events).

        Args:
            task: What the agent should do, in plain words.
        """
        run = await self.runtime.start(
            CLI_AGENT, task, options=self.options, context=RunContext(workspace=self.workspace),
            approver=self.approver,
        )  # fmt: skip
        return dumps({"run_id": run.id, "status": run.status})

    async def list_runs(self, state: str = "", limit: int = 20) -> str:
        """The most recent runs: id, task, status, steps, cost and answer of each.

        Args:
            state: Only the runs in this state (queued, running, waiting, done, failed, ...).
            limit: How many runs, at most 100.
        """
        flt = RunFilter(states=frozenset({state})) if state else RunFilter()
        page = await self.overview.page(flt, None, max(1, min(limit, 100)))
        keys = ("id", "task", "status", "steps", "cost_usd", "answer")
        return dumps([{k: row.get(k) for k in keys} for row in page.rows])

    async def run_status(self, run_id: str) -> str:
        """One run's status, usage and answer, with the calls that wait for approval and the
        questions that wait for an answer.

        Args:
            run_id: The run's id.
        """
        found = await self.overview.describe(run_id)
        if found is None:
            raise NoSuchRun(f"no run {run_id!r}")
        found.pop("transcript", None)  # its events tell it, a page at a time
        return dumps(found)

    async def run_events(self, run_id: str, after: int = 0, wait: float = 0.0) -> str:
        """The run's events from number `after` on, at most 200: what it asked the model,
        its tool calls and results, approvals, its end. `next` is where the next call starts.

        Args:
            run_id: The run's id.
            after: The number of events already read (0: from the start).
            wait: Seconds to wait for an event when none is new (at most 30).
        """
        events = self.runtime.events(run_id, after)
        found: list[dict[str, Any]] = []
        seen = after
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.05, min(wait, 30.0))) as limit:
                async for e in events:
                    seen = e.seq + 1
                    if e.type != "model_delta":
                        found.append(e.to_dict())
                    if len(found) >= EVENTS_PER_CALL or e.type == "run_finished":
                        break
                    limit.reschedule(asyncio.get_running_loop().time() + 0.05)
        ended = bool(found) and found[-1]["type"] == "run_finished"
        return dumps({"events": found, "next": seen, "ended": ended})

    async def decide_call(
        self, run_id: str, approval_id: str, approve: bool, args_hash: str = "", reason: str = ""
    ) -> str:
        """Approve or deny a call that waits for a person (run_status lists them).

        Args:
            run_id: The run's id.
            approval_id: The waiting call's approval id.
            approve: True to let it run, false to refuse it.
            args_hash: The args_hash run_status showed: the call is approved only for those
                arguments.
            reason: Why, told to the model when the call is denied.
        """
        run = await asyncio.to_thread(self.runtime.get, run_id)
        if approve:
            said = reason or "approved by an MCP client"
            await act(run, lambda: run.approve(approval_id, args_hash or None, said))
        else:
            await act(run, lambda: run.deny(approval_id, reason or "denied by an MCP client"))
        return dumps({"run_id": run_id, "approval_id": approval_id, "approved": approve})

    async def answer_question(
        self,
        run_id: str,
        question_id: str,
        answer: dict[str, Any] | None = None,
        decline: bool = False,
    ) -> str:
        """Answer a question a run's tool asked (run_status lists them, with the fields each
        wants), or decline it.

        Args:
            run_id: The run's id.
            question_id: The question's id.
            answer: The fields the question asked for, as a JSON object.
            decline: True to refuse to answer.
        """
        action: Action = "decline" if decline else "accept"
        await self.runtime.answer(
            run_id, question_id, None if decline else answer or {}, action=action
        )
        return dumps({"run_id": run_id, "question_id": question_id, "action": action})

    async def cancel_run(self, run_id: str) -> str:
        """Stop a run now, with its tool calls' processes.

        Args:
            run_id: The run's id.
        """
        run = await asyncio.to_thread(self.runtime.get, run_id)
        cancelled = await act(run, run.cancel)
        return dumps({"run_id": run_id, "cancelled": bool(cancelled)})


def dumps(value: Any) -> str:
    return orjson.dumps(value, default=str).decode()


READ_ONLY = {"read_file", "list_files", "list_runs", "run_status", "run_events"}
"""The tools that change nothing (an MCP client may call them unasked: `readOnlyHint`)."""


def mcp_server(tools: list[Tool], workspace: Path, approver: Approver) -> Any:
    """The SDK's server for these tools."""
    from mcp import types
    from mcp.server.lowlevel import Server

    toolbox = Toolbox(tools)
    ctx = RunContext(run_id="mcp", workspace=workspace)

    async def list_tools(context: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=t.name,
                    description=t.description,
                    input_schema=t.parameters,
                    annotations=hints(t),
                )
                for t in toolbox.tools.values()
            ]
        )

    async def call_tool(context: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        call = ToolCall(uuid.uuid4().hex[:12], params.name, dict(params.arguments or {}))
        result = await toolbox.run(call, ctx, approver)
        content: list[Any] = [types.TextContent(text=result.output)]
        content += [
            types.ImageContent(data=base64.b64encode(i.data).decode(), mime_type=i.media_type)
            for i in result.images
            if i.data is not None
        ]
        return types.CallToolResult(content=content, is_error=result.is_error)

    def hints(t: Tool) -> types.ToolAnnotations:
        """What a client may know of a tool before it calls it."""
        read_only = t.name in READ_ONLY
        return types.ToolAnnotations(
            read_only_hint=read_only,
            idempotent_hint=read_only or t.idempotent,
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
