"""Typed run options: what the command line, the web page's form and a worker build agents from.

The CLI turns its flags into a `RunOptions` once; below the CLI nothing sees argparse. A store
records `RunOptions.to_dict()` with a run (under these field names, whatever the flags are
called), and any process rebuilds the same agent from it with `build_agent`.

    options = RunOptions(provider="anthropic", tools="bash", max_steps=10)
    agent = build_agent(options)
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from .accounts import check_account
from .agent import Agent
from .context import ContextPolicy, window_for
from .errors import ConfigError
from .loop import Budget
from .output import Output
from .pricing import load_prices, price_for
from .providers import PROVIDERS, FallbackModel, HTTPSettings, Model, make_model
from .terminal import TERMINAL_CHECK, TERMINAL_SYSTEM, TERMINAL_TOOLS
from .tools import BUILTINS, Tool
from .tools.bash import bash_tool, session_tools
from .tools.loading import load_module, load_tools
from .tools.sandbox import for_options

DEFAULT_TOOLS = "read_file,write_file,edit_file,list_files"
DEFAULT_MAX_STEPS = 50
DEFAULT_SYSTEM = (
    "You are a capable assistant. Use the tools when they help; "
    "when you have the answer, reply with it directly."
)
CLI_AGENT = "tether"
"""The name of agents built from options (by the CLI, the page, a worker)."""


@dataclass(frozen=True)
class Flag:
    """How the command line offers a `RunOptions` field (`cli.run_options` makes the flag
    `--field-name` from it): the group `--help` shows it in and its help, which is the
    field's documentation. Its type, default, and whether it repeats (a list) or is a switch
    (a bool) come from the field itself, so that a default is written once."""

    group: str
    """model, tools, budgets or run (see `cli.run_options.GROUPS`)."""
    help: str | None = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    env: str | None = None
    """An environment variable whose value is the flag's default, when it is set."""


def option(
    default: Any,
    group: str,
    help: str | None = None,
    metavar: str | None = None,
    choices: tuple[str, ...] | None = None,
    env: str | None = None,
) -> Any:
    """A `RunOptions` field and its flag (a list default is a fresh list per instance)."""
    meta = {"flag": Flag(group, help, metavar, choices, env)}
    if isinstance(default, list):
        return field(default_factory=list, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class RunOptions:
    """How to build a run's agent. Each field is the CLI flag of its name (`--max-steps` is
    `max_steps`), documented by its help here; `only` narrows the tools to a subset (the
    page's checkboxes) and has no flag."""

    # -- model ------------------------------------------------------------------------------
    provider: str | None = option(
        None,
        "model",
        "wire protocol of the model (default: $TETHER_PROVIDER, else openai-chat; with no "
        "API key and the local extra installed, the bundled offline model)",
        choices=tuple(PROVIDERS),
        env="TETHER_PROVIDER",
    )
    model: str | None = option(None, "model", "model name (default depends on the provider)")
    base_url: str | None = option(
        None, "model", "any compatible server, e.g. http://127.0.0.1:11434/v1"
    )
    output_schema: str | None = option(
        None,
        "model",
        "a JSON Schema the final answer must match (an answer that does not is sent back "
        "to the model, up to 3 answers); --json gives the value as run_finished.output",
        metavar="FILE",
    )
    fallback: list[str] = option(
        [],
        "model",
        "a model that answers when the one before cannot serve now (429, 5xx, overloaded, "
        "unreachable, time-out), after its retries; repeat for more, tried in order",
        metavar="PROVIDER:MODEL[@URL]",
    )
    guardrails: list[str] = option(
        [],
        "model",
        "Python file or module whose input_guardrails, tool_guardrails and "
        "output_guardrails lists check the run (a trip halts it, exit 3); repeatable",
        metavar="FILE_OR_MODULE",
    )
    script: str | None = option(
        None, "model", "replies for --provider scripted (JSON list)", metavar="FILE"
    )
    no_stream: bool = option(False, "model", "ask for whole replies, not streams")
    max_retries: int = option(
        2,
        "model",
        "retries of a failed model call (429, 5xx, connection) (default: 2)",
        metavar="N",
    )
    connect_timeout: float = option(10.0, "model", metavar="S")
    read_timeout: float = option(
        120.0, "model", "longest silence from the model server (default: 120)", metavar="S"
    )

    # -- tools ------------------------------------------------------------------------------
    tools: str | None = option(
        None,
        "tools",
        f"built-in tools to enable: {', '.join(BUILTINS)} "
        f"(default: {DEFAULT_TOOLS}; none when --tools-from is given)",
        metavar="NAME,NAME|none",
    )
    tools_from: list[str] = option(
        [],
        "tools",
        "load @tool functions from a Python file or module (repeatable)",
        metavar="FILE_OR_MODULE",
    )
    mcp: list[str] = option(
        [],
        "tools",
        "use the tools of an MCP server: a command (stdio) or a streamable HTTP URL (repeatable)",
        metavar="COMMAND_OR_URL",
    )
    mcp_approve: list[str] = option(
        [],
        "tools",
        "which MCP tools' calls wait for approval (as bash's, under --approve): hints "
        "(the default: every tool its server does not mark read-only), always, never, or "
        "TOOL=RULE, SERVER#TOOL=RULE for one tool (repeatable)",
        metavar="RULE",
    )
    mcp_prefix: list[str] = option(
        [],
        "tools",
        "offer an MCP server's tools as PREFIX_TOOL (the server as --mcp gives it, or by "
        "its own name), so that two servers' tools of one name can both be used (repeatable)",
        metavar="SERVER=PREFIX",
    )
    mcp_tools: list[str] = option(
        [],
        "tools",
        "offer only the MCP tools that match (TOOL may be a pattern: 'read_*'; repeatable)",
        metavar="[SERVER#]TOOL",
    )
    mcp_skip: list[str] = option(
        [], "tools", "leave out the MCP tools that match (repeatable)", metavar="[SERVER#]TOOL"
    )
    mcp_sampling: str = option(
        "on",
        "tools",
        "whether an MCP server may have the run's model answer a request in the middle of "
        "a call, on the run's budget (default: on)",
        choices=("on", "off"),
    )
    mcp_auth: str | None = option(
        None,
        "tools",
        "how to sign in to the remote MCP servers: a JSON file of client_id, "
        "client_secret, grant (authorization_code or client_credentials), scope (default: "
        "register, and sign in at the browser when a server asks); its path is recorded with "
        "a run, never what it holds",
        metavar="FILE",
    )
    only: list[str] | None = None
    tool_timeout: float | None = option(
        None,
        "tools",
        "time limit for every tool call (default: each tool's own, 60 s)",
        metavar="S",
    )
    tool_choice: str | None = option(
        None,
        "tools",
        "whether the model must call a tool: required, or the tool NAME, hold until it "
        "has called one; none forbids tools (default: auto, the model decides)",
        metavar="auto|required|none|NAME",
    )
    sandbox: bool | None = option(
        None,
        "tools",
        "run bash in bubblewrap: the file system read-only but the workspace, a private "
        "/tmp, no network, every process ending with its call, memory and CPU time bounded "
        "(default: where bubblewrap works, else unsandboxed with a warning; --sandbox makes "
        "its absence an error, --no-sandbox runs bash with your user's full power)",
    )
    sandbox_net: bool = option(False, "tools", "with --sandbox, let commands use the network")
    tool_env: list[str] = option(
        [],
        "tools",
        "pass this environment variable to bash; it gets only PATH, HOME, USER, LANG, "
        "LC_*, TERM, TZ, TMPDIR and SHELL otherwise, so no key reaches a command (repeatable)",
        metavar="NAME",
    )
    workspace: str = option(
        ".", "tools", "directory the tools work in (default: the current one)", metavar="DIR"
    )
    approve: str = option(
        "ask",
        "tools",
        "calls that need approval (bash, tools marked so): ask at the terminal, "
        "approve all, or deny all (default: ask; with no terminal to ask on, deny)",
        choices=("ask", "auto", "deny"),
    )
    profile: str = option(
        "default",
        "tools",
        "terminal: a terminal agent (bash and the file tools, a system prompt for shell "
        "work, a check before the answer); bash still asks for approval unless --yolo",
        choices=("default", "terminal"),
    )
    check: bool | None = option(
        None,
        "tools",
        "ask the model once to check its work against the task before its answer is "
        "taken (default: on with --profile terminal)",
    )

    # -- budgets ----------------------------------------------------------------------------
    max_steps: int | None = option(
        DEFAULT_MAX_STEPS,
        "budgets",
        f"at most N model calls (default: {DEFAULT_MAX_STEPS})",
        metavar="N",
    )
    max_tokens: int | None = option(None, "budgets", "input plus output tokens", metavar="N")
    max_input_tokens: int | None = option(None, "budgets", metavar="N")
    max_output_tokens: int | None = option(None, "budgets", metavar="N")
    max_cost: float | None = option(None, "budgets", "cost from the price table", metavar="USD")
    account: str | None = option(
        None,
        "budgets",
        "the account the run belongs to: each model call counts against its limits "
        "(tether limits), across every run and worker of the store",
        metavar="NAME",
    )
    prices: str | None = option(
        None, "budgets", "JSON price table laid over the defaults", metavar="FILE"
    )
    timeout: float | None = option(None, "budgets", "wall-clock limit for a run", metavar="SECONDS")
    context_window: int | None = option(
        None,
        "budgets",
        "trim old tool outputs, then summarise older turns, to fit this window "
        "(default: the model's, where it is known; 0 turns it off)",
        metavar="TOKENS",
    )

    # -- run --------------------------------------------------------------------------------
    system: str | None = option(None, "run", "system prompt", metavar="TEXT")

    @classmethod
    def from_namespace(cls, ns: Any) -> RunOptions:
        """The options among an argparse namespace's attributes (the CLI calls this once)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in vars(ns).items() if k in names})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunOptions:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"unknown run options: {', '.join(unknown)}")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def resolved(self) -> RunOptions:
        """The same options with paths made absolute, so that a worker elsewhere (or a later
        resume from another directory) finds the same files."""
        return dataclasses.replace(
            self,
            provider=self.provider or default_provider(self),
            workspace=str(Path(self.workspace).resolve()),
            tools_from=[absolute(s) for s in self.tools_from],
            guardrails=[absolute(s) for s in self.guardrails],
            script=str(Path(self.script).resolve()) if self.script else None,
            prices=str(Path(self.prices).resolve()) if self.prices else None,
            output_schema=str(Path(self.output_schema).resolve()) if self.output_schema else None,
            mcp_auth=str(Path(self.mcp_auth).resolve()) if self.mcp_auth else None,
        )


def absolute(source: str) -> str:
    """A `--tools-from` or `--guardrails` source: a file by its absolute path, else a module."""
    return (
        str(Path(source).resolve()) if source.endswith(".py") or Path(source).is_file() else source
    )


GUARDRAIL_LISTS = ("input_guardrails", "tool_guardrails", "output_guardrails")


def load_guardrails(sources: list[str]) -> dict[str, list[Any]]:
    """The guardrail lists the `--guardrails` modules define, joined by kind."""
    found: dict[str, list[Any]] = {name: [] for name in GUARDRAIL_LISTS}
    for source in sources:
        module = load_module(source, "--guardrails")
        lists = {name: getattr(module, name) for name in GUARDRAIL_LISTS if hasattr(module, name)}
        if not lists:
            raise ConfigError(
                f"--guardrails: {source} defines none of {', '.join(GUARDRAIL_LISTS)}"
            )
        for name, given in lists.items():
            if not isinstance(given, (list, tuple)):
                raise ConfigError(f"--guardrails: {source}: {name} is not a list")
            found[name].extend(given)
    return found


def build_agent(o: RunOptions, tools: list[Tool] | None = None) -> Agent:
    """The agent these options describe (MCP tools are the caller's: they need a connection).
    A bad option is a ConfigError that names it."""
    for name in ("max_steps", "max_tokens", "max_input_tokens", "max_output_tokens", "max_retries"):
        value = getattr(o, name)
        if value is not None and value < 0:
            raise ConfigError(f"--{name.replace('_', '-')} must not be negative")
    if not Path(o.workspace).is_dir():
        raise ConfigError(f"--workspace: {o.workspace} is not a directory")
    if o.account is not None:
        check_account(o.account)
    if tools is None:
        tools = select_tools(o)
    if o.only is not None:  # the page's choice among every tool the options give
        tools = [t for t in tools if t.name in o.only]
    tools = timed(tools, o.tool_timeout)  # every tool's, an MCP server's too
    prices = load_prices(o.prices) if o.prices else None
    model = model_of(o, prices)
    budget = Budget(
        max_steps=o.max_steps,
        max_input_tokens=o.max_input_tokens,
        max_output_tokens=o.max_output_tokens,
        max_tokens=o.max_tokens,
        max_cost_usd=o.max_cost,
        max_seconds=o.timeout,
    )
    context = context_of(o, model)
    names = [t.name for t in tools]
    if o.tool_choice is not None and o.tool_choice not in ("auto", "required", "none", *names):
        raise ConfigError(
            f"--tool-choice: {o.tool_choice!r} is none of auto, required, none or a tool's name "
            f"({', '.join(names) or 'no tools are enabled'})"
        )
    guards = load_guardrails(o.guardrails)
    try:
        return Agent(
            model,
            tools,
            system=o.system or (TERMINAL_SYSTEM if o.profile == "terminal" else DEFAULT_SYSTEM),
            budget=budget,
            prices=prices,
            context=context,
            name=CLI_AGENT,
            tool_choice=o.tool_choice,
            check=TERMINAL_CHECK if wants_check(o) else None,
            output_type=load_schema(o.output_schema) if o.output_schema else None,
            input_guardrails=guards["input_guardrails"],
            tool_guardrails=guards["tool_guardrails"],
            output_guardrails=guards["output_guardrails"],
        )
    except TypeError as e:  # not a guardrail
        raise ConfigError(f"--guardrails: {e}") from None
    except ValueError as e:  # two tools of one name: the model could not tell them apart
        raise ConfigError(
            f"tools: {e}; a built-in, a --tools-from tool and an MCP server's tool must not "
            "share a name"
        ) from None


def model_of(o: RunOptions, prices: Any) -> Model:
    """The options' model, with its fallbacks; each must have a price when a cost limit is
    set (else the limit could not be kept)."""
    settings = HTTPSettings(
        connect_timeout=o.connect_timeout,
        read_timeout=o.read_timeout,
        max_retries=o.max_retries,
    )
    model: Model = make_model(
        o.provider or default_provider(o),
        o.model,
        base_url=o.base_url,
        stream=not o.no_stream,
        settings=settings,
        script=o.script,
    )
    fallbacks = [fallback_model(spec, o, settings) for spec in o.fallback]
    for m in (model, *fallbacks):
        if o.max_cost is not None and price_for(m.name, prices) is None:
            raise ConfigError(
                f"--max-cost: no price is known for model {m.name!r}; give one with --prices FILE"
            )
    return FallbackModel(model, *fallbacks) if fallbacks else model


def context_of(o: RunOptions, model: Model) -> ContextPolicy | None:
    """How much of the conversation the model is sent: the options' window, or the
    model's known one."""
    window = o.context_window
    if window is None:
        window = window_for(model.name)
    if window is not None and window < 0:
        raise ConfigError("--context-window must not be negative")
    return ContextPolicy(window, reserve=min(4096, window // 4)) if window else None


def load_schema(path: str) -> dict[str, Any]:
    """The JSON Schema of `--output-schema FILE` (checked when the agent is built)."""
    try:
        schema = orjson.loads(Path(path).read_bytes())
    except OSError as e:
        raise ConfigError(f"--output-schema: cannot read {path}: {e.strerror}") from None
    except orjson.JSONDecodeError as e:
        raise ConfigError(f"--output-schema: {path} is not JSON: {e}") from None
    if not isinstance(schema, dict):
        raise ConfigError(f"--output-schema: {path} is not a JSON Schema (an object)")
    try:
        Output(schema)
    except ValueError as e:
        raise ConfigError(f"--output-schema: {path}: {e}") from None
    return schema


def fallback_model(spec: str, o: RunOptions, settings: HTTPSettings) -> Model:
    """The model of a `--fallback PROVIDER:MODEL[@URL]` (its key from the environment)."""
    provider, colon, rest = spec.partition(":")
    name, at, url = rest.partition("@")
    if not colon or not name or provider not in PROVIDERS or provider in ("scripted", "local"):
        raise ConfigError(
            f"--fallback: {spec!r} is not PROVIDER:MODEL[@URL], with PROVIDER one of "
            "openai-chat, openai-responses, anthropic"
        )
    if at and not url.startswith(("http://", "https://")):
        raise ConfigError(f"--fallback: {url!r} in {spec!r} is not an http(s) URL")
    stream = not o.no_stream
    return make_model(provider, name, base_url=url or None, stream=stream, settings=settings)


def wants_check(o: RunOptions) -> bool:
    return o.check if o.check is not None else o.profile == "terminal"


def select_tools(o: RunOptions) -> list[Tool]:
    """The built-ins named by `tools` and those loaded by `tools_from`."""
    default = TERMINAL_TOOLS if o.profile == "terminal" else DEFAULT_TOOLS
    spec = o.tools if o.tools is not None else ("none" if o.tools_from else default)
    tools: list[Tool] = []
    if spec.strip() != "none":
        for name in (n.strip() for n in spec.split(",") if n.strip()):
            if name not in BUILTINS:
                raise ConfigError(
                    f"--tools: no built-in tool {name!r}; known: {', '.join(BUILTINS)}"
                )
            tools.extend(bash_of(o) if name == "bash" else [BUILTINS[name]])
    for source in o.tools_from:
        tools.extend(load_tools(source))
    return tools


def bash_of(o: RunOptions) -> list[Tool]:
    """The bash tool these options describe: its environment, and its sandbox (decided here,
    at start: one asked for that cannot be made is an error then, never an unsandboxed call).
    The terminal profile's keeps a shell session, with `bash_job` for commands that go on."""
    code = tuple(
        str(Path(f).resolve()) for f in (*o.tools_from, *o.guardrails) if f.endswith(".py")
    )
    sandbox = for_options(o.sandbox, o.sandbox_net, code)  # read-only to the sandbox
    if o.profile == "terminal":
        return session_tools(o.tool_env, sandbox)
    return [bash_tool(o.tool_env, sandbox)]


def timed(tools: list[Tool], timeout: float | None) -> list[Tool]:
    """The tools with `--tool-timeout` as their time limit, when it is given."""
    if timeout is None:
        return tools
    return [dataclasses.replace(t, timeout=timeout) for t in tools]


def default_provider(o: RunOptions) -> str:
    """The provider when none is named. A model that is named is the model used: a `claude-*`
    one on Anthropic, any other on Chat Completions, whether or not its key is set (a missing
    key is then one line naming it, never another model answering instead). Only with no
    model named, no key and no `--base-url` does the bundled offline model answer, where it
    is installed."""
    from .providers import local

    if o.model is not None:
        return "anthropic" if o.model.startswith("claude") else "openai-chat"
    if os.environ.get("OPENAI_API_KEY") or o.base_url or not local.available():
        return "openai-chat"
    return "local"
