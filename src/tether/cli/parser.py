"""The `tether` command line, declared once: its commands and their options (`main` turns what
they parse into typed options, `options.RunOptions`)."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, NoReturn

from ..journal import STORE_FORMS
from ..version import __version__
from .common import STORE_HELP, data_dir
from .limits import limits_command
from .run_options import add_run_options, patience_option


class Parser(argparse.ArgumentParser):
    """argparse's parser, its usage errors in one line that says where the help is (a wrong
    `--provider` printed 22 lines of usage above the one that mattered)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="tether",
        description="Tether: a supervised runtime for LLM agents.",
        epilog="Exit status: 0 done, 1 failed, 2 bad usage, 3 halted by a budget, 130 cancelled.",
    )
    parser.add_argument("--version", action="version", version=f"tether {__version__}")
    sub: Subparsers = parser.add_subparsers(  # type: ignore[assignment]
        dest="command", metavar="COMMAND", required=True
    )  # its parsers are `Parser`s (one-line errors), read as argparse's
    run_commands(sub)
    store_commands(sub)
    show_command(sub)
    images_command(sub)
    return parser


def images_command(sub: Subparsers) -> None:
    images = sub.add_parser(
        "images",
        help="the Harbor task images the sandbox built and keeps: list or clear them",
        description="The images SandboxEnvironment built from tasks' Dockerfiles, kept in "
        "$XDG_CACHE_HOME/tether/harbor-images (~/.cache/...) and reused by every trial of a "
        "task: each with its size and last use. The cache holds at most "
        "$TETHER_HARBOR_CACHE_GB (default 20) GB; past it the least recently used go after a "
        "build. --clear removes every one no trial or build uses now.",
    )
    images.add_argument("--clear", action="store_true", help="remove them (those not in use)")
    images.add_argument("--json", action="store_true", help="one JSON object an image")


if TYPE_CHECKING:  # not subscriptable at run time
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def run_commands(sub: Subparsers) -> None:
    """The commands that run agents: run, ask, serve, mcp-serve (each with the run options)."""
    run = sub.add_parser("run", help="run one task to its end", description="Run one task.")
    run.add_argument("task", metavar="TASK", nargs="?", help="what the agent should do")
    run.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="FILE",
        help="an image (PNG, JPEG, GIF, WebP) for the model to see with the task; repeatable",
    )
    run.add_argument(
        "--tasks",
        metavar="FILE",
        help="with --queue: queue one run per line of FILE (- for standard input), all at "
        "once, and print their ids (with --run-id ID they are ID-1, ID-2, ...)",
    )
    ask = sub.add_parser(
        "ask",
        help="an interactive conversation",
        description="An interactive conversation. Ctrl-C cancels the current turn; "
        "Ctrl-D or /exit ends the session.",
    )
    serve = serve_command(sub)
    mcp = mcp_serve_command(sub)
    for p in (run, ask, serve, mcp):
        add_run_options(p)


def serve_command(sub: Subparsers) -> argparse.ArgumentParser:
    serve = sub.add_parser(
        "serve",
        help="the live web page: watch, approve, cancel",
        description="Serve the web page and its JSON API. The model and tool options are the "
        "defaults for runs started from the page.",
    )
    w = serve.add_argument_group("server")
    w.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    port_and_token(w, 8765, "access token")
    w.add_argument(
        "--max-runs",
        type=int,
        default=64,
        metavar="N",
        help="runs of the page executed at once; more wait in a queue, shown (default: 64)",
    )
    connections_option(w)
    w.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds a connection has to send its first request's headers (default: 10)",
    )
    w.add_argument(
        "--max-connections",
        type=int,
        default=512,
        metavar="N",
        help="connections open at once; more are closed as they arrive (default: 512)",
    )
    w.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow binding to an address other than loopback",
    )
    w.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a name the page is reached by, beyond the bound address and localhost; other "
        "Host headers are refused (repeatable; with --host 0.0.0.0 and none given, any is taken)",
    )
    return serve


def mcp_serve_command(sub: Subparsers) -> argparse.ArgumentParser:
    mcp = sub.add_parser(
        "mcp-serve",
        help="serve Tether's tools, and an agent as a tool, to MCP clients (stdio or HTTP)",
        description="An MCP server over stdio (or streamable HTTP with --http): the selected "
        "tools, and run_agent, which gives a task to a Tether agent built from the model options "
        "(left out without a model key).",
    )
    h = mcp.add_argument_group("over HTTP")
    h.add_argument(
        "--http",
        action="store_true",
        help="serve streamable HTTP at http://127.0.0.1:PORT/mcp instead of stdio",
    )
    port_and_token(h, 8766, "the bearer token clients must send")
    h.add_argument(
        "--no-token",
        action="store_true",
        help="take requests without a token (for a local client that cannot send one; the "
        "Host and Origin checks still hold)",
    )
    return mcp


def fork_command(sub: Subparsers) -> argparse.ArgumentParser:
    fork = sub.add_parser(
        "fork",
        help="start a new run from a run's conversation as it stood after one of its steps",
        description="Start a new run from RUN_ID's conversation as it stood after step STEP "
        "(its STEP-th model reply and what followed it), and follow it to its end. Nothing of "
        "those steps runs again; the original run is untouched.",
    )
    fork.add_argument("run_id", metavar="RUN_ID")
    fork.add_argument(
        "--at", type=int, required=True, metavar="STEP", help="the step to start after (0: none)"
    )
    fork.add_argument("--run-id", dest="fork_id", metavar="ID", help="the new run's id")
    fork.add_argument("--message", metavar="TEXT", help="a user message the fork starts with")
    fork.add_argument(
        "--result",
        action="append",
        default=[],
        metavar="CALL_ID=TEXT",
        help="replace the output of one of those steps' tool calls (repeatable)",
    )
    return fork


def store_commands(sub: Subparsers) -> None:
    """The commands on a store's runs, wherever they execute."""
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
    fork = fork_command(sub)
    worker = worker_command(sub)
    limits = limits_command(sub)
    runs = runs_command(sub)
    send = sub.add_parser("send", help="send a message to a durable run (kept until it is read)")
    send.add_argument("run_id", metavar="RUN_ID")
    send.add_argument("text", metavar="TEXT")
    cancel = sub.add_parser("cancel", help="cancel a durable run")
    cancel.add_argument("run_id", metavar="RUN_ID")
    upgrade = upgrade_command(sub)
    approve, deny, answer = decision_commands(sub)
    migrate = sub.add_parser(
        "migrate",
        help="rewrite a store written before 0.1.0 (pickled records) as records, once",
        description="Rewrite a store's pickled records (Tether before 0.1.0) as records. Each "
        "is read by an unpickler that builds Tether's own types only: one that names anything "
        "else is left as it was, named, and the command exits 1. Stop the store's workers "
        "first; running it again changes nothing more.",
    )
    for p in (
        *(resume, fork, runs, send, cancel, upgrade, approve, deny),
        *(worker, migrate, answer, limits),
    ):
        p.add_argument(
            "--store",
            metavar="URL",
            help=f"{STORE_FORMS} (default: $TETHER_STORE, else {STORE_HELP})",
        )
        p.add_argument("--json", action="store_true", help="print JSON")
        p.add_argument(
            "--data-dir", default=str(data_dir()), help="where the default store is kept"
        )
    for p in (resume, fork, worker):
        patience_option(p)


def runs_command(sub: Subparsers) -> argparse.ArgumentParser:
    """`tether runs`: the store's runs, filtered."""
    runs = sub.add_parser("runs", help="list the runs of a durable store")
    runs.add_argument(
        "--state",
        metavar="STATES",
        help="only runs in these states, comma-separated: queued, running, waiting (for "
        "approval), done, halted, failed, cancelled",
    )
    runs.add_argument("--agent", metavar="NAME", help="only runs of this agent")
    runs.add_argument("--account", metavar="NAME", help="only runs of this account")
    runs.add_argument(
        "--search", metavar="TEXT", help="only runs whose task, id or agent holds TEXT (any case)"
    )
    runs.add_argument(
        "--limit",
        metavar="N",
        type=int,
        help="the N most recent runs that match (read newest first by the store's index, so "
        "as fast in a store of 100,000 runs as of 100); still printed oldest first",
    )
    return runs


def upgrade_command(sub: Subparsers) -> argparse.ArgumentParser:
    """`tether upgrade`: a waiting run moved to another version of its agent."""
    upgrade = sub.add_parser(
        "upgrade",
        help="move a run that waits for its agent's version to another version",
        description="A run goes on under the version of its agent it began with: a worker "
        "executes only the versions it has, and a run whose version no live worker has waits "
        "(tether runs: waiting for version 1). An upgrade moves it to another version's queue: "
        "a worker of that version takes it and goes on from its last recorded step under the "
        "new definition (nothing it completed runs again; a call in flight whose tool is gone "
        "gets an error result that says so).",
    )
    upgrade.add_argument("run_id", metavar="RUN_ID")
    upgrade.add_argument(
        "--to",
        metavar="VERSION",
        help="the version (default: the one other that live workers have)",
    )
    return upgrade


def decision_commands(sub: Subparsers) -> tuple[argparse.ArgumentParser, ...]:
    """`tether approve`, `deny` and `answer`: a person's word to a waiting run."""
    approve = sub.add_parser("approve", help="approve a durable run's waiting tool call")
    deny = sub.add_parser("deny", help="deny a durable run's waiting tool call")
    for p in (approve, deny):
        p.add_argument("run_id", metavar="RUN_ID")
        p.add_argument("approval_id", metavar="APPROVAL_ID")
    deny.add_argument("--reason", default="denied by the user")
    approve.add_argument(
        "--args-hash",
        metavar="SHA256",
        help="approve only if the call waiting is for these arguments (the args_hash of its "
        "approval_requested event)",
    )
    answer = sub.add_parser(
        "answer",
        help="answer a question a durable run's tool asked (an MCP server's elicitation)",
        description="Answer a question a run waits on (its question_asked event, or the line "
        "the run printed): JSON of the fields asked for, or --decline. The answer is kept in "
        "the store: the process running the run takes it at once, a resumed run when the "
        "question is asked again.",
    )
    answer.add_argument("run_id", metavar="RUN_ID")
    answer.add_argument("question_id", metavar="QUESTION_ID")
    answer.add_argument("content", metavar="JSON", nargs="?", help="e.g. '{\"quantity\": 2}'")
    answer.add_argument("--decline", action="store_true", help="refuse to answer")
    return approve, deny, answer


def worker_command(sub: Subparsers) -> argparse.ArgumentParser:
    worker = sub.add_parser(
        "worker",
        help="execute queued durable runs (several workers can share one Postgres store)",
        description="Execute the runs queued with tether run --store URL --queue. Workers beat "
        "every --beat seconds; a worker silent for --dead-after seconds has its runs resumed "
        "by a live one.",
    )
    worker.add_argument("--executor-id", help="this worker's name (default: host-pid)")
    worker.add_argument("--concurrency", type=int, default=16, help="runs at once (default 16)")
    connections_option(worker)
    worker.add_argument("--beat", type=float, default=2.0, help="seconds between heartbeats")
    worker.add_argument(
        "--dead-after",
        type=float,
        default=10.0,
        help="seconds of silence after which a worker counts as dead",
    )
    worker_tool_options(worker)
    return worker


def show_command(sub: Subparsers) -> None:
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


def worker_tool_options(p: argparse.ArgumentParser) -> None:
    """A worker's tool options: what it runs every run it executes with (this machine's copy
    of the tools, its workspace, the variables bash may see here, its sandbox). A run's record
    never supplies code, a secret or a reach to a worker (`cli.common.WORKER_OWN`): a run that
    names a tools file, an MCP server or guardrails the worker was not given is refused, and
    a run's model endpoint must be a provider's own or one of `--allow-base-url`."""
    t = p.add_argument_group(
        "tools of the runs this worker executes (its own: a run's record names them, never "
        "supplies them)"
    )
    t.add_argument("--tools", metavar="NAME,NAME|none", help="built-in tools")
    t.add_argument("--tools-from", action="append", metavar="FILE_OR_MODULE", help="@tool "
                   "functions from a Python file or module (repeatable)")  # fmt: skip
    t.add_argument("--mcp", action="append", metavar="COMMAND_OR_URL", help="an MCP server's "
                   "tools (repeatable)")  # fmt: skip
    t.add_argument("--mcp-auth", metavar="FILE", help="how to sign in to the remote MCP "
                   "servers (see tether run --help)")  # fmt: skip
    t.add_argument("--tool-timeout", type=float, metavar="S", help="time limit of every call")
    t.add_argument("--tool-env", action="append", metavar="NAME", help="an environment "
                   "variable bash may see here (repeatable)")  # fmt: skip
    t.add_argument("--workspace", metavar="DIR", help="the directory the tools work in here")
    t.add_argument("--sandbox", action=argparse.BooleanOptionalAction, default=None,
                   help="run every run's bash in bubblewrap, or in none")  # fmt: skip
    t.add_argument("--sandbox-net", action="store_true", help="with --sandbox: the network")
    t.add_argument("--guardrails", action="append", metavar="FILE_OR_MODULE", help="the "
                   "guardrails of a Python file or module (repeatable)")  # fmt: skip
    t.add_argument("--allow-base-url", action="append", metavar="URL", help="a model "
                   "endpoint this worker's keys may be sent to, beside each provider's own: a "
                   "run queued with --base-url URL needs it (repeatable)")  # fmt: skip


def port_and_token(group: argparse._ActionsContainer, port: int, token: str) -> None:
    """A server's port and the token its clients must send (the page's, `mcp-serve --http`'s)."""
    group.add_argument(
        "--port", type=int, default=port, help=f"port (default: {port}; 0: a free one)"
    )
    group.add_argument(
        "--token",
        default=os.environ.get("TETHER_TOKEN"),
        help=f"{token} (default: $TETHER_TOKEN, else a new one, printed)",
    )


def connections_option(group: argparse._ActionsContainer) -> None:
    group.add_argument(
        "--store-connections",
        type=int,
        default=20,
        metavar="N",
        help="connections to the store for the runs this process executes; steps wait for "
        "one in turn (default: 20; Postgres allows 100 in all by default)",
    )
