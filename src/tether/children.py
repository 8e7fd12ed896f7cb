"""Child runs: an agent run as a tool of another's run (`Agent.as_tool`, or a tool of your own
that calls `run_child`), in its parent's runtime when there is one, else inside the call, on
the parent's budget either way (`tree.Allowance`).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Protocol

import orjson

from .errors import ChildRunEnded
from .events import Emitter
from .output import jsonable
from .result import RunResult
from .tools.tool import RunContext
from .tree import child_run_id


class Runnable(Protocol):
    """What a child run needs of its agent (an `Agent`): its name, and a run."""

    name: str

    async def run(
        self,
        task: str | None,
        *,
        context: RunContext | None = None,
        run_id: str | None = None,
        emitter: Emitter | None = None,
    ) -> RunResult: ...


async def run_child(agent: Runnable, task: str, ctx: RunContext, name: str | None = None) -> str:
    """Run `agent` on `task` as a child of the run whose tool call this is, and return its
    answer (what `Agent.as_tool` does; a tool of your own that takes a `RunContext` may call
    it, once per child, each with its own `name`). The child runs in the runtime of its
    parent when there is one (`ctx.spawn`), else inside the call, on the parent's budget. A
    cancel of the call cancels the child and waits for it to end, so nothing of the child
    outlives its parent's call; a child that does not end `done` raises ChildRunEnded."""
    key = ctx.call_id if name is None or ctx.call_id is None else f"{ctx.call_id}.{name}"
    run_id = child_run_id(ctx.run_id, key, name or uuid.uuid4().hex[:8])
    child = ctx.for_child(run_id)
    if ctx.spawn is None:
        emitter = Emitter(run_id, ctx.tree_sinks)
        result: RunResult | None = await agent.run(
            task, context=child, run_id=run_id, emitter=emitter
        )
    else:
        handle = await ctx.spawn(agent, task, child, run_id)
        try:
            result = await handle.wait()
        except asyncio.CancelledError:
            handle.cancel()
            with contextlib.suppress(BaseException):
                await handle.wait()
            raise
    if result is None:
        raise ChildRunEnded(f"the agent {agent.name} (run {run_id}) never ran")
    if result.outcome != "done":
        raise ChildRunEnded(
            f"the agent {agent.name} (run {run_id}) ended {result.outcome}: {result.reason}"
        )
    if result.output is not None:
        return orjson.dumps(jsonable(result.output)).decode()
    return result.answer
