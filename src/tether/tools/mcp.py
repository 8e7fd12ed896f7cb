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
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import fnmatch
import re
import shlex
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..accounts import OverBudget
from ..approvals import Policy
from ..errors import ConfigError, ProviderError
from ..messages import ImagePart, Message, ModelRequest, TextPart, image_type
from ..questions import Answer, Asker, Question, decline_all, problems
from .mcp_auth import AuthSettings, oauth
from .tool import DEFAULT_TIMEOUT, RunContext, Tool

RESULT_KEEP = 100_000
"""Characters of a result's text kept at its head, and as many at its tail."""
MESSAGE_BYTES = 64 * 1024 * 1024
"""The largest message a remote server may send in one event of its stream (the SDK's own
bound, 1 MiB, failed a result of 1.5 MB: a file read, a page fetched)."""


class MCPToolError(Exception):
    """The server answered the call with an error result."""


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


APPROVALS = ("hints", "always", "never")


@dataclass(frozen=True)
class MCPApproval:
    """Which MCP tools' calls wait for a person's approval, under the run's approval policy as
    bash's do (`--approve ask|auto|deny`). `default`: `hints` (the default) asks for every tool
    its server does not mark read-only (`readOnlyHint`; MCP's `destructiveHint` defaults to
    true), `always` for all, `never` for none. `tools`: a rule per tool, by its name
    (`write_file`) or by its server and name (`SERVER#write_file`, the server as `--mcp` gave
    it), which wins. Tools were built with approval "never": server-filesystem's `write_file`
    and `move_file`, marked destructive, ran under `--approve deny`."""

    default: str = "hints"
    tools: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, rules: list[str]) -> MCPApproval:
        """From `--mcp-approve` values: `hints`, `always`, `never`, or `[SERVER#]TOOL=RULE`;
        a bad one is a ConfigError that names it."""
        default, tools = "hints", {}
        for rule in rules:
            name, eq, value = rule.rpartition("=")
            value = value.strip()
            if value not in APPROVALS or (eq and not name.strip()):
                raise ConfigError(
                    f"--mcp-approve {rule!r}: give hints, always or never, or "
                    "TOOL=RULE (SERVER#TOOL=RULE for one server's)"
                )
            if eq:
                tools[name.strip()] = value
            else:
                default = value
        return cls(default, tools)

    def policy(self, server: tuple[str, ...], listed: Any) -> Policy:
        """The approval policy of the server's tool `listed` (the server known by any of the
        names in `server`: its `--mcp` text, the name it gives itself)."""
        found = [self.tools.get(f"{name}#{listed.name}") for name in server]
        rule = next(filter(None, found), None) or self.tools.get(listed.name) or self.default
        if rule == "hints":
            hints = getattr(listed, "annotations", None)
            return "never" if hints is not None and hints.read_only_hint is True else "always"
        return "always" if rule == "always" else "never"


PREFIX = re.compile(r"[A-Za-z0-9_-]{1,32}")


@dataclass(frozen=True)
class MCPNames:
    """Which tools of the MCP servers a run is offered, and under which names. A server is
    named as `--mcp` gives it or by the name it gives itself (server-filesystem's is
    `secure-filesystem-server`). `prefixes`: a server's tools are offered as `PREFIX_TOOL`;
    `only`: when given, only the tools that match one of these `[SERVER#]TOOL` patterns are
    offered (TOOL may be a shell pattern: `read_*`); `skip`: tools left out, the same way. A
    tool that needs MCP tasks (`taskSupport: required`) is never offered: Tether calls tools
    without them. Two tools of one name (of two servers, or of a server and the run's own)
    were an error that only dropping a server mended."""

    prefixes: dict[str, str] = field(default_factory=dict)
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()

    @classmethod
    def parse(cls, prefixes: list[str], only: list[str], skip: list[str]) -> MCPNames:
        """From `--mcp-prefix SERVER=PREFIX`, `--mcp-tools` and `--mcp-skip` values; a bad
        one is a ConfigError that names it."""
        found = {}
        for given in prefixes:
            server, eq, prefix = given.rpartition("=")
            if not eq or not server.strip() or not PREFIX.fullmatch(prefix.strip()):
                raise ConfigError(
                    f"--mcp-prefix {given!r}: give SERVER=PREFIX, the server as --mcp gives it "
                    "or by its own name, the prefix of letters, digits, _ and - (at most 32)"
                )
            found[server.strip()] = prefix.strip()
        for flag, patterns in (("--mcp-tools", only), ("--mcp-skip", skip)):
            for pattern in patterns:
                if not pattern.rpartition("#")[2].strip():
                    raise ConfigError(f"{flag} {pattern!r}: give TOOL or SERVER#TOOL")
        return cls(found, tuple(only), tuple(skip))

    def offered(self, server: tuple[str, ...], listed: Any) -> str | None:
        """The name the server's tool `listed` is offered under, or None: not offered."""
        execution = getattr(listed, "execution", None)
        if execution is not None and execution.task_support == "required":
            return None
        if self.only and not self.matches(self.only, server, listed.name):
            return None
        if self.matches(self.skip, server, listed.name):
            return None
        prefix = next((self.prefixes[n] for n in server if n in self.prefixes), "")
        return f"{prefix}_{listed.name}" if prefix else str(listed.name)

    @staticmethod
    def matches(patterns: tuple[str, ...], server: tuple[str, ...], tool: str) -> bool:
        for pattern in patterns:
            named, hash_, tools = pattern.rpartition("#")
            if (not hash_ or named in server) and fnmatch.fnmatchcase(tool, tools):
                return True
        return False


def check_names(tools: list[Tool]) -> None:
    """Two servers' tools of one name are a ConfigError that says how to tell them apart."""
    seen: dict[str, Tool] = {}
    for t in tools:
        other = seen.setdefault(t.name, t)
        if other is not t:
            raise ConfigError(
                f"--mcp: the servers {other.source!r} and {t.source!r} both have a tool named "
                f"{t.name!r}: offer one's tools under a prefix (--mcp-prefix "
                f"'{t.source}=PREFIX') or leave one out (--mcp-skip '{t.source}#{t.name}')"
            )


def said_idempotent(listed: Any) -> bool:
    """Whether the server says a tool may be called again with no further effect (MCP's
    `idempotentHint`, or `readOnlyHint`): a durable run makes such a call again when a crash
    interrupted it, where another is reported as of unknown outcome."""
    hints = getattr(listed, "annotations", None)
    return bool(hints and (hints.idempotent_hint or hints.read_only_hint))


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
            emitter.emit("question_asked", **question.to_dict())
        time = ctx.time if ctx is not None else None
        with time.person() if time is not None else contextlib.nullcontext():  # a person's time
            answer = await self.asker(question)  # is not the tool's
        if answer.action == "accept" and not question.url:
            wrong = problems(question, answer.content or {})
            if wrong:  # an asker's mistake is not the server's to receive
                answer = Answer("decline", reason=f"the answer did not fit the question: {wrong}")
        if emitter is not None:
            emitter.emit(
                "question_answered",
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
            ctx.emitter.emit(
                "sampled",
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


def sampled_message(m: Any) -> Message:
    """A message of a sampling request as a message of ours: its text and images (anything
    else is named in a note, never dropped unsaid)."""
    blocks = m.content if isinstance(m.content, list) else [m.content]
    parts: list[Any] = []
    for block in blocks:
        image = block_image(block) if m.role == "user" else None
        parts.append(image if image is not None else TextPart(block_text(block)))
    return Message("assistant" if m.role == "assistant" else "user", tuple(parts))


def progress(ctx: RunContext) -> Callable[[float, float | None, str | None], Any]:
    async def report(done: float, total: float | None, message: str | None) -> None:
        if ctx.emitter is not None:
            ctx.emitter.emit(
                "tool_progress", id=ctx.call_id, progress=done, total=total, message=message
            )

    return report


def call_output(result: Any) -> str | list[Any]:
    """A call's result as a tool's output: text, with its images beside it."""
    images: list[ImagePart] = []
    texts: list[str] = []
    for block in result.content:  # an image is shown as one, anything else as text
        image = block_image(block)
        if image is not None:
            images.append(image)
        else:
            texts.append(block_text(block))
    text = "\n".join(filter(None, texts))
    if not text and not images and result.structured_content is not None:
        # the result's JSON when its content says nothing; an image's structured copy is
        # the image again, in base64 (an image-only result went twice: 200 k characters)
        text = orjson.dumps(result.structured_content).decode()
    text = kept(text)
    if result.is_error:
        raise MCPToolError(text or "the MCP server reported an error")
    return [text, *images] if images else text


def kept(text: str) -> str:
    """A result's text, its middle cut when it is longer than twice `RESULT_KEEP`."""
    if len(text) <= 2 * RESULT_KEEP:
        return text
    cut = len(text) - 2 * RESULT_KEEP
    return (
        f"{text[:RESULT_KEEP]}\n[... {cut} characters of the result cut ...]\n{text[-RESULT_KEEP:]}"
    )


def check_schema(spec: str, name: str, schema: Any) -> None:
    """A tool's input schema must be a JSON Schema of an object: the model is sent it, and
    calls are checked against it (a bad one was a traceback when the agent was built)."""
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    why_not = ""
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        why_not = "it is not a schema of an object"
    else:
        try:
            validator_for(schema).check_schema(schema)
        except SchemaError as e:
            why_not = e.message
    if why_not:
        raise ConfigError(f"--mcp {spec!r}: tool {name!r} has an invalid input schema: {why_not}")


def block_image(block: Any) -> ImagePart | None:
    """An image content block as an image the model is shown (see `tool.tool_output`), its
    media type read from its bytes: a server's own word for it (any `mimeType`, an SVG, HTML)
    went to the model and the page as it was; what is not a PNG, JPEG, GIF or WebP image is
    left out, said so."""
    if getattr(block, "type", "") != "image":
        return None
    try:
        data = base64.b64decode(block.data, validate=True)
        return ImagePart(image_type(data), data)
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
