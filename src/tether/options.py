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


@dataclass
class RunOptions:
    """How to build a run's agent. Every field has the meaning of the CLI option of the same
    name (`tether run --help`); `only` narrows the tools to a subset (the page's checkboxes)."""

    provider: str | None = None
    model: str | None = None
    base_url: str | None = None
    fallback: list[str] = field(default_factory=list)
    """Models that answer in turn when the one before cannot serve now: PROVIDER:MODEL[@URL]."""
    script: str | None = None
    no_stream: bool = False
    max_retries: int = 2
    connect_timeout: float = 10.0
    read_timeout: float = 120.0
    tools: str | None = None
    tools_from: list[str] = field(default_factory=list)
    mcp: list[str] = field(default_factory=list)
    mcp_approve: list[str] = field(default_factory=list)
    """Which MCP tools' calls wait for approval: hints (the default: those not marked
    read-only), always, never, or [SERVER#]TOOL=RULE (see `tools.mcp.MCPApproval`)."""
    mcp_prefix: list[str] = field(default_factory=list)
    """SERVER=PREFIX: that server's tools are offered as PREFIX_TOOL (see
    `tools.mcp.MCPNames`)."""
    mcp_tools: list[str] = field(default_factory=list)
    """[SERVER#]TOOL patterns: when given, only the MCP tools that match one are offered."""
    mcp_skip: list[str] = field(default_factory=list)
    """[SERVER#]TOOL patterns: MCP tools that are not offered."""
    mcp_sampling: str = "on"
    """Whether an MCP server's sampling requests are answered by the run's model: on or off."""
    mcp_auth: str | None = None
    """A JSON file of how to sign in to the remote MCP servers (`AuthSettings`); its path is
    recorded, never what it holds."""
    only: list[str] | None = None
    tool_timeout: float | None = None
    tool_env: list[str] = field(default_factory=list)
    tool_choice: str | None = None
    sandbox: bool | None = None
    """bash in bubblewrap: True requires it, False turns it off, None (the default) uses it
    where it works (`tools.sandbox.for_options`)."""
    sandbox_net: bool = False
    workspace: str = "."
    max_steps: int | None = DEFAULT_MAX_STEPS
    max_tokens: int | None = None
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    max_cost: float | None = None
    account: str | None = None
    """The account the run belongs to: its model calls count against the account's limits
    (`accounts.py`, `tether limits`)."""
    prices: str | None = None
    timeout: float | None = None
    context_window: int | None = None
    system: str | None = None
    profile: str = "default"
    approve: str = "ask"
    output_schema: str | None = None
    """A JSON Schema file the final answer must match (`run_finished.output` is the value)."""
    check: bool | None = None
    """Ask the model once to check its work before its answer is taken (None: with the
    terminal profile only)."""
    guardrails: list[str] = field(default_factory=list)
    """Python files or modules whose `input_guardrails`, `tool_guardrails` and
    `output_guardrails` lists the agent checks with (see `guardrails`)."""

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
