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
from collections.abc import AsyncIterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import orjson

from .approvals import Approver
from .errors import NoSuchRun
from .events import Event
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
        log = CLIENT_LOG.get()  # the client that asked for a log sees the run's events
        told = asyncio.create_task(log.follow(runtime.events(run.id))) if log else None
        try:
            result: RunResult = await run.wait()
            if told is not None:  # the last events, its end among them, before the answer
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(told), CANCEL_WAIT_S)
        except asyncio.CancelledError:  # the client cancelled its call: the run goes too
            runtime.cancel(run.id)  # (it went on: its bash made a file 11 s later)
            with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(run.wait()), CANCEL_WAIT_S)
            raise
        finally:
            if told is not None:
                told.cancel()
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

RUN_URI = "tether://runs/{run_id}"
"""The resource template of a run: reading `tether://runs/<id>` gives what `run_status` does."""

LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
"""MCP's log levels, least severe first (RFC 5424's)."""


def event_level(e: Event) -> str | None:
    """The log level a run's event goes to an MCP client at (None: not sent; token deltas
    are too many for a log)."""
    if e.type == "text_delta":
        return None
    if e.type in ("model_request", "model_response", "queued", "admitted"):
        return "debug"
    if e.type in ("approval_requested", "question_asked"):
        return "notice"  # a person is waited for
    if e.type == "run_finished":
        return {"done": "info", "failed": "error"}.get(e.data.get("outcome", ""), "warning")
    bad = e.type == "tool_result" and e.data.get("is_error")
    return "warning" if bad or e.type in ("retry", "run_crashed", "gave_up") else "info"


class ClientLog:
    """Where one MCP request's log messages go: the client that made it, at the levels it
    asked for. A 2026-07-28 client asks per request (`_meta`'s log level); an older one
    once per connection (`logging/setLevel`, kept in the connection's state). A client that
    asked for nothing is sent nothing. Logging is deprecated in MCP 2026-07-28 (SEP-2577):
    it is here for the clients that show it (the Inspector's log pane)."""

    def __init__(self, ctx: Any) -> None:
        from mcp.server.connection import allowed_log_levels
        from mcp_types.version import MODERN_PROTOCOL_VERSIONS

        self.ctx = ctx
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            self.levels: frozenset[str] = frozenset(
                allowed_log_levels(ctx.protocol_version, ctx.meta)
            )
        else:
            least = connection_state(ctx).get("log_level")
            self.levels = frozenset(LOG_LEVELS[LOG_LEVELS.index(least) :] if least else ())

    async def follow(self, events: AsyncIterator[Event]) -> None:
        """Send a run's events, each at its level, until the run ends."""
        async for e in events:
            level = event_level(e)
            if level in self.levels:
                await self.send(level, e.to_dict(), f"tether.run.{e.run_id}")

    async def send(self, level: Any, data: Any, logger: str) -> None:
        from mcp import types

        note = types.LoggingMessageNotification(
            params=types.LoggingMessageNotificationParams(level=level, data=data, logger=logger)
        )
        await self.ctx.session.send_notification(note, related_request_id=self.ctx.request_id)


def connection_state(ctx: Any) -> dict[str, Any]:
    """The SDK's per-connection scratch state (its lowlevel context reaches it only through
    the session's connection)."""
    state: dict[str, Any] = ctx.session._connection.state
    return state


CLIENT_LOG: ContextVar[ClientLog | None] = ContextVar("CLIENT_LOG", default=None)
"""The log of the MCP request a tool runs for: set by the server around each call."""


class TetherMCP:
    """The SDK's server for these tools, and for a `Supervisor`'s runs as resources
    (`tether://runs/<id>`, whose ids the client may complete)."""

    def __init__(
        self,
        tools: list[Tool],
        workspace: Path,
        approver: Approver,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.toolbox = Toolbox(tools)
        self.ctx = RunContext(run_id="mcp", workspace=workspace)
        self.approver, self.supervisor = approver, supervisor

    def server(self) -> Any:
        from mcp import types
        from mcp.server.lowlevel import Server

        server: Server[Any] = Server(
            "tether",
            version=__version__,
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
        )
        if self.supervisor is not None:
            runs = RunResources(self.supervisor)
            server.add_request_handler(
                "resources/list", types.PaginatedRequestParams, runs.list_resources
            )
            server.add_request_handler(
                "resources/templates/list", types.PaginatedRequestParams, runs.list_templates
            )
            server.add_request_handler(
                "resources/read", types.ReadResourceRequestParams, runs.read_resource
            )
            server.add_request_handler(
                "completion/complete", types.CompleteRequestParams, runs.complete
            )
        # registered, not passed: passing it warns that logging is deprecated, on stderr
        server.add_request_handler("logging/setLevel", types.SetLevelRequestParams, self.set_level)
        return server

    async def list_tools(self, context: Any, params: Any) -> Any:
        from mcp import types

        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=t.name,
                    description=t.description,
                    input_schema=t.parameters,
                    annotations=hints(t),
                )
                for t in self.toolbox.tools.values()
            ]
        )

    async def call_tool(self, context: Any, params: Any) -> Any:
        from mcp import types

        call = ToolCall(uuid.uuid4().hex[:12], params.name, dict(params.arguments or {}))
        token = CLIENT_LOG.set(ClientLog(context))
        try:
            result = await self.toolbox.run(call, self.ctx, self.approver)
        finally:
            CLIENT_LOG.reset(token)
        content: list[Any] = [types.TextContent(text=result.output)]
        content += [
            types.ImageContent(data=base64.b64encode(i.data).decode(), mime_type=i.media_type)
            for i in result.images
            if i.data is not None
        ]
        return types.CallToolResult(content=content, is_error=result.is_error)

    async def set_level(self, context: Any, params: Any) -> Any:
        from mcp import types

        connection_state(context)["log_level"] = params.level
        return types.EmptyResult()


class RunResources:
    """A `Supervisor`'s runs as MCP resources: `tether://runs/<id>` (the template), the most
    recent listed, a run's id completed from what the client has typed."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor

    async def list_resources(self, context: Any, params: Any) -> Any:
        from mcp import types

        page = await self.supervisor.overview.page(RunFilter(), None, RESOURCES_LISTED)
        return types.ListResourcesResult(
            resources=[
                types.Resource(
                    uri=RUN_URI.format(run_id=row["id"]),
                    name=row["id"],
                    title=f"{row.get('status')}: {str(row.get('task') or '')[:80]}",
                    mime_type="application/json",
                )
                for row in page.rows
            ]
        )

    async def list_templates(self, context: Any, params: Any) -> Any:
        from mcp import types

        template = types.ResourceTemplate(
            uri_template=RUN_URI,
            name="run",
            description="A Tether run: its status, usage, answer, and what waits for a person.",
            mime_type="application/json",
        )
        return types.ListResourceTemplatesResult(resource_templates=[template])

    async def read_resource(self, context: Any, params: Any) -> Any:
        from mcp import types
        from mcp.shared.exceptions import MCPError

        uri = str(params.uri)
        run_id = uri.removeprefix(RUN_URI.format(run_id=""))
        try:
            if run_id == uri or not run_id:
                raise NoSuchRun(f"no run at {uri!r}: a run is tether://runs/<id>")
            text = await self.supervisor.run_status(run_id)
        except NoSuchRun as e:
            raise MCPError(types.INVALID_PARAMS, str(e)) from None
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, mime_type="application/json", text=text)]
        )

    async def complete(self, context: Any, params: Any) -> Any:
        """The run ids that start with what the client has typed (the run template's only
        argument; anything else has no completions)."""
        from mcp import types

        ref, arg = params.ref, params.argument
        if getattr(ref, "uri", None) != RUN_URI or arg.name != "run_id":
            return types.CompleteResult(completion=types.Completion(values=[]))
        flt = RunFilter(text=arg.value) if arg.value else RunFilter()
        page = await self.supervisor.overview.page(flt, None, COMPLETIONS_READ)
        ids = [row["id"] for row in page.rows if row["id"].startswith(arg.value)]
        shown = ids[:COMPLETIONS_SHOWN]
        completion = types.Completion(values=shown, total=len(ids), has_more=len(ids) > len(shown))
        return types.CompleteResult(completion=completion)


RESOURCES_LISTED = 100
"""The most recent runs `resources/list` names (the others are read by their id)."""
COMPLETIONS_READ, COMPLETIONS_SHOWN = 1000, 100
"""Completions search the 1,000 most recent matching runs and offer 100 (MCP's most)."""


def hints(t: Tool) -> Any:
    """What a client may know of a tool before it calls it."""
    from mcp import types

    read_only = t.name in READ_ONLY
    return types.ToolAnnotations(
        read_only_hint=read_only, idempotent_hint=read_only or t.idempotent
    )


async def serve_stdio(
    runtime: Runtime,
    tools: list[Tool],
    workspace: Path,
    approver: Approver,
    supervisor: Supervisor | None = None,
) -> None:
    from mcp.server.stdio import stdio_server

    server = TetherMCP(tools, workspace, approver, supervisor).server()
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
    supervisor: Supervisor | None = None,
) -> None:
    """Streamable HTTP at /mcp on the bound `sock`, until the process is stopped."""
    import uvicorn

    server = TetherMCP(tools, workspace, approver, supervisor).server()
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
