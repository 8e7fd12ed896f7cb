"""Tools described once: a typed Python function becomes a schema for the model and a validated
call for us.

    @tool
    def get_weather(city: str, ctx: RunContext) -> str:
        '''Current weather for a city.

        Args:
            city: The city name, e.g. "Oslo".
        '''

The schema comes from the signature (pydantic v2) and the docstring's `Args:` section. A parameter
annotated `RunContext` is filled by the run, is absent from the schema and can never be set by the
model. Sync functions run on a thread pool so a blocking tool never blocks other runs or tools.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import re
import typing
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast, overload

import pydantic
import pydantic_core

from ..accounts import Accounts
from ..approvals import Policy
from ..deadlines import Limit
from ..events import Emitter, Sink
from ..messages import ImagePart, ToolSpec, Usage
from ..rates import Rates
from ..tree import Allowance

DEFAULT_TIMEOUT = 60.0

_POOL = ThreadPoolExecutor(max_workers=64, thread_name_prefix="tether-tool")


class CallTime:
    """A call's time limit, stopped while the call waits for a person: an MCP server's
    question (elicitation) is a person's time, as an approval is, not the tool's (a question
    asked under a 60 s tool time-out was cut off while its person read it). Set by the
    toolbox for each call of a tool that takes its run's context."""

    def __init__(self) -> None:
        self.limit: Limit | None = None
        self.waiting = 0
        self.left = 0.0

    @contextmanager
    def person(self) -> Iterator[None]:
        """While in here, the call's time limit does not run; after, it has what it had."""
        limit = self.limit
        if limit is None or limit.expired() or (self.waiting == 0 and limit.when() is None):
            yield
            return
        loop = asyncio.get_running_loop()
        if self.waiting == 0:
            self.left = max(0.0, (limit.when() or 0.0) - loop.time())
            limit.reschedule(None)
        self.waiting += 1
        try:
            yield
        finally:
            self.waiting -= 1
            if self.waiting == 0 and not limit.expired():
                limit.reschedule(loop.time() + self.left)


def current_dir() -> Path:
    """The process's current directory, the default workspace of a run: one `Path` while the
    directory stays the same (`Path.cwd()` made one for each run, 2 µs and an object kept as
    long as the run is)."""
    return path_of(os.getcwd())


@functools.lru_cache(maxsize=1)
def path_of(directory: str) -> Path:
    return Path(directory)


@dataclass
class RunContext:
    """What a run gives its tools. Scope (workspace, account) comes from here, never from
    the model's arguments."""

    run_id: str = ""
    workspace: Path = field(default_factory=current_dir)
    account_id: str | None = None
    accounts: Accounts | None = None
    """Where the account's limits and spend are kept (set by the runtime): each model call
    of the run is reserved there first (`accounts.py`)."""
    rates: Rates | None = None
    """Where its model endpoints' rate limits are kept (set by the runtime): each HTTP attempt
    of the run passes them first (`rates.py`)."""
    deps: Any = None
    config: dict[str, Any] = field(default_factory=dict)
    idempotency_key: str | None = None
    """Set for each call of a durable run (`run_id:call_id`): the same on a retried step, so a
    side-effecting tool can make a repeat harmless."""
    call_id: str | None = None
    """The id of the call the tool runs for (a context of its own per call)."""
    parent: Allowance | None = None
    """A child run's: the allowance of the run that started it (see `tree`)."""
    allowance: Allowance | None = None
    """Set by the driver: this run's share of its tree's budget, which children draw on."""
    spawn: Spawn | None = None
    """How a tool starts a child run in the runtime that runs this one (set by `Runtime`);
    None: a child runs inside the call (`Agent.run` on its own)."""
    tree_sinks: Sequence[Sink] = ()
    """Sinks that see the events of this run's descendants too (the root's watchers); none
    for most runs, so no list is made for them."""
    emitter: Emitter | None = None
    """Set for each call: the run's events, where a tool reports its progress
    (`tool_progress`) or a question it asks the person behind the run."""
    model: Any = None
    """The run's model, set by the driver: a tool may ask it on the run's behalf (an MCP
    server's sampling), adding what that used to `spent`."""
    spent: list[Usage] | None = None
    """Set for each call: the usage of the model calls the tool made, which its result carries
    into the run's usage and cost (`ToolResult.usage`)."""
    time: CallTime | None = None
    """Set for each call: its time limit, which a tool stops while it waits for a person."""
    kept: dict[str, Any] = field(default_factory=dict)
    """What tools keep between the calls of one run (the terminal's shell session): shared by
    the run's calls, in this process only, never recorded."""

    origin: dict[str, Any] = field(default_factory=dict)
    """A fork's origin, `forked_from` (the run) and `at` (its step), recorded with the run and
    carried by its `run_started`; empty for a run that is no fork."""

    def copy(self, **changes: Any) -> RunContext:
        """A shallow copy with `changes`: what `dataclasses.replace` makes, without its work
        for each of the fields (3.1 µs against 0.5; a run makes two, and each call of a tool
        that takes its context one)."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        return new

    def lineage(self) -> dict[str, str]:
        """A child run's `parent_run_id` and `root_run_id` (none for a root), as its events
        and its record carry them."""
        if self.parent is None:
            return {}
        return {"parent_run_id": self.parent.run_id, "root_run_id": self.parent.root.run_id}

    def for_child(self, run_id: str) -> RunContext:
        """The context of a child run this run starts: the same workspace, account, deps and
        config, drawing on this run's allowance."""
        return RunContext(
            run_id=run_id,
            workspace=self.workspace,
            account_id=self.account_id,
            accounts=self.accounts,
            rates=self.rates,
            deps=self.deps,
            config=self.config,
            parent=self.allowance,
            spawn=self.spawn,
            tree_sinks=self.tree_sinks,
        )


class Spawn(Protocol):
    """Starts a child run of the same runtime: `agent` on `task`, as run `run_id`, with
    `context`; the handle it returns has `wait()` and `cancel()`."""

    async def __call__(self, agent: Any, task: str, context: RunContext, run_id: str) -> Any: ...


class ToolArgumentsError(Exception):
    """The model's arguments do not fit the tool's schema; the message is written for the model."""


@dataclass
class Tool:
    """A tool: its schema for the model (`spec`), the function that runs it, its time limit,
    approval policy and whether a crash may run it again (`idempotent`). Made by `@tool`."""

    name: str
    description: str
    fn: Callable[..., Any]
    args_model: type[pydantic.BaseModel] | None
    """Validates the model's arguments; None for tools described by a JSON schema alone (MCP
    tools: their server validates), or until `arguments` builds it."""
    context_param: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    approval: Policy = "never"
    """Which calls a person must approve first: "never", "always", or a predicate on the
    arguments."""
    idempotent: bool = False
    """Whether running a call twice has the effect of running it once. A durable run reruns
    an idempotent call whose outcome a crash hid, and reports any other as outcome unknown."""
    schema: dict[str, Any] | None = None
    agent: Any = None
    """The agent a call of this tool runs as a child run (`Agent.as_tool`): a runtime that
    registers the parent registers it too, so a process can resume the child."""
    arguments: Callable[[], type[pydantic.BaseModel]] | None = None
    """Builds `args_model` when the tool joins an agent or toolbox (`Toolbox.add`): the
    built-ins are made as Tether is imported, and building their models then cost every
    start, `tether --help` included, whether a run used them or not (about 25 ms of
    `tether --help`, farm-bench medians 0.287 s against 0.313 s)."""
    source: str = ""
    """Where the tool comes from when not from Python: an MCP server, as `--mcp` gave it
    (said when two tools share a name)."""
    is_async: bool = field(init=False)

    def __post_init__(self) -> None:
        self.is_async = inspect.iscoroutinefunction(self.fn)

    def model(self) -> type[pydantic.BaseModel] | None:
        """The arguments' model (built on first use), or None for a schema alone."""
        if self.args_model is None and self.arguments is not None:
            self.args_model = self.arguments()
        return self.args_model

    @functools.cached_property
    def parameters(self) -> dict[str, Any]:
        """The JSON Schema of the arguments, as the model is told it."""
        model = self.model()
        if model is not None:
            return clean_schema(model.model_json_schema())
        return dict(self.schema or {"type": "object", "properties": {}})

    @functools.cached_property
    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the plain function, as if it were not a tool."""
        return self.fn(*args, **kwargs)

    @functools.cached_property
    def exact(self) -> dict[str, type] | None:
        """The fields of an arguments model that gives back any argument of exactly its
        field's plain type unchanged (`exact_kinds`); None if any field may change one."""
        model = self.model()
        return None if model is None else exact_kinds(model)

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        args_model = self.model()
        if args_model is None:
            return dict(arguments)
        exact = self.exact
        if (  # every field given, each of exactly its kind: pydantic would give them back
            exact is not None
            and len(arguments) == len(exact)
            and all(type(arguments.get(k)) is kind for k, kind in exact.items())
        ):
            return dict(arguments)
        try:  # the model's own validator, without `model_validate`'s layer (0.4 µs a call)
            model = args_model.__pydantic_validator__.validate_python(arguments)
        except pydantic.ValidationError as e:
            raise ToolArgumentsError(describe_validation_error(self.name, e)) from None
        return dict(model.__dict__)  # its fields, by name (extra ones are refused)

    async def invoke(self, arguments: dict[str, Any], ctx: RunContext) -> ToolOutput:
        """Validate `arguments`, run the function and return its output (see `tool_output`)."""
        return await self.call(self.validate(arguments), ctx)

    async def call(self, kwargs: dict[str, Any], ctx: RunContext) -> ToolOutput:
        """Run the function on validated arguments and return its output (see `tool_output`)."""
        return tool_output(await self.start(kwargs, ctx))

    def start(self, kwargs: dict[str, Any], ctx: RunContext) -> Awaitable[Any]:
        """The function called on validated arguments: its awaitable result (a sync function
        runs in a thread). Not a coroutine of its own: the caller awaits the tool's."""
        if self.context_param:
            kwargs[self.context_param] = ctx
        if self.is_async:
            started: Awaitable[Any] = self.fn(**kwargs)
            return started
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(_POOL, functools.partial(self.fn, **kwargs))


PLAIN_KINDS = frozenset({int, float, str, bool})
DECORATORS = ("validators", "field_validators", "root_validators", "model_validators")


def exact_kinds(model: type[pydantic.BaseModel]) -> dict[str, type] | None:
    """Each field's kind, when the model is the plain kind `tool_from_function` makes (extra
    fields refused, nothing else configured, no validators) and every field is required, of
    int, float, str or bool, with no constraint or alias: a value of exactly that kind then
    validates to itself, so a call's arguments need no pydantic model of their own (a model
    instance, its dict and ours, and 1.5 µs a call). None otherwise."""
    decorators = model.__pydantic_decorators__
    if dict(model.model_config) != {"extra": "forbid"} or any(
        getattr(decorators, name) for name in DECORATORS
    ):
        return None
    kinds: dict[str, type] = {}
    for name, info in model.model_fields.items():
        kind = info.annotation
        if kind not in PLAIN_KINDS or info.metadata or not info.is_required():
            return None
        if info.alias is not None or info.validation_alias is not None:
            return None
        kinds[name] = cast(type, kind)
    return kinds


ToolOutput = tuple[str, tuple[ImagePart, ...]]
"""A call's text and its images (`tool_output`)."""


def tool_output(result: Any) -> ToolOutput:
    """A tool's return value as the model reads it: its text, and its images. A tool returns
    an `ImagePart`, or a list mixing text and images, to show the model a picture; anything
    else is text (JSON for values that are not strings)."""
    if isinstance(result, ImagePart):
        return "", (result,)
    if isinstance(result, (list, tuple)) and any(isinstance(r, ImagePart) for r in result):
        images = tuple(r for r in result if isinstance(r, ImagePart))
        texts = [output_text(r) for r in result if not isinstance(r, ImagePart)]
        return "\n".join(t for t in texts if t), images
    return output_text(result), ()


def output_text(result: Any) -> str:
    if isinstance(result, str):
        return result
    if result is None:
        return ""
    return pydantic_core.to_json(result, fallback=str).decode()


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    approval: Policy = "never",
    idempotent: bool = False,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    approval: Policy = "never",
    idempotent: bool = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a tool of a typed function (sync or async). Use as `@tool` or `@tool(timeout=5)`;
    `approval="always"` (or a predicate on the arguments) makes calls wait for a person."""

    def make(f: Callable[..., Any]) -> Tool:
        t = tool_from_function(f, name=name, description=description, timeout=timeout)
        t.approval = approval
        t.idempotent = idempotent
        return t

    return make(fn) if fn is not None else make


def tool_from_function(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> Tool:
    summary, arg_docs = parse_docstring(inspect.getdoc(fn) or "")
    hints = typing.get_type_hints(fn, include_extras=True)  # `Annotated[int, Field(ge=0)]` kept
    fields: dict[str, Any] = {}
    context_param = None
    for pname, param in inspect.signature(fn).parameters.items():
        annotation = hints.get(pname, Any)
        if annotation is RunContext:
            context_param = pname
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(
                f"tool {fn.__name__}: *args and **kwargs cannot be described to a model"
            )
        default = ... if param.default is param.empty else param.default
        field = pydantic.Field(description=arg_docs.get(pname))
        described = typing.Annotated[annotation, field]  # type: ignore[valid-type]  # (a value)
        fields[pname] = (described, default)  # its own Field kept (`Annotated[int, Field(ge=0)]`)
    tool_name = name or fn.__name__

    def arguments() -> type[pydantic.BaseModel]:
        return pydantic.create_model(
            f"{tool_name}_arguments",
            __config__=pydantic.ConfigDict(extra="forbid"),
            **fields,
        )

    return Tool(
        tool_name,
        description if description is not None else summary,
        fn,
        None,
        context_param=context_param,
        timeout=timeout,
        arguments=arguments,
    )


_ARG_LINE = re.compile(r"^\s*(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The summary and per-argument descriptions of a Google-style (`Args:`) or Sphinx
    (`:param x:`) docstring."""
    summary: list[str] = []
    args: dict[str, str] = {}
    section = "summary"
    current: str | None = None
    arg_indent = 0
    for line in doc.splitlines():
        stripped = line.strip()
        sphinx = re.match(r":param\s+(?:\w+\s+)?(\w+):\s*(.*)", stripped)
        if sphinx:
            current, section = sphinx.group(1), "args"
            args[current] = sphinx.group(2)
            continue
        if stripped in ("Args:", "Arguments:", "Parameters:"):
            section, current = "args", None
            continue
        if re.match(r"^(Returns|Raises|Yields|Examples?|Notes?):$", stripped):
            section = "other"
            continue
        if section == "summary":
            summary.append(line)
        elif section == "args" and stripped:
            m = _ARG_LINE.match(line)
            indent = len(line) - len(line.lstrip())
            if m and (current is None or indent <= arg_indent):
                current = m.group(1).lstrip("*")
                arg_indent = indent
                args[current] = m.group(2).strip()
            elif current:
                args[current] = (args[current] + " " + stripped).strip()
    return "\n".join(summary).strip(), args


def clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Drop pydantic's generated titles: they cost tokens and tell the model nothing."""

    def walk(node: Any, in_properties: bool = False) -> Any:
        if isinstance(node, dict):
            return {
                k: walk(v, k == "properties")
                for k, v in node.items()
                if in_properties or k != "title"
            }
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    cleaned: dict[str, Any] = walk(schema)
    cleaned.setdefault("properties", {})
    return cleaned


ECHOED = 200
"""At most this many characters of a bad argument are echoed back to the model (a 2 MB one
came back whole, into the context and the transcript)."""


def shortened(text: str) -> str:
    if len(text) <= ECHOED:
        return text
    return (
        f"{text[: ECHOED // 2]}... [{len(text) - ECHOED} characters cut] ...{text[-ECHOED // 2 :]}"
    )


def describe_validation_error(name: str, e: pydantic.ValidationError) -> str:
    lines = [f"Invalid arguments for tool {name!r}:"]
    for err in e.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"]) or "(arguments)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown argument"
        elif err["type"] != "missing":
            msg += f" (got {shortened(repr(err['input']))})"
        lines.append(f"- {where}: {msg}")
    lines.append("Fix the arguments and call the tool again.")
    return "\n".join(lines)
