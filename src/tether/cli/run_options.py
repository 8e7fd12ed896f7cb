"""The options of the commands that run agents (`run`, `ask`, `serve`, `mcp-serve`), in the
groups `--help` shows: the model, the tools (MCP servers among them), budgets, approvals and the
run. Each becomes the `options.RunOptions` field of its name.
"""

from __future__ import annotations

import argparse
import os

from ..durable.outage import STORE_PATIENCE_S
from ..journal import STORE_FORMS
from ..options import DEFAULT_MAX_STEPS, DEFAULT_TOOLS
from ..providers import PROVIDERS
from ..tools import BUILTINS
from .common import STORE_HELP, data_dir


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The options of a command that runs agents, in groups (their order is --help's)."""
    model_options(p.add_argument_group("model"))
    tools = p.add_argument_group("tools")
    tool_options(tools)
    budget_options(p.add_argument_group("budgets (checked before every model call)"))
    approval_options(tools)
    run_options(p.add_argument_group("run"))


Group = argparse._ArgumentGroup


def model_options(m: Group) -> None:
    m.add_argument(
        "--provider",
        choices=PROVIDERS,
        default=os.environ.get("TETHER_PROVIDER"),
        help="wire protocol of the model (default: $TETHER_PROVIDER, else openai-chat; with no "
        "API key and the local extra installed, the bundled offline model)",
    )
    m.add_argument("--model", help="model name (default depends on the provider)")
    m.add_argument("--base-url", help="any compatible server, e.g. http://127.0.0.1:11434/v1")
    m.add_argument(
        "--output-schema",
        metavar="FILE",
        help="a JSON Schema the final answer must match (an answer that does not is sent back "
        "to the model, up to 3 answers); --json gives the value as run_finished.output",
    )
    m.add_argument(
        "--fallback",
        action="append",
        default=[],
        metavar="PROVIDER:MODEL[@URL]",
        help="a model that answers when the one before cannot serve now (429, 5xx, overloaded, "
        "unreachable, time-out), after its retries; repeat for more, tried in order",
    )
    m.add_argument(
        "--guardrails",
        action="append",
        default=[],
        metavar="FILE_OR_MODULE",
        help="Python file or module whose input_guardrails, tool_guardrails and "
        "output_guardrails lists check the run (a trip halts it, exit 3); repeatable",
    )
    m.add_argument("--script", metavar="FILE", help="replies for --provider scripted (JSON list)")
    m.add_argument("--no-stream", action="store_true", help="ask for whole replies, not streams")
    m.add_argument(
        "--max-retries",
        type=int,
        default=2,
        metavar="N",
        help="retries of a failed model call (429, 5xx, connection) (default: 2)",
    )
    m.add_argument("--connect-timeout", type=float, default=10.0, metavar="S")
    m.add_argument(
        "--read-timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="longest silence from the model server (default: 120)",
    )


def tool_options(t: Group) -> None:
    t.add_argument(
        "--tools",
        metavar="NAME,NAME|none",
        help=f"built-in tools to enable: {', '.join(BUILTINS)} "
        f"(default: {DEFAULT_TOOLS}; none when --tools-from is given)",
    )
    t.add_argument(
        "--tools-from",
        action="append",
        default=[],
        metavar="FILE_OR_MODULE",
        help="load @tool functions from a Python file or module (repeatable)",
    )
    mcp_options(t)
    t.add_argument(
        "--tool-timeout",
        type=float,
        metavar="S",
        help="time limit for every tool call (default: each tool's own, 60 s)",
    )
    t.add_argument(
        "--tool-choice",
        metavar="auto|required|none|NAME",
        help="whether the model must call a tool: required, or the tool NAME, hold until it "
        "has called one; none forbids tools (default: auto, the model decides)",
    )
    t.add_argument(
        "--sandbox",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run bash in bubblewrap: the file system read-only but the workspace, a private "
        "/tmp, no network, every process ending with its call, memory and CPU time bounded "
        "(default: where bubblewrap works, else unsandboxed with a warning; --sandbox makes "
        "its absence an error, --no-sandbox runs bash with your user's full power)",
    )
    t.add_argument(
        "--sandbox-net",
        action="store_true",
        help="with --sandbox, let commands use the network",
    )
    t.add_argument(
        "--tool-env",
        action="append",
        default=[],
        metavar="NAME",
        help="pass this environment variable to bash; it gets only PATH, HOME, USER, LANG, "
        "LC_*, TERM, TZ, TMPDIR and SHELL otherwise, so no key reaches a command (repeatable)",
    )
    t.add_argument(
        "--workspace",
        default=".",
        metavar="DIR",
        help="directory the tools work in (default: the current one)",
    )


def mcp_options(t: Group) -> None:
    """The MCP servers a run's tools come from, and the rules for their tools."""
    t.add_argument(
        "--mcp",
        action="append",
        default=[],
        metavar="COMMAND_OR_URL",
        help="use the tools of an MCP server: a command (stdio) or a streamable HTTP URL "
        "(repeatable)",
    )
    t.add_argument(
        "--mcp-approve",
        action="append",
        default=[],
        metavar="RULE",
        help="which MCP tools' calls wait for approval (as bash's, under --approve): hints "
        "(the default: every tool its server does not mark read-only), always, never, or "
        "TOOL=RULE, SERVER#TOOL=RULE for one tool (repeatable)",
    )
    t.add_argument(
        "--mcp-prefix",
        action="append",
        default=[],
        metavar="SERVER=PREFIX",
        help="offer an MCP server's tools as PREFIX_TOOL (the server as --mcp gives it, or by "
        "its own name), so that two servers' tools of one name can both be used (repeatable)",
    )
    t.add_argument(
        "--mcp-tools",
        action="append",
        default=[],
        metavar="[SERVER#]TOOL",
        help="offer only the MCP tools that match (TOOL may be a pattern: 'read_*'; repeatable)",
    )
    t.add_argument(
        "--mcp-skip",
        action="append",
        default=[],
        metavar="[SERVER#]TOOL",
        help="leave out the MCP tools that match (repeatable)",
    )
    t.add_argument(
        "--mcp-sampling",
        choices=("on", "off"),
        default="on",
        help="whether an MCP server may have the run's model answer a request in the middle of "
        "a call, on the run's budget (default: on)",
    )
    t.add_argument(
        "--mcp-auth",
        metavar="FILE",
        help="how to sign in to the remote MCP servers: a JSON file of client_id, "
        "client_secret, grant (authorization_code or client_credentials), scope (default: "
        "register, and sign in at the browser when a server asks)",
    )


def budget_options(b: Group) -> None:
    b.add_argument(
        "--max-steps",
        type=int,
        default=DEFAULT_MAX_STEPS,
        metavar="N",
        help=f"at most N model calls (default: {DEFAULT_MAX_STEPS})",
    )
    b.add_argument("--max-tokens", type=int, metavar="N", help="input plus output tokens")
    b.add_argument("--max-input-tokens", type=int, metavar="N")
    b.add_argument("--max-output-tokens", type=int, metavar="N")
    b.add_argument("--max-cost", type=float, metavar="USD", help="cost from the price table")
    b.add_argument(
        "--account",
        metavar="NAME",
        help="the account the run belongs to: each model call counts against its limits "
        "(tether limits), across every run and worker of the store",
    )
    b.add_argument("--prices", metavar="FILE", help="JSON price table laid over the defaults")
    b.add_argument("--timeout", type=float, metavar="SECONDS", help="wall-clock limit for a run")
    b.add_argument(
        "--context-window",
        type=int,
        metavar="TOKENS",
        help="trim old tool outputs, then summarise older turns, to fit this window "
        "(default: the model's, where it is known; 0 turns it off)",
    )


def approval_options(t: Group) -> None:
    """Who decides the calls that need approval, and the terminal profile (in "tools")."""
    t.add_argument(
        "--approve",
        choices=("ask", "auto", "deny"),
        default="ask",
        help="calls that need approval (bash, tools marked so): ask at the terminal, "
        "approve all, or deny all (default: ask; with no terminal to ask on, deny)",
    )
    t.add_argument(
        "--yolo",
        dest="approve",
        action="store_const",
        const="auto",
        help="run every tool call without asking (the same as --approve auto)",
    )
    t.add_argument(
        "--profile",
        choices=("default", "terminal"),
        default="default",
        help="terminal: a terminal agent (bash and the file tools, a system prompt for shell "
        "work, a check before the answer); bash still asks for approval unless --yolo",
    )
    t.add_argument(
        "--check",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="ask the model once to check its work against the task before its answer is "
        "taken (default: on with --profile terminal)",
    )


def run_options(o: Group) -> None:
    o.add_argument("--system", metavar="TEXT", help="system prompt")
    o.add_argument("--json", action="store_true", help="print events as JSON lines")
    o.add_argument(
        "--otel",
        action="store_true",
        help="emit OpenTelemetry spans (needs the otel extra; exporter from the "
        "OTEL_* environment, else printed to stderr)",
    )
    o.add_argument("--run-id", metavar="ID", help="id of the run (default: generated)")
    o.add_argument(
        "--store",
        metavar="URL",
        help=f"where durable runs are recorded: {STORE_FORMS}; or memory for a run that is "
        f"not recorded (default: $TETHER_STORE, else {STORE_HELP})",
    )
    patience_option(o)
    o.add_argument(
        "--queue",
        action="store_true",
        help="with --store: queue the run for tether worker instead of running it here",
    )
    o.add_argument(
        "--data-dir",
        default=str(data_dir()),
        help="where run journals and the default store are kept, for tether show and runs "
        f"(default: {data_dir()})",
    )
    o.add_argument(
        "--log",
        metavar="FILE",
        help="append a structured log (JSON lines, secrets redacted) to FILE",
    )


def patience_option(group: argparse._ActionsContainer) -> None:
    group.add_argument(
        "--store-patience",
        type=float,
        default=STORE_PATIENCE_S,
        metavar="SECONDS",
        help="how long runs wait for a store that stops answering; then they end failed here "
        f"and stay in the store, to resume (default: {STORE_PATIENCE_S:g})",
    )
