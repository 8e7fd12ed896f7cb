"""The commands on a store's runs: `resume` and `worker` execute runs (on a Runtime); `runs`,
`send`, `cancel`, `approve`, `deny` and `show` only read or message the store (a process that
only lists or approves must not pick up pending runs and then exit in the middle of them)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import socket
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import orjson

from ..errors import ConfigError, NoSuchRun, RunEnded, RunError, StoreUnavailable
from ..options import RunOptions, absolute, select_tools
from ..redact import scrub
from ..result import RunResult
from ..run_filter import RunFilter
from .common import (
    WorkerScope,
    cli_runtime,
    counted,
    default_store,
    error,
    exit_status,
    output_sink,
    stop_on_signals,
    terminal_safe,
    until_end,
    waiting,
)


def command_store(args: argparse.Namespace) -> int:
    if args.command == "resume":
        return command_resume(args)
    if args.command == "fork":
        return command_fork(args)
    if args.command == "migrate":
        return command_migrate(args)
    if args.command == "worker":
        return command_worker(args)
    from ..durable.view import client, list_runs

    if args.command == "runs" and not_made_yet(args):
        made = args.store.removeprefix("sqlite:///")
        print(f"no runs yet: the first tether run makes the store {made}", file=sys.stderr)
        return 0
    try:
        store = client(args.store)
        if args.command == "runs":
            states = args.state.split(",") if args.state else None
            if args.agent or args.search or args.account or args.limit is not None:
                flt = RunFilter(
                    frozenset(states or ()), args.agent or "", args.search or "", args.account or ""
                )
                listed = matching_runs(store, flt, args.limit)
            else:
                listed = list_runs(store, states)
            for line in listed:
                print(orjson.dumps(line).decode() if args.json else runs_line(line))
            return 0
        said = control(store, args)
    except (ConfigError, RunError) as e:  # RunEnded, NoSuchRun, QuestionError ...
        return error(str(e))
    print(said)
    return 0


def not_made_yet(args: argparse.Namespace) -> bool:
    """Whether the store is the default one, not made yet: a newcomer's first `tether runs`.
    (A store named by --store or $TETHER_STORE that is not there is an error: a typo.)"""
    url = args.store or ""
    if not getattr(args, "default_store", False) or not url.startswith("sqlite:///"):
        return False
    return not Path(url.removeprefix("sqlite:///")).exists()


def matching_runs(store: Any, flt: RunFilter, limit: int | None) -> list[dict[str, Any]]:
    """The store's runs that match, the `limit` most recent (all without), oldest first: read
    a page at a time, newest first, as the page's list reads them."""
    from ..durable.view import RUN_STATES, page_runs
    from ..run_filter import MAX_PAGE

    if limit is not None and limit < 1:
        raise ConfigError(f"--limit {limit}: give 1 or more")
    unknown = sorted(flt.states - set(RUN_STATES))
    if unknown:
        raise ConfigError(f"--state {', '.join(unknown)}: use {', '.join(RUN_STATES)}")
    found: list[dict[str, Any]] = []
    page = page_runs(store, flt, None, min(limit or MAX_PAGE, MAX_PAGE))
    found += page.rows
    while page.next is not None and (limit is None or len(found) < limit):
        wanted = MAX_PAGE if limit is None else min(limit - len(found), MAX_PAGE)
        page = page_runs(store, flt, page.next, wanted)
        found += page.rows
    return found[::-1]


def answer(store: Any, args: argparse.Namespace) -> str:
    """`tether answer RUN QUESTION JSON` (or `--decline`): kept in the store, checked against
    the question, for a run that has not ended."""
    from ..durable.remote import answer_question
    from ..durable.view import ENDED, ledger_for, status_of
    from ..questions import Answer

    if args.decline == (args.content is not None):
        raise ConfigError("give the answer as JSON, or --decline (not both)")
    content = None
    if args.content is not None:
        try:
            content = orjson.loads(args.content)
        except orjson.JSONDecodeError as e:
            raise ConfigError(f"the answer is not JSON: {e}") from None
        if not isinstance(content, dict):
            raise ConfigError('the answer is a JSON object of the fields asked for: {"name": ...}')
    status = status_of(store, args.run_id).status
    if status in ENDED:
        raise RunEnded(f"run {args.run_id} has ended ({status.lower()}): nothing to answer")
    given = (
        Answer("decline", reason="declined by the user")
        if args.decline
        else Answer("accept", content)
    )
    answer_question(ledger_for(args.store), args.run_id, args.question_id, given)
    said = "declined" if args.decline else "answered"
    return f"{said}: {args.question_id} of run {args.run_id}"


def command_migrate(args: argparse.Namespace) -> int:
    """`tether migrate`: what was rewritten, a line for each record left as it was (exit 1)."""
    from ..durable.migrate import migrate

    if args.store.startswith("sqlite") and not Path(args.store.removeprefix("sqlite:///")).exists():
        return error(f"no store at {args.store.removeprefix('sqlite:///')}")
    try:
        report = migrate(args.store)
    except ConfigError as e:
        return error(str(e))
    if args.json:
        print(orjson.dumps(dataclasses.asdict(report)).decode())
    elif report.rewritten:
        counts = ", ".join(f"{table} {n}" for table, n in report.rewritten.items())
        print(f"rewrote {sum(report.rewritten.values())} records as data ({counts})")
    else:
        print("nothing to rewrite: every record is in this version's format")
    for line in report.refused:
        print(f"tether migrate: left as it was (not readable as a record): {line}", file=sys.stderr)
    return 1 if report.refused else 0


def control(store: Any, args: argparse.Namespace) -> str:
    """`cancel`, `send`, `approve` or `deny` a run of the store: what was done, in one line. A
    run that cannot take it (ended, unknown, not waiting for that approval) is a ConfigError
    naming why; `cancel` of an ended run said nothing and exited 0, while `send` exited 2."""
    from ..durable.remote import answer_approval, cancel_run, send_message, upgrade_run
    from ..durable.view import ENDED, ledger_for, status_of

    run_id = args.run_id
    if args.command == "cancel":
        status = status_of(store, run_id).status
        if status in ENDED:
            raise RunEnded(f"run {run_id} has ended ({status.lower()}): nothing to cancel")
        cancel_run(store, ledger_for(args.store), run_id)
        return f"cancelled run {run_id} (what it completed is kept)"
    if args.command == "upgrade":
        was, now = upgrade_run(store, ledger_for(args.store), run_id, args.to)
        return f"run {run_id} goes on under version {now} (was {was}): a worker of it takes it"
    if args.command == "send":
        send_message(store, ledger_for(args.store), run_id, args.text)
        return f"sent to run {run_id}: it reads the message before its next model call"
    if args.command == "answer":
        return answer(store, args)
    approved = args.command == "approve"
    reason = "approved by the user" if approved else args.reason
    reply = {"approved": approved, "reason": reason}
    answer_approval(store, run_id, args.approval_id, reply, getattr(args, "args_hash", None))
    done = "approved" if approved else f"denied ({reason})"
    return f"{done}: {args.approval_id} of run {run_id}"


def runs_line(r: dict[str, Any]) -> str:
    """id, when it was queued or started, state (with its worker while it runs, the approvals
    it waits for, or the command that resumes it), steps, cost, the agent and its version
    (`agent@version`) and task, a tab between each."""
    since = r["started_at"] or r["queued_at"] or 0
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since))
    waits = "; ".join(
        f"{what} ({', '.join(r[key])})"
        for key, what in (("approvals", "approval"), ("questions", "an answer"))
        if r.get(key)
    )
    states = {
        "running": f"running on {r['worker']}",
        "waiting": f"waiting for {waits}",
        "interrupted": f"interrupted: its process died (tether resume {r['id']})",
    }
    if r["state"] == "interrupted" and waits:
        states["interrupted"] += f"; waits for {waits}"
    state = states.get(r["state"], r["state"])
    if r.get("waiting_for_version"):  # queued where no live worker has its version
        state = f"waiting for version {r['waiting_for_version']}"
    steps = "" if r["steps"] is None else counted(r["steps"], "step")
    cost = "" if r["cost_usd"] is None else f"${r['cost_usd']:.4f}"
    task = " ".join(r["task"].split())
    task = task if len(task) <= 60 else task[:59] + "…"
    version = f"{r['agent']}@{r['version']}" if r.get("version") else ""
    safe = terminal_safe  # a task is anyone's text: shown without escapes, C1 controls too
    return "\t".join(
        [r["id"], when, safe(state), steps, cost, safe(scrub(version)), safe(scrub(task))]
    )


def command_resume(args: argparse.Namespace) -> int:
    """Execute a run of the store in this process to its end (no completed step repeats)."""
    sinks = [output_sink(args.json), waiting(args.run_id)]

    async def go() -> RunResult:
        stop_on_signals()
        async with cli_runtime(
            args.store, data=args.data_dir, take_over=False, store_patience=args.store_patience
        ) as rt:
            run = await rt.resume(args.run_id, sinks=sinks, force=args.force)
            return await until_end(run)

    return finish(go, args)


def finish(go: Callable[[], Coroutine[Any, Any, RunResult]], args: argparse.Namespace) -> int:
    """Run `go` (a run followed to its end here) and say how it ended, as `tether run` does."""
    try:
        result = asyncio.run(go())
    except (ConfigError, RunError) as e:
        return error(str(e))
    except (KeyboardInterrupt, asyncio.CancelledError):  # Ctrl-C, SIGTERM or SIGHUP
        print("\n[cancelled]", file=sys.stderr)
        return 130
    except StoreUnavailable:
        raise  # said by main
    except Exception as e:  # the workflow failed inside DBOS
        print(f"tether: run {args.run_id} did not finish: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return exit_status(result, args.json)


def command_fork(args: argparse.Namespace) -> int:
    """Start a fork of a run of the store (`Runtime.fork`) and follow it to its end here."""
    results: dict[str, str] = {}
    for given in args.result:
        call_id, sep, text = given.partition("=")
        if not sep or not call_id:
            return error(f"--result {given!r}: write it CALL_ID=TEXT")
        results[call_id] = text
    sinks = [output_sink(args.json), waiting()]

    async def go() -> RunResult:
        stop_on_signals()
        async with cli_runtime(
            args.store, data=args.data_dir, take_over=False, store_patience=args.store_patience
        ) as rt:
            fork = await rt.fork(
                args.run_id,
                at=args.at,
                message=args.message,
                results=results,
                fork_id=args.fork_id,
                sinks=sinks,
            )
            print(
                f"tether: run {fork.id}: a fork of {args.run_id} at step {args.at}", file=sys.stderr
            )
            return await until_end(fork)

    return finish(go, args)


WORKER_TOOL_OPTIONS = (
    "tools", "tools_from", "mcp", "mcp_auth", "guardrails", "tool_timeout", "tool_env",
    "workspace",
)  # fmt: skip


def worker_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The run options a worker's command line sets for every run it executes, checked now
    (a tools file that does not load is an error before the worker takes any run)."""
    given = {k: getattr(args, k) for k in WORKER_TOOL_OPTIONS if getattr(args, k) is not None}
    if "workspace" in given:
        given["workspace"] = str(Path(given["workspace"]).resolve())
    if "mcp_auth" in given:
        given["mcp_auth"] = str(Path(given["mcp_auth"]).resolve())
    if "guardrails" in given:
        given["guardrails"] = [absolute(f) for f in given["guardrails"]]
    if "tools_from" in given:
        given["tools_from"] = [absolute(f) for f in given["tools_from"]]
        if "tools" not in given:
            given["tools"] = "none"  # as `tether run --tools-from` does
    if args.sandbox is not None:
        given.update(sandbox=args.sandbox, sandbox_net=args.sandbox_net)
    options = RunOptions(**given).resolved()  # the tools load here, or a one-line error
    select_tools(options)
    return given


def command_worker(args: argparse.Namespace) -> int:
    try:
        scope = WorkerScope(worker_overrides(args), frozenset(args.allow_base_url or ()))
    except ConfigError as e:
        return error(str(e))
    executor_id = args.executor_id or f"{socket.gethostname()}-{os.getpid()}"
    print(
        f"tether worker {executor_id}: taking queued runs from the store",
        file=sys.stderr,
        flush=True,
    )

    async def go() -> None:
        settings = {
            "executor_id": executor_id,
            "store_connections": args.store_connections,
            "store_patience": args.store_patience,
        }
        stop_on_signals()
        async with cli_runtime(
            args.store, scope, data=args.data_dir, take_over=False, **settings
        ) as rt:
            await rt.work(args.concurrency, args.beat, args.dead_after)

    try:
        asyncio.run(go())
    except ConfigError as e:
        return error(str(e))
    except (KeyboardInterrupt, asyncio.CancelledError):  # Ctrl-C, SIGTERM or SIGHUP: its
        print(  # runs stop here and stay in the store, for another worker or this one again
            f"tether worker {executor_id}: stopped; its runs stay in the store",
            file=sys.stderr,
        )
        return 0
    return 0


def command_show(args: argparse.Namespace) -> int:
    from ..events import Event
    from ..journal import Journal
    from ..transcript import atif, readable

    journal = Journal(Path(args.data_dir) / "events")
    try:
        path = journal.path(args.run_id)
    except ValueError as e:
        return error(str(e))
    default = not args.store
    store = args.store
    if default and not path.exists():  # not journaled: a durable run, in the store
        store = default_store(args.data_dir)
    if store:
        from ..durable.retold import events_of
        from ..durable.view import client

        try:
            opened = client(store)
            events = events_of(opened, args.run_id)
        except (ConfigError, NoSuchRun) as e:
            return error(
                f"no run {args.run_id} in {journal.directory} or {store}" if default else str(e)
            )

        def load(run_id: str) -> list[Event] | None:
            try:
                return events_of(opened, run_id)
            except NoSuchRun:  # the call started none
                return None

    else:

        def load(run_id: str) -> list[Event] | None:
            child = journal.path(run_id)
            return journal.load(child) if child.exists() else None

        events = journal.load(path)
    if args.json:
        for event in events:
            sys.stdout.write(event.to_json().decode() + "\n")
    elif args.atif:
        sys.stdout.write(orjson.dumps(atif(events), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:  # an agent's children (agents used as tools) nested where it called them
        sys.stdout.write(terminal_safe(readable(events, load)) + "\n")
        if store:
            sys.stdout.write(where_it_stands(opened, args.run_id))
    return 0


def where_it_stands(store: Any, run_id: str) -> str:
    """A line under a durable run's transcript when it waits for someone: for a person's
    approval (with the commands that decide it), or for a process to resume it."""
    from ..durable.view import listing, status_of, waiting_state

    row = waiting_state(store, listing(status_of(store, run_id)))
    lines = []
    if row["state"] in ("waiting", "interrupted"):
        lines += [
            f"[waiting for approval ({a})] tether approve {run_id} {a}   "
            f"(or tether deny {run_id} {a})"
            for a in row.get("approvals") or []
        ]
        lines += [
            f"[waiting for an answer ({q})] tether answer {run_id} {q} JSON   "
            f"(or tether answer {run_id} {q} --decline)"
            for q in row.get("questions") or []
        ]
    if row["state"] == "interrupted":
        lines.append(f"[interrupted: its process died] tether resume {run_id} goes on with it")
    return "".join(line + "\n" for line in lines)
