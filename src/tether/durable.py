"""Durable runs on DBOS Transact: a run is a workflow, each model call and each tool call a step.

    tether run TASK --store sqlite:///runs.sqlite --run-id job-1     (kill -9 it at any point)
    tether resume job-1 --store sqlite:///runs.sqlite               (no completed step repeats)

What is persisted is what completed: each model reply and each tool result, as DBOS step outputs
(token deltas are only streamed live). After a crash DBOS replays the workflow: completed steps
return their recorded output, the first unfinished step runs again. Steps are at-least-once, so
tools get an idempotency key (`run_id:call_id`, in `RunContext.idempotency_key`) and each tool
declares whether it is idempotent; a tool step that finds its own start marker was left by a
crashed attempt reruns an idempotent tool, and gives the model an "outcome unknown" error for
any other: a payment is never made twice silently. Messages (user input, approvals) travel as
durable DBOS messages. Starting returns only once the run is recorded (accepted means durable).

SQLite stores need SQLite 3.42 or newer (DBOS uses `unixepoch('subsec')`); where Python's own is
older, the bundled one of `pysqlite3-binary` is used.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

from .agent import Agent
from .approvals import Decision, needs_approval
from .errors import ConfigError, ProviderError
from .events import Emitter, Sink, model_response_data
from .loop import (
    CallModel,
    Finish,
    Happening,
    LoopState,
    ModelReplied,
    RunTools,
    Started,
    ToolsDone,
    last_answer,
    step,
)
from .messages import Message, ModelRequest, ModelResponse, ToolCall, ToolResult
from .tools.tool import RunContext

APP = "tether"
WORKFLOW = "tether.durable_run"
QUEUE = "tether"
VERSION = "tether-1"


def use_modern_sqlite() -> None:
    """Swap in pysqlite3's SQLite when the interpreter's is older than DBOS needs."""
    import sqlite3

    if sqlite3.sqlite_version_info >= (3, 42):
        return
    try:
        import pysqlite3  # type: ignore[import-untyped,import-not-found,unused-ignore]
        import pysqlite3.dbapi2  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError:
        raise ConfigError(
            f"a SQLite store needs SQLite 3.42+ (this Python has {sqlite3.sqlite_version}): "
            "pip install pysqlite3-binary, or use a postgresql:// store"
        ) from None
    sys.modules["sqlite3"] = pysqlite3
    sys.modules["sqlite3.dbapi2"] = pysqlite3.dbapi2


# -- the process's store ---------------------------------------------------------------------

_launched: str | None = None
_live: dict[str, Emitter] = {}  # run id -> this process's live events (they are not persisted)
_agents: dict[str, tuple[Agent, RunContext, argparse.Namespace]] = {}
_effects: Any = None


def open_store(url: str, executor_id: str | None = None) -> None:
    """Configure and launch DBOS on `url` (once per process); recovers this executor's runs."""
    global _launched, _effects
    if _launched is not None:
        if _launched != url:
            raise ConfigError("one store per process")
        return
    if not url.startswith(("sqlite:///", "postgresql://", "postgres://")):
        raise ConfigError(f"--store: {url!r} is not sqlite:///PATH or postgresql://...")
    if url.startswith("sqlite"):
        use_modern_sqlite()
    from dbos import DBOS
    from sqlalchemy import create_engine, text

    config: dict[str, Any] = {
        "name": APP,
        "system_database_url": url,
        "log_level": "WARNING",
        "notification_listener_polling_interval_sec": 0.05,
        "application_version": VERSION,
    }
    if executor_id:
        config["executor_id"] = executor_id
    DBOS(config=config)  # type: ignore[arg-type]
    DBOS.launch()
    _effects = create_engine(effects_url(url))
    with _effects.begin() as c:
        c.execute(
            text(
                "CREATE TABLE IF NOT EXISTS tether_tool_starts (run_id TEXT NOT NULL, "
                "call_id TEXT NOT NULL, started_at DOUBLE PRECISION NOT NULL, "
                "PRIMARY KEY (run_id, call_id))"
            )
        )
    _launched = url


def effects_url(url: str) -> str:
    """Where tool-start markers go: for SQLite a file beside the store (sharing DBOS's file
    would make every marker wait for its write lock), for Postgres the same database through
    psycopg 3 (what DBOS installs; SQLAlchemy's default driver is psycopg2)."""
    if url.startswith("sqlite:///"):
        return url + "-effects"
    return url.replace("postgresql://", "postgresql+psycopg://", 1).replace(
        "postgres://", "postgresql+psycopg://", 1
    )


def mark_tool_start(run_id: str, call_id: str) -> bool:
    """Record that a tool call starts; False if an earlier attempt had already started it."""
    from sqlalchemy import text
    from sqlalchemy.exc import IntegrityError

    try:
        with _effects.begin() as c:
            c.execute(
                text("INSERT INTO tether_tool_starts VALUES (:r, :c, :t)"),
                {"r": run_id, "c": call_id, "t": time.time()},
            )
        return True
    except IntegrityError:
        return False


# -- the workflow and its steps ----------------------------------------------------------------


def spec_of(args: argparse.Namespace) -> dict[str, Any]:
    """What a worker needs to rebuild the agent: the run's command-line options."""
    keep = (
        "provider",
        "model",
        "base_url",
        "script",
        "no_stream",
        "max_retries",
        "connect_timeout",
        "read_timeout",
        "tools",
        "tools_from",
        "tool_timeout",
        "workspace",
        "max_steps",
        "max_tokens",
        "max_input_tokens",
        "max_output_tokens",
        "max_cost",
        "prices",
        "timeout",
        "system",
        "approve",
        "mcp",
        "context_window",
        "profile",
    )
    spec = {k: getattr(args, k, None) for k in keep}
    spec["store"] = None
    # a worker elsewhere must find the same files
    spec["workspace"] = str(Path(args.workspace).resolve())
    spec["tools_from"] = [
        str(Path(s).resolve()) if s.endswith(".py") or Path(s).is_file() else s
        for s in (args.tools_from or [])
    ]
    return spec


def agent_for(run_id: str, spec: dict[str, Any]) -> tuple[Agent, RunContext, argparse.Namespace]:
    """The run's agent in this process, built once from its spec."""
    if run_id not in _agents:
        from .cli import build_agent

        args = argparse.Namespace(**spec)
        agent = build_agent(args)
        ctx = RunContext(run_id=run_id, workspace=Path(args.workspace).resolve())
        _agents[run_id] = (agent, ctx, args)
    return _agents[run_id]


def emitter_for(run_id: str) -> Emitter:
    """The run's live emitter in this process: one numbering across all its steps."""
    emitter = _live.get(run_id)
    if emitter is None:
        emitter = _live[run_id] = Emitter(run_id)
    return emitter


def register() -> Any:
    from dbos import DBOS

    @DBOS.step(name="tether.model_step")
    async def model_step(
        run_id: str, spec: dict[str, Any], request: ModelRequest
    ) -> tuple[ModelResponse, float]:
        agent, _, _ = agent_for(run_id, spec)
        emitter = emitter_for(run_id)
        if emitter.active:
            emitter.emit("model_request", messages=len(request.messages))
        on_text = (lambda t: emitter.emit("text_delta", text=t)) if emitter.active else None
        response = await agent.model.respond(request, on_text)
        if emitter.active:
            emitter.emit("model_response", **model_response_data(response))
        return response, time.time()

    @DBOS.step(name="tether.tool_step")
    async def tool_step(
        run_id: str, spec: dict[str, Any], call: ToolCall, decision: Decision | None
    ) -> tuple[ToolResult, float]:
        agent, ctx, _ = agent_for(run_id, spec)
        emitter = emitter_for(run_id)
        tool = agent.toolbox.tools.get(call.name)
        first = await asyncio.to_thread(mark_tool_start, run_id, call.id)
        if not first and tool is not None and not tool.idempotent:
            result = ToolResult(
                call.id,
                call.name,
                "Outcome unknown: this call started before a crash and may or may not have "
                "taken effect. It was not run again; check its effect before retrying.",
                is_error=True,
            )
        else:
            call_ctx = dataclasses.replace(ctx, idempotency_key=f"{run_id}:{call.id}")
            approver = None
            if decision is not None:

                async def decided(request: Any) -> Decision:
                    return decision

                approver = decided
            result = await agent.toolbox.run(call, call_ctx, approver, emitter)
        if emitter.active:
            emitter.emit(
                "tool_result",
                id=result.call_id,
                name=result.name,
                output=result.output,
                is_error=result.is_error,
            )
        return result, time.time()

    @DBOS.step(name="tether.clock")
    async def clock() -> float:
        return time.time()

    @DBOS.workflow(name=WORKFLOW)
    async def durable_run(run_id: str, spec: dict[str, Any], task: str) -> dict[str, Any]:
        agent, _, args = agent_for(run_id, spec)
        state = LoopState([Message.user(task)], agent.system, agent.toolbox.specs)
        state.started_at = await clock()
        now = state.started_at
        happened: Happening = Started()
        error: dict[str, Any] | None = None
        while True:
            while (text := await DBOS.recv_async("user", timeout_seconds=0)) is not None:
                state.inbox.append(str(text))
            action = step(state, happened, agent.budget, agent.price, now)
            if isinstance(action, Finish):
                finish = action
                break
            if isinstance(action, CallModel):
                request = ModelRequest(
                    tuple(state.messages), state.tools, state.system, agent.max_output_tokens
                )
                try:
                    response, now = await model_step(run_id, spec, request)
                except ProviderError as e:
                    error = e.to_dict()
                    finish = Finish("failed", last_answer(state.messages), str(e))
                    break
                happened = ModelReplied(response)
            elif isinstance(action, RunTools):
                decisions = [await decide(run_id, args, agent, c) for c in action.calls]
                emitter = emitter_for(run_id)
                for c in action.calls:
                    emitter.emit("tool_call", id=c.id, name=c.name, arguments=c.arguments or {})
                done = await asyncio.gather(
                    *(
                        tool_step(run_id, spec, c, d)
                        for c, d in zip(action.calls, decisions, strict=True)
                    )
                )
                now = max(ts for _, ts in done)
                happened = ToolsDone([r for r, _ in done])
        result = {
            "outcome": finish.outcome,
            "answer": finish.answer,
            "reason": finish.reason,
            "usage": state.usage.to_dict(),
            "cost_usd": round(state.cost_usd, 6),
            "steps": state.steps,
            "messages": state.messages,
        }
        if error is not None:
            result["error"] = error
        return result

    async def decide(
        run_id: str, args: argparse.Namespace, agent: Agent, call: ToolCall
    ) -> Decision | None:
        """Approvals are decided in the workflow, durably: a waiting call survives restarts."""
        tool = agent.toolbox.tools.get(call.name)
        if tool is None or not needs_approval(tool.approval, call.arguments):
            return None
        if args.approve == "auto":
            return Decision(True, "approved by policy (--approve auto)")
        if args.approve == "deny":
            return Decision(False, "denied by policy (--approve deny)")
        approval_id = f"ap_{call.id}"
        await DBOS.set_event_async(approval_id, {"name": call.name, "arguments": call.arguments})
        emitter_for(run_id).emit(
            "approval_requested",
            approval_id=approval_id,
            id=call.id,
            name=call.name,
            arguments=call.arguments or {},
        )
        answer = await DBOS.recv_async(approval_id, timeout_seconds=24 * 3600)
        if answer is None:
            return Decision(False, "the approval expired")
        return Decision(bool(answer.get("approved")), str(answer.get("reason", "")))

    return durable_run


_workflow: Any = None


def workflow() -> Any:
    global _workflow
    if _workflow is None:
        _workflow = register()
    return _workflow


# -- what the CLI calls ---------------------------------------------------------------------


def prepare(url: str) -> Any:
    """Register the workflow, then open the store (DBOS wants workflows before launch)."""
    if url.startswith("sqlite"):
        use_modern_sqlite()
    wf = workflow()
    open_store(url)
    return wf


async def start(url: str, run_id: str, args: argparse.Namespace, task: str) -> Any:
    from dbos import DBOS, SetWorkflowID

    wf = prepare(url)
    with SetWorkflowID(run_id):
        return await DBOS.start_workflow_async(wf, run_id, spec_of(args), task)


def watch(run_id: str, sinks: list[Sink]) -> Emitter:
    """Show this run's live events to `sinks` (numbered from 0 in this process)."""
    emitter = _live[run_id] = Emitter(run_id, list(sinks))
    return emitter


def client(url: str) -> Any:
    """A DBOS client for reading and messaging runs without executing any (a process that only
    lists or approves must not pick up pending runs and then exit in the middle of them)."""
    if not url.startswith(("sqlite:///", "postgresql://", "postgres://")):
        raise ConfigError(f"--store: {url!r} is not sqlite:///PATH or postgresql://...")
    if url.startswith("sqlite"):
        use_modern_sqlite()
    from dbos import DBOSClient

    return DBOSClient(system_database_url=url)


def events_of(store: Any, run_id: str) -> list[Any]:
    """A durable run's persisted history as events: its completed model replies and tool
    results (step outputs), and its end (the workflow's result)."""
    from dbos._error import DBOSNonExistentWorkflowError

    from .events import Event

    out: list[Event] = []

    def add(type: str, ts: float, **data: Any) -> None:
        out.append(Event(type, run_id, len(out), data, ts))

    try:
        status = store.retrieve_workflow(run_id).get_status()
    except DBOSNonExistentWorkflowError:
        raise ConfigError(f"no run {run_id} in the store") from None
    inputs = status.input.get("args") if isinstance(status.input, dict) else None
    task = inputs[2] if isinstance(inputs, (list, tuple)) and len(inputs) > 2 else ""
    add("run_started", (status.created_at or 0) / 1000, task=task)
    for s in store.list_workflow_steps(run_id):
        output = s.get("output")
        name = s.get("function_name", "")
        if name.endswith("model_step") and isinstance(output, tuple):
            response, ts = output
            add("model_response", ts, **model_response_data(response))
            for c in response.message.tool_calls:
                add("tool_call", ts, id=c.id, name=c.name, arguments=c.arguments or {})
        elif name.endswith("tool_step") and isinstance(output, tuple):
            result, ts = output
            add(
                "tool_result",
                ts,
                id=result.call_id,
                name=result.name,
                output=result.output,
                is_error=result.is_error,
            )
    if status.status == "SUCCESS" and isinstance(status.output, dict):
        data = {k: v for k, v in status.output.items() if k != "messages"}
        add("run_finished", (status.updated_at or 0) / 1000, **data)
    return out


# -- workers --------------------------------------------------------------------------------


def enqueue(url: str, run_id: str, args: argparse.Namespace, task: str) -> Any:
    """Put a run on the shared queue for whichever worker is free; returns once it is recorded."""
    store = client(url)
    options: Any = {
        "queue_name": QUEUE,
        "workflow_name": WORKFLOW,
        "workflow_id": run_id,
        "app_version": VERSION,
    }
    return store.enqueue(options, run_id, spec_of(args), task)


async def work(
    url: str,
    executor_id: str,
    concurrency: int,
    beat: float,
    dead_after: float,
) -> None:
    """Run queued runs until cancelled. Every `beat` seconds this worker records that it is
    alive, and recovers the runs of any worker silent for `dead_after` seconds (DBOS's open
    source edition does not move a dead executor's runs by itself)."""
    from dbos import DBOS
    from sqlalchemy import text

    workflow()
    open_store(url, executor_id=executor_id)
    await DBOS.register_queue_async(QUEUE, worker_concurrency=concurrency)
    with _effects.begin() as c:
        c.execute(
            text(
                "CREATE TABLE IF NOT EXISTS tether_executors (executor_id TEXT PRIMARY KEY, "
                "last_beat DOUBLE PRECISION NOT NULL)"
            )
        )
    while True:
        now = time.time()
        with _effects.begin() as c:
            c.execute(
                text("DELETE FROM tether_executors WHERE executor_id = :e"), {"e": executor_id}
            )
            c.execute(
                text("INSERT INTO tether_executors VALUES (:e, :t)"), {"e": executor_id, "t": now}
            )
            dead = [
                row[0]
                for row in c.execute(
                    text("SELECT executor_id FROM tether_executors WHERE last_beat < :t"),
                    {"t": now - dead_after},
                )
            ]
            if dead:
                c.execute(
                    text("DELETE FROM tether_executors WHERE last_beat < :t"),
                    {"t": now - dead_after},
                )
        if dead:
            recovered = await asyncio.to_thread(DBOS._recover_pending_workflows, dead)
            print(
                f"tether worker {executor_id}: executors {', '.join(dead)} stopped beating; "
                f"recovered {len(recovered)} runs",
                file=sys.stderr,
                flush=True,
            )
        await asyncio.sleep(beat)
