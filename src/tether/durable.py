"""Durable runs on DBOS Transact: a run is a workflow; its model calls and tool calls are steps.

    tether run TASK --store sqlite:///runs.sqlite --run-id job-1     (kill -9 it at any point)
    tether resume job-1 --store sqlite:///runs.sqlite               (no completed step repeats)

What is persisted is what completed: each model reply and each tool result (token deltas are
only streamed live). Each model call is a DBOS step; the parallel calls of one reply share one
DBOS step, and each of them is also journaled on its own in the ledger (`ledger.py`): started
before it runs, its result when it ends. After a crash DBOS replays the workflow: completed
steps return their recorded output, the first unfinished step runs again, and inside a tool
step a call the journal shows finished gives back its result instead of running again. A call
that started but never finished is rerun if its tool is idempotent; any other gives the model
an "outcome unknown" error: a payment is never made twice silently. Tools get an idempotency
key (`run_id:call_id`, in `RunContext.idempotency_key`) for the at-least-once window that
remains (the moment between a tool's effect and its journal entry).

User messages wait in the ledger's inbox; each model step takes those that arrived and records
them with its reply. Approvals travel as durable DBOS messages. Starting returns only once the
run is recorded (accepted means durable).

SQLite stores need SQLite 3.42 or newer (DBOS uses `unixepoch('subsec')`); where Python's own is
older, the bundled one of `pysqlite3-binary` is used.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import dataclasses
import os
import socket
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import orjson

from .agent import Agent
from .approvals import Decision, arguments_hash, needs_approval
from .context import estimate, fit, is_context_error
from .errors import ConfigError, ProviderError
from .events import Emitter, Event, Sink, model_response_data, tool_result_data
from .ledger import Ledger
from .loop import (
    CallModel,
    Finish,
    Happening,
    LoopState,
    ModelReplied,
    RunTools,
    Started,
    ToolsDone,
    close_open_calls,
    last_answer,
    step,
)
from .messages import Message, ModelRequest, ModelResponse, ToolCall, ToolResult, Usage
from .tools.tool import RunContext

APP = "tether"
WORKFLOW = "tether.durable_run"
QUEUE = "tether"
VERSION = "tether-2"  # the workflow's shape: a run recorded by another cannot resume


def use_modern_sqlite() -> None:
    """Swap in pysqlite3's SQLite when the interpreter's is older than DBOS needs, and set up
    every SQLite connection of the process for many small commits (`tune_sqlite`)."""
    import sqlite3

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    if not event.contains(Engine, "connect", tune_sqlite):
        event.listen(Engine, "connect", tune_sqlite)
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


def tune_sqlite(dbapi_conn: Any, connection_record: Any) -> None:
    """Write-ahead logging, synced at checkpoints rather than at every commit: a commit is
    then one append to the log, and it survives the process being killed at any point (the
    crash suite checks this); only the power failing can lose the last commits."""
    if "sqlite" not in type(dbapi_conn).__module__:
        return
    mode = dbapi_conn.isolation_level
    dbapi_conn.isolation_level = None  # PRAGMA journal_mode cannot run inside a transaction
    dbapi_conn.execute("PRAGMA journal_mode=WAL")
    dbapi_conn.execute("PRAGMA synchronous=NORMAL")
    dbapi_conn.execute("PRAGMA busy_timeout=30000")  # wait out other writers, as DBOS does
    dbapi_conn.isolation_level = mode


# -- the process's store ---------------------------------------------------------------------

_launched: str | None = None
_live: dict[str, Emitter] = {}  # run id -> this process's live events (they are not persisted)
_agents: dict[str, tuple[Agent, argparse.Namespace]] = {}  # by the runs' options
_ledger: Ledger | None = None
_tasks: dict[str, asyncio.Task[Any]] = {}  # run id -> the task executing it in this process
_stepped: set[str] = set()  # runs that have executed a step here: DBOS's replay is behind them
_shown: dict[str, set[str]] = {}  # run id -> calls whose tool_call this process emitted


def open_store(url: str, executor_id: str | None = None) -> None:
    """Configure and launch DBOS on `url` (once per process); recovers this executor's runs."""
    global _launched, _ledger
    if _launched is not None:
        if _launched != url:
            raise ConfigError("one store per process")
        return
    if not url.startswith(("sqlite:///", "postgresql://", "postgres://")):
        raise ConfigError(f"--store: {url!r} is not sqlite:///PATH or postgresql://...")
    if url.startswith("sqlite"):
        use_modern_sqlite()
    from dbos import DBOS

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
    _ledger = Ledger(url)
    _launched = url


def ledger() -> Ledger:
    assert _ledger is not None, "open_store first"
    return _ledger


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


async def agent_for(
    run_id: str, spec: dict[str, Any]
) -> tuple[Agent, RunContext, argparse.Namespace]:
    """The run's agent in this process. Runs with the same options share one agent (and so one
    HTTP connection pool to the model, and the same MCP connections); each run has its own
    context."""
    key = orjson.dumps(spec, option=orjson.OPT_SORT_KEYS).decode()
    if key not in _agents:
        from .cli import build_agent, select_tools

        args = argparse.Namespace(**spec)
        tools = select_tools(args)
        if spec.get("mcp"):
            tools += await mcp_tools_for(spec["mcp"])
        if spec.get("only") is not None:  # a subset chosen in the web page
            tools = [t for t in tools if t.name in spec["only"]]
        _agents[key] = (build_agent(args, tools), args)
    agent, args = _agents[key]
    return agent, RunContext(run_id=run_id, workspace=Path(args.workspace)), args  # resolved


_mcp: dict[str, asyncio.Future[list[Any]]] = {}


async def mcp_tools_for(servers: list[str]) -> list[Any]:
    """The tools of these MCP servers, connected once per process and kept open by a task of
    their own (a connection belongs to the task that opened it; a run's task ends)."""
    from .tools.mcp import mcp_tools

    key = "\n".join(servers)
    if key not in _mcp:
        found: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        _mcp[key] = found

        async def hold() -> None:
            try:
                async with mcp_tools(servers) as tools:
                    found.set_result(tools)
                    await asyncio.Event().wait()
            except Exception as e:  # reported to whoever waits for the tools
                if not found.done():
                    found.set_exception(e)
                    del _mcp[key]

        detached(hold())  # not part of the run that happened to open the connection
    return await asyncio.shield(_mcp[key])


_detached: set[asyncio.Task[Any]] = set()


def detached(work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    """Run `work` as a task of its own, in a fresh context: inside a workflow's, DBOS would
    take what it does for part of that workflow, and the replay would no longer match."""
    task = asyncio.get_running_loop().create_task(work, context=contextvars.Context())
    _detached.add(task)
    task.add_done_callback(_detached.discard)
    return task


def finished(result: dict[str, Any]) -> dict[str, Any]:
    """A `run_finished` event's data from a run's result (all of it but the transcript)."""
    return {k: v for k, v in result.items() if k != "messages"}


def forget(run_id: str) -> None:
    """Drop what this process kept for a run while executing it (it serves many runs)."""
    _tasks.pop(run_id, None)
    _stepped.discard(run_id)
    _shown.pop(run_id, None)
    emitter = _live.get(run_id)
    if emitter is not None and not emitter.active:  # nobody here watches it
        del _live[run_id]


def unwatch(run_id: str) -> None:
    """A watcher is done with a run (see `watch`): its emitter can go."""
    _live.pop(run_id, None)


def announce(run_id: str, calls: list[ToolCall]) -> None:
    """Emit `tool_call` for the calls not yet announced by this process."""
    emitter = emitter_for(run_id)
    shown = _shown.setdefault(run_id, set())
    for c in calls:
        if c.id not in shown:
            shown.add(c.id)
            emitter.emit("tool_call", id=c.id, name=c.name, arguments=c.arguments or {})


def emitter_for(run_id: str) -> Emitter:
    """The run's live emitter in this process: one numbering across all its steps."""
    emitter = _live.get(run_id)
    if emitter is None:
        emitter = _live[run_id] = Emitter(run_id)
    return emitter


UNKNOWN_OUTCOME = (
    "Outcome unknown: this call started before a crash and may or may not have taken effect. "
    "It was not run again; check its effect before retrying."
)


def register() -> Any:
    from dbos import DBOS

    @DBOS.step(name="tether.model_step")
    async def model_step(
        run_id: str, spec: dict[str, Any], request: ModelRequest, seen: int
    ) -> tuple[ModelResponse, float, float, list[tuple[int, str]], list[tuple[int, str]]]:
        """One model call, with the user messages that arrived since message `seen`: the
        recorded output says which went in, so a replay delivers the same ones."""
        _stepped.add(run_id)
        agent, _, _ = await agent_for(run_id, spec)
        emitter = emitter_for(run_id)
        arrived = await ledger().call(ledger().messages_after, run_id, seen)
        if arrived:
            extra = tuple(Message.user(text) for _, text in arrived)
            request = dataclasses.replace(request, messages=request.messages + extra)
            for _, text in arrived:
                emitter.emit("user_message", text=text)
        if emitter.active:
            emitter.emit("model_request", messages=len(request.messages))
        on_text = (lambda t: emitter.emit("text_delta", text=t)) if emitter.active else None

        def on_retry(attempt: int, delay: float, e: ProviderError) -> None:
            emitter.emit("retry", attempt=attempt, delay=round(delay, 3), error=e.to_dict())

        began = time.time()
        response = await agent.model.respond(request, on_text, on_retry)
        if emitter.active:
            emitter.emit("model_response", **model_response_data(response))
        late: list[tuple[int, str]] = []
        if not response.message.tool_calls:  # an answer: a message sent meanwhile reopens it
            late = await ledger().call(
                ledger().messages_after, run_id, max([seen, *(n for n, _ in arrived)])
            )
            for _, text in late:
                emitter.emit("user_message", text=text)
        return response, began, time.time(), arrived, late

    @DBOS.step(name="tether.context_step")
    async def context_step(
        run_id: str, spec: dict[str, Any], messages: list[Message], force: bool
    ) -> tuple[list[Message], Usage, list[tuple[str, dict[str, Any]]]]:
        """Fit the conversation to the model's window (`context.fit`): the new messages, the
        summary call's usage, and what was replaced, recorded as one step."""
        _stepped.add(run_id)
        agent, _, _ = await agent_for(run_id, spec)
        assert agent.context is not None
        live = emitter_for(run_id)
        happened: list[tuple[str, dict[str, Any]]] = []

        def keep(event: Event) -> None:
            happened.append((event.type, event.data))
            live.emit(event.type, **event.data)

        usage = await fit(
            agent.model, messages, agent.system, agent.context, Emitter(run_id, [keep]), force
        )
        return messages, usage, happened

    @DBOS.step(name="tether.tools_step")
    async def tools_step(
        run_id: str, spec: dict[str, Any], calls: list[ToolCall], decisions: list[Decision | None]
    ) -> tuple[list[ToolResult], float]:
        """The calls of one reply, at the same time, in one recorded step; each call is
        journaled on its own (see `ledger.py`), so a retried step repeats no finished call."""
        _stepped.add(run_id)
        announce(run_id, calls)  # those a replay passed over silently
        started = await ledger().call(ledger().start_calls, run_id, [c.id for c in calls])
        results = await asyncio.gather(
            *(
                one_call(run_id, spec, c, d, *started[c.id])
                for c, d in zip(calls, decisions, strict=True)
            )
        )
        return list(results), time.time()

    async def one_call(
        run_id: str,
        spec: dict[str, Any],
        call: ToolCall,
        decision: Decision | None,
        state: str,
        recorded: ToolResult | None,
    ) -> ToolResult:
        agent, ctx, _ = await agent_for(run_id, spec)
        emitter = emitter_for(run_id)
        tool = agent.toolbox.tools.get(call.name)
        if recorded is not None:
            result = recorded
        elif state == "interrupted" and tool is not None and not tool.idempotent:
            result = ToolResult(call.id, call.name, UNKNOWN_OUTCOME, is_error=True)
        else:
            call_ctx = dataclasses.replace(ctx, idempotency_key=f"{run_id}:{call.id}")
            approver = None
            if decision is not None:

                async def decided(request: Any) -> Decision:
                    return decision

                approver = decided
            # decided in the workflow (`decide`), which told the watchers already
            result = await agent.toolbox.run(call, call_ctx, approver)
        if recorded is None:
            await ledger().call(ledger().finish_call, run_id, result)
        if emitter.active:
            emitter.emit("tool_result", **tool_result_data(result))
        return result

    @DBOS.workflow(name=WORKFLOW)
    async def durable_run(
        run_id: str, spec: dict[str, Any], task: str, history: list[Message] | None = None
    ) -> dict[str, Any]:
        """`history`: the conversation before `task` (a turn of `tether ask`)."""
        task_ = asyncio.current_task()
        if task_ is not None:  # so that a cancel here can stop the run at once
            _tasks[run_id] = task_
        try:
            return await drive(run_id, spec, task, history)
        finally:
            forget(run_id)

    async def drive(
        run_id: str, spec: dict[str, Any], task: str, history: list[Message] | None
    ) -> dict[str, Any]:
        agent, _, args = await agent_for(run_id, spec)
        state = LoopState([*(history or []), Message.user(task)], agent.system, agent.toolbox.specs)
        # the clock starts with the first model call (its recorded start), so that reading it
        # costs no step of its own; until then no time has passed
        now = state.started_at = 0.0
        seen = 0  # the last inbox message delivered
        happened: Happening = Started()
        error: dict[str, Any] | None = None
        while True:
            action = step(state, happened, agent.budget, agent.price, now)
            if isinstance(action, Finish):
                finish = action
                break
            if isinstance(action, CallModel):
                policy = agent.context
                if policy is not None and estimate(state.messages, state.system) > policy.limit:
                    await refit(run_id, spec, agent, state, False)
                try:
                    try:
                        response, began, now, arrived, late = await model_step(
                            run_id, spec, request_of(agent, state), seen
                        )
                    except ProviderError as e:
                        if policy is None or not is_context_error(e):
                            raise
                        await refit(run_id, spec, agent, state, True)  # shrink, retry once
                        response, began, now, arrived, late = await model_step(
                            run_id, spec, request_of(agent, state), seen
                        )
                except ProviderError as e:
                    error = e.to_dict()
                    finish = Finish("failed", last_answer(state.messages), str(e))
                    break
                if state.steps == 0:
                    state.started_at = began
                # the messages went in before the reply: the transcript says so too
                state.messages.extend(Message.user(text) for _, text in arrived)
                state.inbox.extend(text for _, text in late)  # after the answer
                seen = max([seen, *(n for n, _ in arrived + late)])
                happened = ModelReplied(response)
            elif isinstance(action, RunTools):
                if run_id in _stepped:  # while DBOS replays, its watchers saw these already
                    announce(run_id, list(action.calls))
                decisions = await decide(run_id, args, agent, list(action.calls))
                results, now = await tools_step(run_id, spec, list(action.calls), decisions)
                happened = ToolsDone(results)
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

    def request_of(agent: Agent, state: LoopState) -> ModelRequest:
        return ModelRequest(
            tuple(state.messages), state.tools, state.system, agent.max_output_tokens
        )

    async def refit(
        run_id: str, spec: dict[str, Any], agent: Agent, state: LoopState, force: bool
    ) -> None:
        messages, usage, _ = await context_step(run_id, spec, list(state.messages), force)
        state.messages[:] = messages
        agent.charge(state, usage)

    async def decide(
        run_id: str, args: argparse.Namespace, agent: Agent, calls: list[ToolCall]
    ) -> list[Decision | None]:
        """Approvals are decided in the workflow, durably: a waiting call survives restarts.
        Every call of the reply is put to the user at once and each is decided on its own; the
        answers are taken in the order of the calls (they wait as messages until then)."""
        emitter = emitter_for(run_id)
        decisions: list[Decision | None] = [None] * len(calls)
        waiting: list[tuple[int, ToolCall, str]] = []
        for i, call in enumerate(calls):
            tool = agent.toolbox.tools.get(call.name)
            if tool is None or not needs_approval(tool.approval, call.arguments):
                continue
            approval_id = f"ap_{call.id}"
            if args.approve not in ("auto", "deny"):
                await DBOS.set_event_async(
                    approval_id, {"name": call.name, "arguments": call.arguments}
                )
            emitter.emit(
                "approval_requested",
                approval_id=approval_id,
                id=call.id,
                name=call.name,
                arguments=call.arguments or {},
                args_hash=arguments_hash(call.name, call.arguments),
            )
            if args.approve == "auto":
                decisions[i] = Decision(True, "approved by policy (--approve auto)")
            elif args.approve == "deny":
                decisions[i] = Decision(False, "denied by policy (--approve deny)")
            else:
                waiting.append((i, call, approval_id))
                continue
            decided(emitter, approval_id, call, decisions[i])
        for i, call, approval_id in waiting:
            answer = await DBOS.recv_async(approval_id, timeout_seconds=24 * 3600)
            if answer is None:
                decisions[i] = Decision(False, "the approval expired")
            else:
                decisions[i] = Decision(bool(answer.get("approved")), str(answer.get("reason", "")))
            decided(emitter, approval_id, call, decisions[i])
        return decisions

    def decided(
        emitter: Emitter, approval_id: str, call: ToolCall, decision: Decision | None
    ) -> None:
        assert decision is not None
        emitter.emit(
            "approval_decided",
            approval_id=approval_id,
            id=call.id,
            approved=decision.approved,
            reason=decision.reason,
        )

    return durable_run


_workflow: Any = None


def workflow() -> Any:
    global _workflow
    if _workflow is None:
        _workflow = register()
    return _workflow


# -- what the CLI calls ---------------------------------------------------------------------


def prepare(url: str) -> Any:
    """Register the workflow, then open the store (DBOS wants workflows before launch).

    Each process is an executor of its own (`cli-HOST-PID`): DBOS recovers an executor's
    pending runs when it launches, and under one shared id a second `tether run` would take
    over the run of a first one that is still going."""
    if url.startswith("sqlite"):
        use_modern_sqlite()
    wf = workflow()
    open_store(url, executor_id=process_executor_id())
    return wf


def process_executor_id() -> str:
    return f"cli-{socket.gethostname()}-{os.getpid()}"


def executor_alive(executor_id: str) -> bool:
    """Whether a `tether run` process (by its executor id) still runs on this machine; an
    executor elsewhere, or a worker, counts as alive (its heartbeats decide)."""
    prefix = f"cli-{socket.gethostname()}-"
    if not executor_id.startswith(prefix):
        return executor_id != "local"
    pid = executor_id[len(prefix) :]
    if not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def orphans(run_ids: list[str] | None = None) -> dict[str, str]:
    """Runs this machine's `tether` processes were executing when they died: run id ->
    its dead executor (with `run_ids`, only among those)."""
    from dbos import DBOS

    pending = await DBOS.list_workflows_async(
        status="PENDING", workflow_ids=run_ids, load_input=False, load_output=False
    )
    host = f"cli-{socket.gethostname()}-"
    owners = {w.workflow_id: w.executor_id or "" for w in pending}
    return {
        run_id: owner
        for run_id, owner in owners.items()
        if owner.startswith(host) and not executor_alive(owner)
    }


async def recover_orphans(run_ids: list[str] | None = None) -> list[str]:
    """Take over the orphans (see `orphans`) in this process; the run ids taken."""
    from dbos import DBOS

    found = await orphans(run_ids)
    for executor in sorted(set(found.values())):
        await asyncio.to_thread(DBOS._recover_pending_workflows, [executor])
    return sorted(found)


async def resume(url: str, run_id: str, force: bool = False) -> Any:
    """Continue a run in this process: one whose process died (still PENDING in the store) is
    recovered; one cancelled or failed is resumed. Returns its workflow handle."""
    from dbos import DBOS

    prepare(url)
    status = await asyncio.to_thread(status_of, client(url), run_id)
    if status.status == "PENDING":
        owner = status.executor_id or "local"
        if owner != process_executor_id() and executor_alive(owner) and not force:
            raise ConfigError(
                f"run {run_id} is being executed by {owner}; it is not lost, so not resumed "
                "(--force takes it over if that process is gone)"
            )
        await asyncio.to_thread(DBOS._recover_pending_workflows, [owner])
    elif status.status != "SUCCESS":
        await DBOS.resume_workflow_async(run_id)
    return await DBOS.retrieve_workflow_async(run_id)


async def start(
    url: str,
    run_id: str,
    args: argparse.Namespace,
    task: str,
    history: list[Message] | None = None,
) -> Any:
    return await start_spec(url, run_id, spec_of(args), task, history)


async def start_spec(
    url: str,
    run_id: str,
    spec: dict[str, Any],
    task: str,
    history: list[Message] | None = None,
) -> Any:
    """Start a run in this process; returns its handle once the run is recorded."""
    from dbos import DBOS, SetWorkflowID

    wf = prepare(url)
    with SetWorkflowID(run_id):
        return await DBOS.start_workflow_async(wf, run_id, spec, task, history)


async def cancel(run_id: str) -> None:
    """Cancel a run in the store and, if this process executes it, stop it now (DBOS itself
    stops a cancelled run only at its next step)."""
    from dbos import DBOS

    await DBOS.cancel_workflow_async(run_id)
    task = _tasks.pop(run_id, None)
    if task is not None and not task.done():
        task.cancel()


def messages_of(store: Any, run_id: str) -> list[Message]:
    """A run's conversation as far as its store has it: the history and task it started with,
    then each recorded reply and tool result; calls left open are closed as cancelled."""
    status = status_of(store, run_id)
    inputs = status.input.get("args") if isinstance(status.input, dict) else None
    if not isinstance(inputs, (list, tuple)) or len(inputs) < 3:
        return []
    history = inputs[3] if len(inputs) > 3 and inputs[3] else []
    messages: list[Message] = [*history, Message.user(inputs[2])]
    for s in store.list_workflow_steps(run_id):
        output, name = s.get("output"), s.get("function_name", "")
        if name.endswith("model_step") and isinstance(output, tuple):
            response, _, _, arrived, late = output
            messages.extend(Message.user(text) for _, text in arrived)
            messages.append(response.message)
            messages.extend(Message.user(text) for _, text in late)
        elif name.endswith("tools_step") and isinstance(output, tuple):
            messages.append(Message("tool", tuple(output[0])))
        elif name.endswith("context_step") and isinstance(output, tuple):
            messages = list(output[0])
    close_open_calls(messages, "Cancelled before the tool finished.")
    return messages


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
        if not Path(url.removeprefix("sqlite:///")).exists():
            raise ConfigError(f"no store at {url.removeprefix('sqlite:///')}")
        use_modern_sqlite()
    from dbos import DBOSClient

    return DBOSClient(system_database_url=url)


def status_of(store: Any, run_id: str) -> Any:
    """A run's DBOS status, read through a client; an unknown id is a ConfigError."""
    from dbos._error import DBOSNonExistentWorkflowError

    try:
        return store.retrieve_workflow(run_id).get_status()
    except DBOSNonExistentWorkflowError:
        raise ConfigError(f"no run {run_id} in the store") from None


def events_of(store: Any, run_id: str) -> list[Any]:
    """A durable run's persisted history as events: its completed model replies and tool
    results (step outputs), and its end (the workflow's result)."""
    from .events import Event

    out: list[Event] = []

    def add(type: str, ts: float, **data: Any) -> None:
        out.append(Event(type, run_id, len(out), data, ts))

    status = status_of(store, run_id)
    inputs = status.input.get("args") if isinstance(status.input, dict) else None
    task = inputs[2] if isinstance(inputs, (list, tuple)) and len(inputs) > 2 else ""
    steps = store.list_workflow_steps(run_id)
    spec = inputs[1] if isinstance(inputs, (list, tuple)) and len(inputs) > 1 else {}
    first = next(
        (
            s["output"][0]
            for s in steps
            if s.get("function_name", "").endswith("model_step")
            and isinstance(s.get("output"), tuple)
        ),
        None,
    )
    add(
        "run_started",
        (status.created_at or 0) / 1000,
        task=task,
        provider=spec.get("provider") if isinstance(spec, dict) else None,
        model=first.model if first is not None else None,
    )
    for s in steps:
        output = s.get("output")
        name = s.get("function_name", "")
        if name.endswith("model_step") and isinstance(output, tuple):
            response, _, ts, arrived, late = output
            for _, text in arrived:
                add("user_message", ts, text=text)
            add("model_response", ts, **model_response_data(response))
            for c in response.message.tool_calls:
                add("tool_call", ts, id=c.id, name=c.name, arguments=c.arguments or {})
            for _, text in late:
                add("user_message", ts, text=text)
        elif name.endswith("context_step") and isinstance(output, tuple):
            for type_, data in output[2]:
                add(type_, (s.get("completed_at_epoch_ms") or 0) / 1000, **data)
        elif name.endswith("tools_step") and isinstance(output, tuple):
            results, ts = output
            for result in results:
                add("tool_result", ts, **tool_result_data(result))
    if status.status == "SUCCESS" and isinstance(status.output, dict):
        data = finished(status.output)
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

    workflow()
    open_store(url, executor_id=executor_id)
    await DBOS.register_queue_async(QUEUE, worker_concurrency=concurrency)
    while True:
        taken = await recover_orphans()  # runs of `tether run` processes that died here
        if taken:
            print(
                f"tether worker {executor_id}: took over {len(taken)} runs whose process "
                f"died: {', '.join(taken)}",
                file=sys.stderr,
                flush=True,
            )
        dead = await ledger().call(ledger().beat, executor_id, dead_after)
        if dead:
            recovered = await asyncio.to_thread(DBOS._recover_pending_workflows, dead)
            print(
                f"tether worker {executor_id}: executors {', '.join(dead)} stopped beating; "
                f"recovered {len(recovered)} runs",
                file=sys.stderr,
                flush=True,
            )
        await asyncio.sleep(beat)


def ledger_for(url: str) -> Ledger:
    """The ledger of a store, for a process that only messages it (`tether send`)."""
    if url.startswith("sqlite"):
        use_modern_sqlite()
    return Ledger(url)
