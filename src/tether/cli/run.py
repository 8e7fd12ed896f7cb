"""`tether run TASK` (one task to its end) and `tether ask` (a conversation), on a Runtime: in
memory with `--store memory`, else recorded in the store (durable by default)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..approvals import Approver, approve_all, deny_all
from ..errors import AccountOverBudget, ConfigError, RunError
from ..events import Sink
from ..messages import ImagePart, Message
from ..options import CLI_AGENT, RunOptions
from ..result import RunResult
from ..runtime import Runtime, context_for
from .common import (
    TerminalApprover,
    asker_for,
    cli_runtime,
    error,
    exit_status,
    inline_approvals,
    journal_sinks,
    output_sink,
    report,
    stop_on_signals,
    until_end,
    waiting,
)


def command_run(args: argparse.Namespace, options: RunOptions) -> int:
    run_id = args.run_id or uuid.uuid4().hex[:12]
    if args.store and args.queue:
        return command_enqueue(args, options, run_id)
    # a durable run's record is its store; one in memory is journaled for `tether show`
    sinks = [output_sink(args.json), *journal_sinks(args.data_dir, args.log, not args.store)]
    shutdown: Callable[[], Any] | None = None
    if args.otel:
        try:
            from ..tracing import configure
        except ImportError:
            return error("--otel needs the otel extra: pip install 'tether-runtime[otel]'")
        span_sink, shutdown = configure()
        sinks.append(span_sink)
    try:
        images = tuple(load_image(path) for path in args.image)
        result = asyncio.run(run_task(args, options, run_id, sinks, images))
    except AccountOverBudget as e:  # refused before it started: a budget's exit status
        print(f"tether: {e}", file=sys.stderr)
        return 3
    except (ConfigError, RunError) as e:
        return error(str(e))
    except (KeyboardInterrupt, asyncio.CancelledError):  # before the run was started
        print("\n[cancelled]", file=sys.stderr)
        return 130
    finally:
        if shutdown is not None:
            shutdown()
    return exit_status(result, args.json)


def load_image(path: str) -> ImagePart:
    """`--image FILE`, read and checked before anything starts."""
    try:
        return ImagePart.load(path)
    except OSError as e:
        raise ConfigError(f"--image {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise ConfigError(f"--image {e}") from None


async def run_task(
    args: argparse.Namespace,
    options: RunOptions,
    run_id: str,
    sinks: list[Sink],
    images: tuple[ImagePart, ...] = (),
) -> RunResult:
    stop_on_signals()
    asker = asker_for(options.approve, sys.stdin.isatty(), args.store is not None)
    rt = cli_runtime(
        args.store,
        asker=asker,
        data=args.data_dir,
        take_over=False,
        store_patience=args.store_patience,
    )
    try:
        await ready(rt, options)
        return await one_run(rt, args, options, args.task, run_id, sinks, [], images=images)
    finally:
        await rt.close()


async def one_run(
    rt: Runtime,
    args: argparse.Namespace,
    options: RunOptions,
    task: str,
    run_id: str,
    sinks: list[Sink],
    history: list[Message],
    can_ask: bool | None = None,
    images: tuple[ImagePart, ...] = (),
) -> RunResult:
    """Start a run of the options' agent and show it to its end. The agent is built first (MCP
    servers connected), so a bad option is an error before anything is recorded."""
    recorded = options.to_dict()
    approver, extra = approvals(rt, options, run_id, can_ask)
    run = await rt.start(
        CLI_AGENT,
        task,
        run_id=run_id,
        options=recorded,
        context=context_for(recorded),
        history=history,
        approver=approver,
        sinks=[*sinks, *extra],
        images=images,
    )
    return await until_end(run)


def approvals(
    rt: Runtime, options: RunOptions, run_id: str, can_ask: bool | None
) -> tuple[Approver | None, list[Sink]]:
    """Who decides calls that need approval: a policy, or the person at this terminal. With no
    terminal, a run in memory denies them, a durable one waits for `tether approve`."""
    if options.approve == "auto":
        return approve_all, []
    if options.approve == "deny":
        return deny_all, []
    if can_ask is None:
        can_ask = sys.stdin.isatty()
    if can_ask:
        return None, [inline_approvals(rt, run_id)]
    if rt.store is None:
        return TerminalApprover(sys.stderr, can_ask=False), []
    return None, [waiting(run_id)]


def command_ask(args: argparse.Namespace, options: RunOptions) -> int:
    """A conversation: each turn is a run that starts from the conversation so far (recorded
    in the store, unless --store memory); Ctrl-C cancels the turn and keeps what it completed."""
    session = args.run_id or uuid.uuid4().hex[:12]
    transcript: list[Message] = []
    sinks = [output_sink(args.json), *journal_sinks(args.data_dir, args.log, not args.store)]
    interactive = sys.stdin.isatty()
    status = 0
    asker = asker_for(options.approve, interactive, args.store is not None)
    rt = cli_runtime(
        args.store,
        asker=asker,
        data=args.data_dir,
        take_over=False,
        store_patience=args.store_patience,
    )
    with asyncio.Runner() as runner:
        try:
            runner.run(ready(rt, options))
        except ConfigError as e:
            runner.run(rt.close())
            return error(str(e))
        for turn, text in enumerate(user_lines(interactive), 1):
            run_id = f"{session}-{turn}"
            turn_run = one_run(rt, args, options, text, run_id, sinks, list(transcript), True)
            try:
                result = runner.run(turn_run)
            except KeyboardInterrupt:  # before the turn was started
                result = None
            except (ConfigError, RunError) as e:
                print(f"tether: turn {run_id} did not start: {e}", file=sys.stderr)
                status = 2
                continue
            if result is not None:
                transcript[:] = result.messages or transcript
            if result is None or result.outcome == "cancelled":
                print("\n[turn cancelled; the conversation goes on]", file=sys.stderr)
                status = 130
                continue
            status = result.exit_status
            if not args.json:
                report(result, sys.stderr, quiet_done=True)
        runner.run(rt.close())
    return status


async def ready(rt: Runtime, options: RunOptions) -> None:
    """Build the agent, then open the runtime: a bad option or MCP server is an error before
    the store is opened."""
    await rt.agent_for(CLI_AGENT, options.to_dict())
    await rt.open()


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


def command_enqueue(args: argparse.Namespace, options: RunOptions, run_id: str) -> int:
    """`tether run --queue`: record the run (or, with --tasks, one run per line, all in one
    transaction) on the store's queue for `tether worker`, and print the ids."""
    from ..options import build_agent

    try:
        tasks = [args.task] if args.tasks is None else read_tasks(args.tasks)
        if args.tasks is None:
            ids = [run_id]
        elif args.run_id:
            ids = [f"{args.run_id}-{n}" for n in range(1, len(tasks) + 1)]
        else:
            ids = None
        agent = build_agent(options)  # a bad option is an error before anything is queued
        asyncio.run(agent.model.aclose())  # the run is built again by the worker
        rt = Runtime(args.store, [agent])
        approver, _ = approvals(rt, options, run_id, can_ask=False)
        context = context_for(options.to_dict())
        queued = rt.enqueue_many(
            CLI_AGENT,
            tasks,
            run_ids=ids,
            options=options.to_dict(),
            context=context,
            approver=approver,
        )
    except ConfigError as e:
        return error(str(e))
    except AccountOverBudget as e:  # as a run over its account's limit is refused: exit 3
        print(f"tether: {e}", file=sys.stderr)
        return 3
    print("\n".join(queued))
    return 0


def read_tasks(path: str) -> list[str]:
    """The tasks of a --tasks file (or standard input): one a line, blank lines skipped."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--tasks {path}: cannot read it ({e})") from None
    tasks = [line.strip() for line in text.splitlines() if line.strip()]
    if not tasks:
        raise ConfigError(f"--tasks {path}: no tasks in it (one a line)")
    return tasks
