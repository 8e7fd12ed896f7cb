"""The `tether` command: `tether run TASK` for one task, `tether ask` for a conversation.

Exit status: 0 done, 1 failed, 2 bad usage or configuration, 3 halted by a budget, 130 cancelled.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import orjson

from .agent import Agent, RunResult
from .approvals import ApprovalRequest, Approver, Decision, approve_all, deny_all
from .context import ContextPolicy, window_for
from .errors import ConfigError
from .events import Event, Sink
from .loop import Budget
from .messages import Message
from .pricing import load_prices, price_for
from .providers import PROVIDERS, HTTPSettings, make_model
from .redact import redactor, scrub
from .supervisor import Supervisor
from .terminal import TERMINAL_SYSTEM, TERMINAL_TOOLS
from .tools import BUILTINS, RunContext, Tool
from .tools.loading import load_tools

DEFAULT_TOOLS = "read_file,write_file,edit_file,list_files"
DEFAULT_MAX_STEPS = 50
DEFAULT_SYSTEM = (
    "You are a capable assistant. Use the tools when they help; "
    "when you have the answer, reply with it directly."
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tether",
        description="Tether: a supervised runtime for LLM agents.",
        epilog="Exit status: 0 done, 1 failed, 2 bad usage, 3 halted by a budget, 130 cancelled.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    run = sub.add_parser("run", help="run one task to its end", description="Run one task.")
    run.add_argument("task", metavar="TASK", help="what the agent should do")
    ask = sub.add_parser(
        "ask",
        help="an interactive conversation",
        description="An interactive conversation. Ctrl-C cancels the current turn; "
        "Ctrl-D or /exit ends the session.",
    )
    serve = sub.add_parser(
        "serve",
        help="the live web page: watch, approve, cancel",
        description="Serve the web page and its JSON API. The model and tool options are the "
        "defaults for runs started from the page.",
    )
    w = serve.add_argument_group("server")
    w.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    w.add_argument("--port", type=int, default=8765, help="port (default: 8765)")
    w.add_argument(
        "--token",
        default=os.environ.get("TETHER_TOKEN"),
        help="access token (default: $TETHER_TOKEN, else a new one, printed)",
    )
    w.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow binding to an address other than loopback",
    )
    mcp = sub.add_parser(
        "mcp-serve",
        help="serve Tether's tools, and an agent as a tool, to MCP clients (stdio)",
        description="An MCP server over stdio: the selected tools, and run_agent, which gives a "
        "task to a Tether agent built from the model options (left out without a model key).",
    )
    for p in (run, ask, serve, mcp):
        add_run_options(p)
    resume = sub.add_parser(
        "resume",
        help="resume a durable run after a crash (no completed step repeats)",
        description="Resume a durable run from its store and follow it to its end.",
    )
    resume.add_argument("run_id", metavar="RUN_ID")
    resume.add_argument(
        "--force",
        action="store_true",
        help="take the run over even though its process may still run it (on another machine, "
        "where Tether cannot see whether it died)",
    )
    worker = sub.add_parser(
        "worker",
        help="execute queued durable runs (several workers can share one Postgres store)",
        description="Execute the runs queued with tether run --store URL --queue. Workers beat "
        "every --beat seconds; a worker silent for --dead-after seconds has its runs resumed "
        "by a live one.",
    )
    worker.add_argument("--executor-id", help="this worker's name (default: host-pid)")
    worker.add_argument("--concurrency", type=int, default=16, help="runs at once (default 16)")
    worker.add_argument("--beat", type=float, default=2.0, help="seconds between heartbeats")
    worker.add_argument(
        "--dead-after",
        type=float,
        default=10.0,
        help="seconds of silence after which a worker counts as dead",
    )
    runs = sub.add_parser("runs", help="list the runs of a durable store")
    send = sub.add_parser("send", help="send a message to a durable run (kept until it is read)")
    send.add_argument("run_id", metavar="RUN_ID")
    send.add_argument("text", metavar="TEXT")
    cancel = sub.add_parser("cancel", help="cancel a durable run")
    cancel.add_argument("run_id", metavar="RUN_ID")
    approve = sub.add_parser("approve", help="approve a durable run's waiting tool call")
    deny = sub.add_parser("deny", help="deny a durable run's waiting tool call")
    for p in (approve, deny):
        p.add_argument("run_id", metavar="RUN_ID")
        p.add_argument("approval_id", metavar="APPROVAL_ID")
    deny.add_argument("--reason", default="denied by the user")
    for p in (resume, runs, send, cancel, approve, deny, worker):
        p.add_argument(
            "--store",
            metavar="URL",
            help=f"sqlite:///PATH or postgresql://... (default: $TETHER_STORE, else {STORE_HELP})",
        )
        p.add_argument("--json", action="store_true", help="print JSON")
    show = sub.add_parser(
        "show",
        help="a past run: its transcript, events or ATIF trajectory",
        description="Show a run from its journal (tether run, ask and serve keep one).",
    )
    show.add_argument("run_id", metavar="RUN_ID")
    form = show.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="the events, one JSON object a line")
    form.add_argument("--atif", action="store_true", help="the ATIF trajectory (Harbor)")
    show.add_argument("--data-dir", default=str(data_dir()), help="where the journals are")
    show.add_argument("--store", metavar="URL", help="read a durable run from its store")
    return parser


def data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "tether"


STORE_HELP = "a SQLite file in the data directory"
STORE_COMMANDS = ("resume", "runs", "send", "cancel", "approve", "deny", "worker")


def resolve_store(args: argparse.Namespace) -> None:
    """Fill in `args.store`: the option, else $TETHER_STORE, else the default SQLite file;
    `memory` (None after this) keeps a run in this process only."""
    store = args.store or ""
    if not store and args.command in DURABLE_BY_DEFAULT:
        store = os.environ.get("TETHER_STORE") or ""
        if not store:
            path = data_dir() / "runs.sqlite"
            path.parent.mkdir(parents=True, exist_ok=True)
            store = f"sqlite:///{path}"
    args.store = None if store in ("", "memory") else store


DURABLE_BY_DEFAULT = (
    "run",
    "ask",
    "serve",
    "resume",
    "runs",
    "send",
    "cancel",
    "approve",
    "deny",
    "worker",
)


def add_run_options(p: argparse.ArgumentParser) -> None:
    m = p.add_argument_group("model")
    m.add_argument(
        "--provider",
        choices=PROVIDERS,
        default=os.environ.get("TETHER_PROVIDER"),
        help="wire protocol of the model (default: $TETHER_PROVIDER, else openai-chat; with no "
        "API key and the local extra installed, the bundled offline model)",
    )
    m.add_argument("--model", help="model name (default depends on the provider)")
    m.add_argument("--base-url", help="any compatible server, e.g. http://127.0.0.1:11434/v1")
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
    t = p.add_argument_group("tools")
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
    t.add_argument(
        "--mcp",
        action="append",
        default=[],
        metavar="COMMAND_OR_URL",
        help="use the tools of an MCP server: a command (stdio) or a streamable HTTP URL "
        "(repeatable)",
    )
    t.add_argument(
        "--tool-timeout",
        type=float,
        metavar="S",
        help="time limit for every tool call (default: each tool's own, 60 s)",
    )
    t.add_argument(
        "--workspace",
        default=".",
        metavar="DIR",
        help="directory the tools work in (default: the current one)",
    )
    b = p.add_argument_group("budgets (checked before every model call)")
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
    b.add_argument("--prices", metavar="FILE", help="JSON price table laid over the defaults")
    b.add_argument("--timeout", type=float, metavar="SECONDS", help="wall-clock limit for a run")
    b.add_argument(
        "--context-window",
        type=int,
        metavar="TOKENS",
        help="trim old tool outputs, then summarise older turns, to fit this window "
        "(default: the model's, where it is known; 0 turns it off)",
    )
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
        "work); bash still asks for approval unless --yolo",
    )
    o = p.add_argument_group("run")
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
        help="where durable runs are recorded: sqlite:///PATH or postgresql://..., or memory "
        f"for a run that is not recorded (default: $TETHER_STORE, else {STORE_HELP})",
    )
    o.add_argument(
        "--queue",
        action="store_true",
        help="with --store: queue the run for tether worker instead of running it here",
    )
    o.add_argument(
        "--data-dir",
        default=str(data_dir()),
        help=f"where run journals are kept, for tether show (default: {data_dir()})",
    )
    o.add_argument(
        "--log",
        metavar="FILE",
        help="append a structured log (JSON lines, secrets redacted) to FILE",
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "mcp-serve":
        from .cli_serve import command_mcp_serve

        return command_mcp_serve(args)
    if args.command == "show":
        return command_show(args)
    resolve_store(args)
    if args.command in STORE_COMMANDS and not args.store:
        print(f"tether: error: {args.command} needs a store (--store URL)", file=sys.stderr)
        return 2
    if args.command == "worker":
        from .cli_durable import command_worker

        return command_worker(args)
    if args.command in ("resume", "runs", "send", "cancel", "approve", "deny"):
        from .cli_durable import command_store

        return command_store(args)
    try:
        check_store_options(args)
        agent = build_agent(args)
    except ConfigError as e:
        print(f"tether: error: {e}", file=sys.stderr)
        return 2
    if args.command == "run":
        return command_run(agent, args)
    if args.command == "serve":
        from .cli_serve import command_serve

        return command_serve(agent, args)
    return command_ask(agent, args)


def check_store_options(args: argparse.Namespace) -> None:
    if args.queue and not args.store:
        raise ConfigError("--queue needs --store (the store whose workers will take the run)")


def build_agent(args: argparse.Namespace, tools: list[Tool] | None = None) -> Agent:
    for name in ("max_steps", "max_tokens", "max_input_tokens", "max_output_tokens", "max_retries"):
        value = getattr(args, name)
        if value is not None and value < 0:
            raise ConfigError(f"--{name.replace('_', '-')} must not be negative")
    workspace = Path(args.workspace)
    if not workspace.is_dir():
        raise ConfigError(f"--workspace: {args.workspace} is not a directory")
    if tools is None:
        tools = select_tools(args)
    if args.provider is None:
        args.provider = default_provider(args)
    settings = HTTPSettings(
        connect_timeout=args.connect_timeout,
        read_timeout=args.read_timeout,
        max_retries=args.max_retries,
    )
    model = make_model(
        args.provider,
        args.model,
        base_url=args.base_url,
        stream=not args.no_stream,
        settings=settings,
        script=args.script,
    )
    prices = load_prices(args.prices) if args.prices else None
    if args.max_cost is not None and price_for(model.name, prices) is None:
        raise ConfigError(
            f"--max-cost: no price is known for model {model.name!r}; give one with --prices FILE"
        )
    budget = Budget(
        max_steps=args.max_steps,
        max_input_tokens=args.max_input_tokens,
        max_output_tokens=args.max_output_tokens,
        max_tokens=args.max_tokens,
        max_cost_usd=args.max_cost,
        max_seconds=args.timeout,
    )
    window = getattr(args, "context_window", None)
    if window is None:
        window = window_for(model.name)
    if window is not None and window < 0:
        raise ConfigError("--context-window must not be negative")
    context = ContextPolicy(window, reserve=min(4096, window // 4)) if window else None
    return Agent(
        model,
        tools,
        system=args.system
        or (TERMINAL_SYSTEM if getattr(args, "profile", None) == "terminal" else DEFAULT_SYSTEM),
        budget=budget,
        prices=prices,
        context=context,
    )


def select_tools(args: argparse.Namespace) -> list[Tool]:
    default = TERMINAL_TOOLS if getattr(args, "profile", None) == "terminal" else DEFAULT_TOOLS
    spec = args.tools if args.tools is not None else ("none" if args.tools_from else default)
    tools: list[Tool] = []
    if spec.strip() != "none":
        for name in (n.strip() for n in spec.split(",") if n.strip()):
            if name not in BUILTINS:
                raise ConfigError(
                    f"--tools: no built-in tool {name!r}; known: {', '.join(BUILTINS)}"
                )
            tools.append(BUILTINS[name])
    for source in args.tools_from:
        tools.extend(load_tools(source))
    if args.tool_timeout is not None:
        tools = [dataclasses.replace(t, timeout=args.tool_timeout) for t in tools]
    return tools


def context_for(args: argparse.Namespace, run_id: str) -> RunContext:
    return RunContext(run_id=run_id, workspace=Path(args.workspace).resolve())


class TerminalApprover:
    """Asks at the terminal, one call at a time: `? allow bash({"command": "ls"})? [y/N]`."""

    def __init__(self, err: TextIO, can_ask: bool) -> None:
        self.err, self.can_ask = err, can_ask
        self.lock: asyncio.Lock | None = None

    async def __call__(self, request: ApprovalRequest) -> Decision:
        if not self.can_ask:
            return Decision(False, "no one at a terminal to approve it (--approve auto allows it)")
        self.lock = self.lock or asyncio.Lock()
        async with self.lock:
            args = orjson.dumps(request.call.arguments or {}).decode()
            self.err.write(f"  ? allow {request.call.name}({short(args, 500)})? [y/N] ")
            self.err.flush()
            answer = await asyncio.to_thread(sys.stdin.readline)
        if answer.strip().lower() in ("y", "yes"):
            return Decision(True, "approved at the terminal")
        return Decision(False, "the user said no")


def approver_for(args: argparse.Namespace, can_ask: bool) -> Approver:
    if args.approve == "auto":
        return approve_all
    if args.approve == "deny":
        return deny_all
    return TerminalApprover(sys.stderr, can_ask)


def command_run(agent: Agent, args: argparse.Namespace) -> int:
    run_id = args.run_id or uuid.uuid4().hex[:12]
    sink: Sink = json_sink(sys.stdout) if args.json else HumanOutput(sys.stdout, sys.stderr)
    approver = approver_for(args, can_ask=sys.stdin.isatty())
    # a durable run's record is its store; one in memory is journaled for `tether show`
    sinks = [sink, *journal_sinks(args, journal=not args.store)]
    if args.store and args.queue:
        from .cli_durable import command_enqueue

        return command_enqueue(agent, args, run_id)
    shutdown: Callable[[], Any] | None = None
    if args.otel:
        try:
            from .tracing import configure
        except ImportError:
            print(
                "tether: error: --otel needs the otel extra: pip install 'tether[otel]'",
                file=sys.stderr,
            )
            return 2
        span_sink, shutdown = configure()
        sinks.append(span_sink)
    if args.store:
        from .cli_durable import command_durable_run

        try:
            return command_durable_run(agent, args, run_id, sinks)
        finally:
            if shutdown is not None:
                shutdown()
    try:
        result = asyncio.run(
            supervised(agent, args.task, context_for(args, run_id), sinks, approver, args.mcp)
        )
    except ConfigError as e:
        print(f"tether: error: {e}", file=sys.stderr)
        return 2
    finally:
        if shutdown is not None:
            shutdown()
    if result.outcome == "cancelled":
        if not args.json:
            print("\n[cancelled]", file=sys.stderr)
        return 130
    if not args.json:
        report(result, sys.stderr)
    return result.exit_status


async def supervised(
    agent: Agent,
    task: str,
    ctx: RunContext,
    sinks: list[Sink],
    approver: Approver,
    mcp: list[str],
) -> RunResult:
    """One supervised run, its events read from the bus as any subscriber reads them.
    Ctrl-C cancels the run; its last events are still shown."""
    supervisor = Supervisor()
    stack = contextlib.AsyncExitStack()
    try:
        await add_mcp_tools(agent, mcp, stack)
    except ConfigError:
        await stack.aclose()
        await agent.model.aclose()
        raise
    run = supervisor.start(agent, task, run_id=ctx.run_id, context=ctx, approver=approver)
    shown = 0
    try:
        async for event in supervisor.bus.subscribe(run.id):
            for sink in sinks:
                sink(event)
            shown = event.seq + 1
    except asyncio.CancelledError:
        run.cancel()
        await run.wait()
        async for event in supervisor.bus.subscribe(run.id, offset=shown):
            for sink in sinks:
                sink(event)
        asyncio.current_task().uncancel()  # type: ignore[union-attr]
    finally:
        await stack.aclose()
        await agent.model.aclose()
    result = await run.wait()
    assert result is not None
    return result


def command_ask(agent: Agent, args: argparse.Namespace) -> int:
    if args.store:
        from .cli_durable import command_durable_ask

        return command_durable_ask(agent, args)
    session = args.run_id or uuid.uuid4().hex[:12]
    transcript: list[Message] = []
    sink: Sink = json_sink(sys.stdout) if args.json else HumanOutput(sys.stdout, sys.stderr)
    sinks = [sink, *journal_sinks(args)]
    interactive = sys.stdin.isatty()
    approver = approver_for(args, can_ask=True)  # answers come from the conversation's input
    status = 0
    stack = contextlib.AsyncExitStack()
    with asyncio.Runner() as runner:
        try:
            runner.run(add_mcp_tools(agent, args.mcp, stack))
        except ConfigError as e:
            print(f"tether: error: {e}", file=sys.stderr)
            runner.run(agent.model.aclose())
            return 2
        for turn, text in enumerate(user_lines(interactive), 1):
            ctx = context_for(args, f"{session}-{turn}")
            try:
                result = runner.run(
                    agent.run(
                        text, transcript=transcript, context=ctx, sinks=sinks, approver=approver
                    )
                )
            except KeyboardInterrupt:
                print("\n[turn cancelled; the conversation goes on]", file=sys.stderr)
                status = 130
                continue
            status = result.exit_status
            if not args.json:
                report(result, sys.stderr, quiet_done=True)
        runner.run(stack.aclose())
        runner.run(agent.model.aclose())
    return status


def user_lines(interactive: bool) -> Iterator[str]:
    """What the user types in `tether ask`, a line at a time, until EOF, Ctrl-C or /exit."""
    while True:
        try:
            line = input("you> " if interactive else "")
        except EOFError:
            return
        except KeyboardInterrupt:
            print(file=sys.stderr)
            return
        text = line.strip()
        if text in ("/exit", "/quit"):
            return
        if text:
            yield text


def json_sink(out: TextIO) -> Sink:
    scrubber = redactor()

    def write(event: Event) -> None:
        out.write(scrubber.scrub_bytes(event.to_json()).decode() + "\n")
        out.flush()

    return write


class HumanOutput:
    """Streams text to stdout and shows tool calls and short results on stderr."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        self.out, self.err = out, err
        self.streamed = False

    def __call__(self, event: Event) -> None:
        d = event.data
        if event.type == "text_delta":
            self.out.write(scrub(d["text"]))
            self.out.flush()
            self.streamed = True
        elif event.type == "model_response":
            if self.streamed:
                self.out.write("\n")
            elif d["text"]:
                self.out.write(d["text"] + "\n")
            self.out.flush()
            self.streamed = False
        elif event.type == "tool_call":
            args = orjson.dumps(d["arguments"]).decode()
            self.err.write(f"  → {d['name']}({short(args, 200)})\n")
        elif event.type == "tool_result":
            mark = "✗" if d["is_error"] else "←"
            self.err.write(f"  {mark} {d['name']}: {short(d['output'], 160)}\n")
        elif event.type == "approval_decided" and not d["approved"]:
            self.err.write(f"  ✗ not approved: {d['reason']}\n")
        elif event.type == "retry":
            self.err.write(
                f"  … retry {d['attempt']} in {d['delay']:.1f} s: {d['error']['message']}\n"
            )
        self.err.flush()


def short(text: str, limit: int) -> str:
    one = " ".join(text.split())
    return one if len(one) <= limit else one[: limit - 1] + "…"


def report(result: RunResult, err: TextIO, quiet_done: bool = False) -> None:
    u = result.usage
    figures = f"{result.steps} steps, {u.total_tokens} tokens, ${result.cost_usd:.4f}"
    if result.outcome == "done":
        if not quiet_done:
            err.write(f"[done] {figures}\n")
    elif result.outcome == "halted":
        err.write(f"[halted] {result.reason} ({figures})\n")
    elif result.outcome == "failed":
        err.write(f"tether: run failed: {result.reason}\n")
    err.flush()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


async def add_mcp_tools(agent: Agent, servers: list[str], stack: contextlib.AsyncExitStack) -> None:
    if not servers:
        return
    from .tools.mcp import mcp_tools

    for t in await stack.enter_async_context(mcp_tools(servers)):
        agent.toolbox.add(t)


def journal_sinks(args: argparse.Namespace, journal: bool = True) -> list[Sink]:
    """The journal (for tether show) and, with --log, the structured log."""
    from .journal import Journal

    sinks: list[Sink] = []
    try:
        if journal:
            sinks.append(Journal(Path(args.data_dir) / "events").write)
    except OSError as e:
        print(f"tether: warning: no journal in {args.data_dir}: {e}", file=sys.stderr)
    if args.log:
        log = open(args.log, "ab")  # noqa: SIM115 - lives as long as the process
        scrubber = redactor()

        def write_log(event: Event) -> None:
            if event.type == "text_delta":
                return
            level = "error" if event.type == "run_finished" and event.data.get("error") else "info"
            record = {"ts": event.ts, "level": level, "event": event.to_dict()}
            log.write(scrubber.scrub_bytes(orjson.dumps(record)) + b"\n")
            log.flush()

        sinks.append(write_log)
    return sinks


def command_show(args: argparse.Namespace) -> int:
    from .journal import Journal
    from .transcript import atif, readable

    journal = Journal(Path(args.data_dir) / "events")
    try:
        path = journal.path(args.run_id)
    except ValueError as e:
        print(f"tether: error: {e}", file=sys.stderr)
        return 2
    default = not args.store
    if default and not path.exists():  # not journaled: a durable run, in the store
        args.command = "run"
        resolve_store(args)
    if args.store:
        from . import durable

        try:
            events = durable.events_of(durable.client(args.store), args.run_id)
        except ConfigError as e:
            message = f"no run {args.run_id} in {journal.directory} or {args.store}"
            print(f"tether: error: {message if default else e}", file=sys.stderr)
            return 2
    else:
        events = journal.load(path)
    if args.json:
        for event in events:
            sys.stdout.write(event.to_json().decode() + "\n")
    elif args.atif:
        sys.stdout.write(orjson.dumps(atif(events), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(readable(events) + "\n")
    return 0


def default_provider(args: argparse.Namespace) -> str:
    """openai-chat, unless there is no key to use it with and the offline model is installed."""
    from .providers import local

    if os.environ.get("OPENAI_API_KEY") or args.base_url or not local.available():
        return "openai-chat"
    print(
        "tether: no OPENAI_API_KEY, so the bundled offline model SmolLM2-135M answers (small, "
        "for trying Tether); export OPENAI_API_KEY, or ANTHROPIC_API_KEY with --provider "
        "anthropic, for a real model",
        file=sys.stderr,
    )
    return "local"
