"""MCP client: the tools of MCP servers, used in a run like any other tool.

    async with mcp_tools(["python my_server.py", "http://127.0.0.1:9000/mcp"]) as tools:
        agent = Agent(model, [*tools, *other_tools])

A server is a command (spoken to over stdio) or a streamable HTTP URL. Its tools keep their
JSON schemas; calls get the same timeouts, error results and approvals as every other tool (an
MCP error result reaches the model as an error result). A result's text, text resources and
images reach the model; audio and binary resources are named in a note saying they were left
out, never dropped unsaid. What a server sends is bounded as a model server's replies are: a
server must list its tools within the connect time-out, each tool's input schema must be a
valid JSON Schema of an object (else one line naming the tool), and a result's text is kept
to its first and last `RESULT_KEEP` characters. Needs the `mcp` extra.

What a server sends is turned into Tether's values in `mcp_content`; which tools are offered,
under which names, and which wait for approval is `mcp_policy`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shlex
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from ..accounts import OverBudget
from ..errors import ConfigError, ProviderError, RunError
from ..messages import ModelRequest
from ..questions import Answer, Asker, Question, decline_all, problems
from .mcp_auth import AuthSettings, oauth
from .mcp_content import (
    RESULT_KEEP,
    MCPToolError,
    block_image,
    block_text,
    call_output,
    check_schema,
    sampled_message,
)
from .mcp_policy import MCPApproval, MCPNames, check_names, said_idempotent
from .tool import DEFAULT_TIMEOUT, RunContext, Tool

__all__ = [
    "RESULT_KEEP",
    "MCPApproval",
    "MCPNames",
    "MCPToolError",
    "block_image",
    "block_text",
    "mcp_tools",
]

MESSAGE_BYTES = 64 * 1024 * 1024
"""The largest message a remote server may send in one event of its stream (the SDK's own
bound, 1 MiB, failed a result of 1.5 MB: a file read, a page fetched)."""


@asynccontextmanager
async def mcp_tools(
    servers: list[str],
    *,
    tool_timeout: float = DEFAULT_TIMEOUT,
    approval: MCPApproval | str = "hints",
    names: MCPNames | None = None,
    connect_timeout: float = 30.0,
    auth: AuthSettings | None = None,
    token_dir: Path | None = None,
    asker: Asker = decline_all,
    sampling: bool = True,
) -> AsyncIterator[list[Tool]]:
    """Connect to each server, list its tools, and keep the connections open while in use.
    A server that has not listed its tools within `connect_timeout` seconds is an error (one
    that never answered hung `tether run` for ever). A remote server that asks for a sign-in
    gets one as `auth` says (see `mcp_auth`), its tokens kept in `token_dir` (or in memory).
    A server's question to the person behind a run (elicitation) goes to `asker`, as a
    `question_asked` event of the run whose call it came in; a call's progress is a
    `tool_progress` event. A server's sampling request is answered by the model of the run
    whose call it came in, on that run's budget (`sampling=False`: refused). Which calls
    wait for a person's approval is `approval`'s to say (`MCPApproval`; by default every
    tool its server does not mark read-only); which tools are offered, under which names, is
    `names`'s (`MCPNames`; by default all, as their servers name them)."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise ConfigError("--mcp needs the mcp extra: pip install 'tether-runtime[mcp]'") from None
    settings = auth or AuthSettings()
    rule = approval if isinstance(approval, MCPApproval) else MCPApproval.parse([approval])
    names = names or MCPNames()
    async with opened() as stack:
        tools: list[Tool] = []
        for spec in servers:
            server = Server(spec, asker)
            connection = await connect(stack, spec, server, settings, token_dir, sampling)
            try:
                # a sign-in at a browser is a person's time, bounded by its own time-out
                async with asyncio.timeout(connect_timeout + signing_in(spec, settings)):
                    client = await connection.started()
                    listed = await client.list_tools()
            except TimeoutError:
                raise ConfigError(
                    f"--mcp {spec!r}: the server did not list its tools within "
                    f"{connect_timeout:g} s (--connect-timeout)"
                ) from None
            except Exception as e:
                said = first_config_error(e)  # the sign-in's own words (a time-out, a refusal)
                if said is not None:
                    raise said from None
                failed = "the sign-in failed" if signing_in_failed(e) else "cannot reach the server"
                raise ConfigError(f"--mcp {spec!r}: {failed}: {why(e)}") from e
            known = (spec, *([client.server_info.name] if client.server_info else []))
            for t in listed.tools:
                name = names.offered(known, t)
                if name is None:
                    continue
                check_schema(spec, t.name, t.input_schema)
                tools.append(
                    Tool(
                        name,
                        t.description or "",
                        server.caller(connection, t.name),
                        None,
                        context_param=CONTEXT,
                        timeout=tool_timeout,
                        approval=rule.policy(known, t),
                        schema=t.input_schema,
                        idempotent=said_idempotent(t),
                        source=spec,
                    )
                )
        check_names(tools)
        yield tools


async def connect(
    stack: AsyncExitStack,
    spec: str,
    server: Server,
    auth: AuthSettings,
    token_dir: Path | None,
    sampling: bool,
) -> Connection:
    """The connection to the server `spec`, its task started (and stopped with `stack`)."""
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    connection = Connection()
    target: Callable[[], Any]
    if spec.startswith(("http://", "https://")):
        target = await remote(stack, spec, auth, token_dir, connection.said)
    else:
        argv = shlex.split(spec)
        if not argv:
            raise ConfigError("--mcp: an empty command")
        params = StdioServerParameters(command=argv[0], args=argv[1:])
        target = lambda: params  # noqa: E731
    connection.start(
        lambda: Client(
            target(),
            elicitation_callback=server.elicit,
            sampling_callback=server.sample if sampling else None,
        )
    )
    stack.push_async_callback(connection.close)
    return connection


class Connection:
    """One server's client, opened by a task of its own (the SDK's client belongs to the task
    that opened it), which opens it again when a remote server has forgotten our session: a
    server that restarted answers our session id with 404, and the spec says the client then
    starts a new session. The calls of the runs went on failing with "Session not found"."""

    def __init__(self) -> None:
        self.client: Any = None
        self.lost = False
        """Set when the server said 404 to a request that carried our session id."""
        self.wanted = asyncio.Event()
        self.opening: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.task: asyncio.Task[None] | None = None

    def start(self, open_client: Callable[[], Any]) -> None:
        """Open the first client (`open_client()` makes one) in the connection's own task."""
        self.task = asyncio.create_task(self.keep(open_client))

    async def started(self) -> Any:
        """The first client, or what failed to open it."""
        return await asyncio.shield(self.opening)

    async def reopen(self) -> Any:
        """A client of a new session (one reopening for all the calls that find it lost)."""
        if self.opening.done():
            self.opening = asyncio.get_running_loop().create_future()
            self.wanted.set()
        return await asyncio.shield(self.opening)

    async def keep(self, open_client: Callable[[], Any]) -> None:
        while True:
            try:
                async with open_client() as client:
                    self.client, self.lost = client, False
                    self.opening.set_result(client)
                    await self.wanted.wait()
                    self.wanted.clear()
            except Exception as e:  # told to whoever waits; the next call tries again
                if not self.opening.done():
                    self.opening.set_exception(e)
                    self.opening.exception()  # retrieved: a later call may never come
                self.client = None
                await self.wanted.wait()
                self.wanted.clear()

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        if self.opening.done() and not self.opening.cancelled():
            self.opening.exception()
        else:
            self.opening.cancel()

    async def call(self, name: str, arguments: dict[str, Any], report: Any) -> Any:
        """A tool call, made again once in a new session when the server had forgotten ours
        (it never ran the call: it did not know the session it came in)."""
        from mcp.shared.exceptions import MCPError

        client = self.client or await self.reopen()
        try:
            return await client.call_tool(name, arguments, progress_callback=report)
        except MCPError:
            if not self.lost:
                raise
        client = await self.reopen()
        return await client.call_tool(name, arguments, progress_callback=report)

    def said(self, response: Any) -> None:
        """An HTTP response of the server's: a 404 to our session id is a forgotten session."""
        if response.status_code == 404 and response.request.headers.get("mcp-session-id"):
            self.lost = True


async def remote(
    stack: AsyncExitStack,
    url: str,
    auth: AuthSettings,
    token_dir: Path | None,
    heard: Callable[[Any], None],
) -> Callable[[], Any]:
    """What makes a streamable HTTP transport to `url` (with OAuth when the server asks for
    it), each over the same HTTP client, whose every response `heard` is told of."""
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    http = await stack.enter_async_context(create_mcp_http_client(auth=oauth(url, auth, token_dir)))

    async def hook(response: Any) -> None:
        heard(response)

    http.event_hooks["response"].append(hook)
    return lambda: streamable_http_client(url, http_client=http, max_sse_event_size=MESSAGE_BYTES)


def signing_in(spec: str, auth: AuthSettings) -> float:
    """Extra connect time for a server that may send a person to a browser to sign in."""
    if spec.startswith(("http://", "https://")) and auth.grant == "authorization_code":
        return auth.sign_in_timeout
    return 0.0


@asynccontextmanager
async def opened() -> AsyncIterator[AsyncExitStack]:
    """The stack that holds the servers' connections. The SDK's clients run in task groups,
    which wrap what is raised inside them in exception groups: a ConfigError raised while
    the servers are set up is unwrapped, so it stays one line (it was a traceback)."""
    try:
        async with AsyncExitStack() as stack:
            yield stack
    except BaseExceptionGroup as group:
        found = first_config_error(group)
        if found is None:
            raise
        raise found from None


def first_config_error(e: BaseException) -> ConfigError | None:
    if isinstance(e, ConfigError):
        return e
    if isinstance(e, BaseExceptionGroup):
        for inner in e.exceptions:
            found = first_config_error(inner)
            if found is not None:
                return found
    return None


CONTEXT = "tether_run_context"
"""The keyword a remote tool's call is given its run's context by (not a property name an MCP
tool's schema would have)."""


class Server:
    """One MCP server's side of the runs that call it: each call's progress goes to the run
    that made it, and each question the server asks goes to that run's person."""

    def __init__(self, spec: str, asker: Asker) -> None:
        self.spec = spec
        self.asker = asker
        self.calling: dict[int, RunContext] = {}
        """The contexts of the calls in flight, by a number of each call's own."""
        self.count = 0
        self.asked: dict[tuple[str, str], int] = {}
        """How many questions each call in flight (run id, call id) has asked."""

    def caller(self, connection: Connection, name: str) -> Callable[..., Coroutine[Any, Any, Any]]:
        async def call(**arguments: Any) -> str | list[Any]:
            ctx: RunContext = arguments.pop(CONTEXT)
            self.count += 1
            key = self.count
            self.calling[key] = ctx
            try:
                result = await connection.call(name, arguments, progress(ctx))
            finally:
                del self.calling[key]
                self.asked.pop((ctx.run_id, ctx.call_id or ""), None)
            return call_output(result)

        return call

    def asking_run(self) -> RunContext | None:
        """The run a question is for: the one run calling this server now. (The MCP SDK
        hands a server's request to its own task, with nothing that names the call it
        belongs to; with calls of several runs in flight, the question names no run.)"""
        runs = {ctx.run_id: ctx for ctx in self.calling.values()}
        return next(iter(runs.values())) if len(runs) == 1 else None

    async def elicit(self, context: Any, params: Any) -> Any:
        """The SDK's elicitation callback: the question, to the person, as the run's events."""
        from mcp_types import ElicitResult

        ctx = self.asking_run()
        question = Question(
            message=str(params.message),
            schema=dict(getattr(params, "requested_schema", None) or {}),
            asker=self.spec,
            run_id=ctx.run_id if ctx else "",
            call_id=(ctx.call_id or "") if ctx else "",
            url=str(getattr(params, "url", None) or ""),
        )
        if ctx is not None and ctx.call_id:  # the n-th of the call's: the same id when the
            call = (ctx.run_id, ctx.call_id)  # call is made again after a restart
            self.asked[call] = self.asked.get(call, 0) + 1
            question = dataclasses.replace(question, id=f"q_{ctx.call_id}_{self.asked[call]}")
        emitter = ctx.emitter if ctx else None
        if emitter is not None:
            emitter.question_asked(**question.to_dict())
        time = ctx.time if ctx is not None else None
        with time.person() if time is not None else contextlib.nullcontext():  # a person's time
            answer = await self.asker(question)  # is not the tool's
        if answer.action == "accept" and not question.url:
            wrong = problems(question, answer.content or {})
            if wrong:  # an asker's mistake is not the server's to receive
                answer = Answer("decline", reason=f"the answer did not fit the question: {wrong}")
        if emitter is not None:
            emitter.question_answered(
                question_id=question.id,
                action=answer.action,
                reason=answer.reason,
            )
        content = answer.content if answer.action == "accept" and not question.url else None
        return ElicitResult(action=answer.action, content=content)

    async def sample(self, context: Any, params: Any) -> Any:
        """The SDK's sampling callback: the run's own model answers the server's request, its
        usage the run's (it travels with the call's result: `RunContext.spent`)."""
        from mcp_types import INTERNAL_ERROR, INVALID_REQUEST, CreateMessageResult, ErrorData
        from mcp_types import TextContent as Text

        ctx = self.asking_run()
        if ctx is None or ctx.model is None:
            return ErrorData(code=INVALID_REQUEST, message="no run of this client is calling "
                             "a tool of this server now: nothing to sample")  # fmt: skip
        request = ModelRequest(
            tuple(sampled_message(m) for m in params.messages),
            system=params.system_prompt,
            max_output_tokens=params.max_tokens,
        )
        try:
            response = await ctx.model.respond(request)
        except ProviderError as e:
            return ErrorData(code=INTERNAL_ERROR, message=f"the run's model failed: {e}")
        except OverBudget as e:  # the run's, its tree's or its account's limit: not made
            return ErrorData(code=INVALID_REQUEST, message=f"over the run's budget: {e.reason}")
        if ctx.spent is not None:
            ctx.spent.append(response.usage)
        text = response.message.text
        if ctx.emitter is not None:
            ctx.emitter.sampled(
                id=ctx.call_id,
                asker=self.spec,
                messages=len(request.messages),
                text=text,
                usage=response.usage.to_dict(),
            )
        stop = {"max_tokens": "maxTokens", "tool_use": "toolUse"}.get(response.stop_reason)
        return CreateMessageResult(
            role="assistant",
            content=Text(type="text", text=text),
            model=response.model or ctx.model.name,
            stop_reason=stop or "endTurn",
        )


def progress(ctx: RunContext) -> Callable[[float, float | None, str | None], Any]:
    async def report(done: float, total: float | None, message: str | None) -> None:
        if ctx.emitter is not None:
            ctx.emitter.tool_progress(id=ctx.call_id, progress=done, total=total, message=message)

    return report


def signing_in_failed(e: BaseException) -> bool:
    """Whether the SDK's OAuth client raised `e` (or what is inside it)."""
    from mcp.client.auth import OAuthFlowError

    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return isinstance(e, OAuthFlowError) or isinstance(e.__cause__, OAuthFlowError)


def why(e: BaseException) -> str:
    """The cause itself, not the task group that carried it ("unhandled errors in a
    TaskGroup" says nothing)."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    text = " ".join((str(e) or type(e).__name__).split())  # one line, whatever it said
    cause = e.__cause__ or e.__context__
    if cause is not None and str(cause) and str(cause) not in text:
        text += f" ({why(cause)})"
    return text if len(text) <= 300 else text[:299] + "…"


class MCPHolder:
    """The MCP servers' tools a runtime has connected: each list of servers (with its
    settings) connected once, kept open by a task of the runtime's (`spawn`; a connection
    belongs to the task that opened it, and a run's task ends) until the runtime closes."""

    def __init__(self, spawn: Callable[[Coroutine[Any, Any, Any]], Any]) -> None:
        self.spawn = spawn
        self.held: dict[str, asyncio.Future[list[Tool]]] = {}

    async def tools(
        self, servers: list[str], connect_timeout: float, **settings: Any
    ) -> list[Tool]:
        """The servers' tools (`mcp_tools`'s `settings`), connecting them the first time."""
        key = "\n".join([*servers, *(repr(settings[k]) for k in sorted(settings) if k != "asker")])
        if key not in self.held:
            found: asyncio.Future[list[Tool]] = asyncio.get_running_loop().create_future()
            self.held[key] = found

            async def hold() -> None:
                try:
                    async with mcp_tools(
                        servers, connect_timeout=connect_timeout, **settings
                    ) as tools:
                        found.set_result(tools)
                        await asyncio.Event().wait()
                except Exception as e:  # reported to whoever waits for the tools
                    if not found.done():
                        found.set_exception(e)
                        del self.held[key]

            self.spawn(hold())
        return await asyncio.shield(self.held[key])

    def close(self) -> None:
        """Tell whoever still waits for servers that connect that they never will."""
        for held in self.held.values():
            if not held.done():
                closed = "the runtime closed before the MCP servers' tools were listed"
                held.set_exception(RunError(closed))
                held.exception()  # retrieved: nobody may be waiting
        self.held.clear()
