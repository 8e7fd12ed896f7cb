"""The durable-run commands: `run --store` (and `--queue`), `resume`, `runs`, `cancel`,
`approve`, `deny` and `worker`."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid
from collections.abc import Callable
from typing import Any

import orjson

from .agent import Agent, RunResult
from .cli import HumanOutput, json_sink, report
from .errors import ConfigError
from .events import Event, Sink
from .messages import Message, Usage
from .pricing import Price, price_for


def command_durable_run(
    agent: Agent, args: argparse.Namespace, run_id: str, sinks: list[Sink]
) -> int:
    """A run recorded in --store: it survives a crash and `tether resume` finishes it."""
    from . import durable

    async def go() -> dict[str, Any]:
        if args.approve == "ask":
            sinks.append(inline_approvals(run_id) if sys.stdin.isatty() else waiting(run_id))
        emitter = durable.watch(run_id, sinks)
        emitter.emit(
            "run_started",
            task=args.task,
            provider=agent.model.provider,
            model=agent.model.name,
            store=args.store.split("@")[-1],
        )
        await agent.model.aclose()  # the workflow builds its own, in whichever process runs it
        # build it here first (MCP servers connected): a bad option is an error before the
        # run is recorded, and the run, executed by this process, finds it ready
        await durable.agent_for(run_id, durable.spec_of(args))
        handle = await durable.start(args.store, run_id, args, args.task)
        try:
            result: dict[str, Any] = await handle.get_result()
        except asyncio.CancelledError:
            await durable.cancel(run_id)
            raise
        return result

    return finish_durable(go, run_id, sinks, args)


def command_durable_ask(agent: Agent, args: argparse.Namespace) -> int:
    """`tether ask` with a store: each turn is a durable run that starts from the conversation
    so far; Ctrl-C cancels the turn and keeps what it had completed."""
    from . import durable
    from .cli import journal_sinks, user_lines

    session = args.run_id or uuid.uuid4().hex[:12]
    transcript: list[Message] = []
    sink: Sink = json_sink(sys.stdout) if args.json else HumanOutput(sys.stdout, sys.stderr)
    sinks = [sink, *journal_sinks(args, journal=False)]
    interactive = sys.stdin.isatty()
    spec = durable.spec_of(args)
    status = 0

    async def ready() -> None:
        await agent.model.aclose()
        durable.prepare(args.store)
        await durable.agent_for(session, spec)  # a bad option or MCP server: an error now

    async def one_turn(run_id: str, text: str) -> dict[str, Any]:
        turn_sinks = [*sinks, inline_approvals(run_id)] if args.approve == "ask" else sinks
        emitter = durable.watch(run_id, turn_sinks)
        emitter.emit(
            "run_started", task=text, provider=agent.model.provider, model=agent.model.name
        )
        handle = await durable.start(args.store, run_id, args, text, list(transcript))
        try:
            result: dict[str, Any] = await handle.get_result()
        except asyncio.CancelledError:
            await durable.cancel(run_id)
            raise
        emitter.emit("run_finished", **durable.finished(result))
        return result

    with asyncio.Runner() as runner:
        try:
            runner.run(ready())
        except ConfigError as e:
            print(f"tether: error: {e}", file=sys.stderr)
            return 2
        for turn, text in enumerate(user_lines(interactive), 1):
            run_id = f"{session}-{turn}"
            try:
                result = runner.run(one_turn(run_id, text))
            except KeyboardInterrupt:
                kept = durable.messages_of(durable.client(args.store), run_id)
                transcript[:] = kept or transcript
                durable.emitter_for(run_id).emit(
                    "run_finished", outcome="cancelled", answer="", reason="cancelled"
                )
                print("\n[turn cancelled; the conversation goes on]", file=sys.stderr)
                status = 130
                continue
            except Exception as e:  # the turn failed inside the store
                print(f"tether: turn {run_id} did not finish: {e}", file=sys.stderr)
                status = 1
                continue
            transcript[:] = result["messages"]
            ended = result_of(run_id, result)
            status = ended.exit_status
            if not args.json:
                report(ended, sys.stderr, quiet_done=True)
    return status


def result_of(run_id: str, result: dict[str, Any]) -> RunResult:
    return RunResult(
        run_id,
        result["outcome"],
        result["answer"],
        result["reason"],
        Usage.from_dict(result.get("usage") or {}),
        result["cost_usd"],
        result["steps"],
        result.get("messages") or [],
        result.get("error"),
    )


def waiting(run_id: str) -> Sink:
    """With no terminal to ask on, say how to answer from elsewhere; the run waits (durably)."""

    def sink(event: Event) -> None:
        if event.type == "approval_requested":
            a = event.data["approval_id"]
            print(
                f"tether: {run_id} waits for approval of {event.data['name']}: "
                f"tether approve {run_id} {a}   (or tether deny {run_id} {a})",
                file=sys.stderr,
                flush=True,
            )

    return sink


def inline_approvals(run_id: str) -> Sink:
    """Ask at this terminal for each call the run waits on, and send the answer as the run's
    durable message; `tether approve` from elsewhere works as well (the first answer counts)."""
    from .approvals import ApprovalRequest
    from .cli import TerminalApprover
    from .durable import detached
    from .messages import ToolCall

    ask = TerminalApprover(sys.stderr, can_ask=True)

    async def answer(approval_id: str, call: ToolCall) -> None:
        from dbos import DBOS

        decision = await ask(ApprovalRequest.for_call(call, None))
        reply = {"approved": decision.approved, "reason": decision.reason}
        await DBOS.send_async(run_id, reply, topic=approval_id)

    def sink(event: Event) -> None:
        if event.type == "approval_requested":
            d = event.data
            raw = orjson.dumps(d["arguments"]).decode()
            call = ToolCall(d["id"], d["name"], d["arguments"], raw)
            detached(answer(d["approval_id"], call))

    return sink


def finish_durable(
    go: Callable[[], Any], run_id: str, sinks: list[Sink], args: argparse.Namespace
) -> int:
    from .durable import emitter_for, finished

    seen = Tally()
    sinks.append(seen)
    try:
        result = asyncio.run(go())
    except ConfigError as e:
        print(f"tether: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # the run was cancelled in the store (see `go`); what completed stays recorded there
        data = {"outcome": "cancelled", "answer": "", "reason": "cancelled", **seen.figures()}
        emitter_for(run_id).emit("run_finished", **data)
        if not getattr(args, "json", False):
            print("\n[cancelled]", file=sys.stderr)
        return 130
    except Exception as e:  # the workflow was cancelled elsewhere, or failed inside DBOS
        print(f"tether: run {run_id} did not finish: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    emitter_for(run_id).emit("run_finished", **finished(result))
    ended = result_of(run_id, result)
    if not getattr(args, "json", False):
        report(ended, sys.stderr)
    return ended.exit_status


class Tally:
    """Counts what a run's live events show, for the end line of a run cut short."""

    def __init__(self) -> None:
        self.usage = Usage()
        self.steps = 0
        self.cost = 0.0
        self.price: Price | None = None

    def __call__(self, event: Event) -> None:
        if event.type == "run_started":
            self.price = price_for(str(event.data.get("model", "")))
        elif event.type == "model_response":
            usage = Usage.from_dict(event.data.get("usage") or {})
            self.usage = self.usage + usage
            self.cost += self.price.cost(usage) if self.price else 0.0
            self.steps += 1

    def figures(self) -> dict[str, Any]:
        cost = round(self.cost, 6)
        return {"usage": self.usage.to_dict(), "cost_usd": cost, "steps": self.steps}


def command_store(args: argparse.Namespace) -> int:
    """resume executes the run in this process; the others only read or message the store."""
    from . import durable

    if args.command == "resume":
        sinks: list[Sink] = [
            json_sink(sys.stdout) if args.json else HumanOutput(sys.stdout, sys.stderr)
        ]

        async def go() -> Any:

            durable.watch(args.run_id, sinks).emit("run_resumed")
            handle: Any = await durable.resume(args.store, args.run_id, args.force)
            return await handle.get_result()

        return finish_durable(go, args.run_id, sinks, args)
    try:
        store = durable.client(args.store)
        if args.command == "runs":
            for w in store.list_workflows():
                line = {
                    "id": w.workflow_id,
                    "status": w.status,
                    "created_at": w.created_at,
                    "executor": w.executor_id,
                }
                print(orjson.dumps(line).decode() if args.json else f"{w.workflow_id}\t{w.status}")
        elif args.command == "cancel":
            store.cancel_workflow(args.run_id)
        elif args.command == "send":
            status = durable.status_of(store, args.run_id)
            if status.status in ("SUCCESS", "ERROR", "CANCELLED"):
                raise ConfigError(f"run {args.run_id} has ended ({status.status.lower()})")
            durable.ledger_for(args.store).send(args.run_id, args.text)
        else:
            approved = args.command == "approve"
            reason = "approved by the user" if approved else args.reason
            store.send(args.run_id, {"approved": approved, "reason": reason}, args.approval_id)
    except ConfigError as e:
        print(f"tether: error: {e}", file=sys.stderr)
        return 2
    return 0


def command_enqueue(agent: Agent, args: argparse.Namespace, run_id: str) -> int:
    from . import durable

    asyncio.run(agent.model.aclose())
    try:
        durable.enqueue(args.store, run_id, args, args.task)
    except ConfigError as e:
        print(f"tether: error: {e}", file=sys.stderr)
        return 2
    print(run_id)
    return 0


def command_worker(args: argparse.Namespace) -> int:
    import socket

    from . import durable

    executor_id = args.executor_id or f"{socket.gethostname()}-{os.getpid()}"
    print(
        f"tether worker {executor_id}: taking queued runs from the store",
        file=sys.stderr,
        flush=True,
    )
    try:
        asyncio.run(
            durable.work(args.store, executor_id, args.concurrency, args.beat, args.dead_after)
        )
    except ConfigError as e:
        print(f"tether: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0
