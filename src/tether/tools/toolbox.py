"""Running the tool calls of one model reply: concurrently, bounded in time, never raising.

Every failure becomes an error result that tells the model what to fix: an unknown tool, arguments
that are not a JSON object or do not fit the schema, an exception, a timeout. Results come back in
the order of the calls, whatever order they finish in.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from ..approvals import ApprovalRequest, Approver, Decision, needs_approval
from ..deadlines import Deadlines, on_loop
from ..events import Emitter, call_dict, tool_result_data
from ..messages import ToolCall, ToolResult, ToolSpec, Usage
from ..redact import scrub
from ..tree import child_run_id
from .tool import CallTime, RunContext, Tool, ToolArgumentsError, tool_from_function, tool_output


class Toolbox:
    """An agent's tools by name: it validates each call's arguments, asks for approval where
    a tool's policy says so, runs the calls of one reply at the same time under their time
    limits, and turns every failure into an error result for the model."""

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = ()) -> None:
        self.tools: dict[str, Tool] = {}
        self.limits: Deadlines | None = None
        """The time limits of the calls in flight, on the loop they run on."""
        for t in tools:
            self.add(t)

    def add(self, t: Tool | Callable[..., Any]) -> None:
        """Add a tool (a plain function is made one, as `@tool` would); its arguments' model is
        built now, so a type pydantic cannot describe is an error where the agent is made, not
        in the middle of a run. Anything else is a TypeError that says what a tool is."""
        if not isinstance(t, Tool):
            if not callable(t):
                raise TypeError(
                    f"a tool is a function (or @tool, or Agent.as_tool()), not {type(t).__name__}"
                )
            t = tool_from_function(t)
        if t.name in self.tools and self.tools[t.name] is not t:
            raise ValueError(f"two tools are named {t.name!r}{clash_hint(t, self.tools[t.name])}")
        t.model()
        self.tools[t.name] = t

    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        return tuple(t.spec for t in self.tools.values())

    def __len__(self) -> int:
        return len(self.tools)

    def call_data(self, call: ToolCall, run_id: str) -> dict[str, Any]:
        """The `tool_call` event's data; a call that starts a child run (an agent used as a
        tool) names it, so a page can link it."""
        data = call_dict(call)
        t = self.tools.get(call.name)
        if t is not None and t.agent is not None:
            data["child_run_id"] = child_run_id(run_id, call.id, "")
        return data

    async def run(
        self,
        call: ToolCall,
        ctx: RunContext,
        approver: Approver | None = None,
        emitter: Emitter | None = None,
        finished: dict[str, ToolResult] | None = None,
    ) -> ToolResult:
        """One call, its failures turned into error results. A call that needs approval waits
        for `approver` first (without one, it is denied). Given `finished` (a run's calls in
        memory), the result is said as `tool_result` and put there as it comes. One coroutine
        runs the call and awaits the tool's own: a run holds one per call in flight, and a
        layer more was thousands of objects more to collect (as a closure a reply was)."""
        t, kwargs, refused = self.checked(call)
        if t is not None and t.approval != "never":
            refused = await self.approval(t, call, approver, emitter)
        if t is None or refused is not None:
            result = error(call, refused or "")
        else:
            if t.context_param:  # a context of the call's own: it may start a child run by it
                ctx = ctx.copy(
                    call_id=call.id, emitter=emitter or ctx.emitter, spent=[], time=CallTime()
                )
            limit = self.deadlines().start(t.timeout)
            if ctx.time is not None:
                ctx.time.limit = limit
            try:
                output, images = tool_output(await t.start(kwargs, ctx))
            except asyncio.CancelledError:
                if not limit.timed_out():
                    raise
                result = error(
                    call, f"Tool {call.name!r} timed out after {t.timeout:g} s and was stopped."
                )
            except BaseException as e:  # SystemExit from a tool must not end the process
                result = error(call, f"Tool {call.name!r} failed: {type(e).__name__}: {e}")
            else:
                result = ToolResult(call.id, call.name, scrub(output), images=images)
            finally:
                limit.close()
            if ctx.spent:  # what the call asked of the run's model is the run's, whatever came
                result = dataclasses.replace(result, usage=sum(ctx.spent, Usage()))
        if finished is not None and emitter is not None:
            emitter.tool_result(**tool_result_data(result))
            finished[result.call_id] = result
        return result

    def deadlines(self) -> Deadlines:
        """The limits of this toolbox's calls on the running loop (a new loop, new limits)."""
        self.limits = on_loop(self.limits)
        return self.limits

    def checked(self, call: ToolCall) -> tuple[Tool | None, dict[str, Any], str | None]:
        """The call's tool and validated arguments, or why it cannot run (an unknown tool,
        arguments that are no JSON object or do not fit the schema): then the tool is None."""
        t = self.tools.get(call.name)
        if t is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return None, {}, f"Unknown tool {call.name!r}. Available tools: {known}."
        if call.arguments is None:
            return (
                None,
                {},
                (
                    f"The arguments for {call.name!r} are not a JSON object: "
                    f"{call.raw_arguments[:200]!r}. Send the arguments as a JSON object."
                ),
            )
        try:
            return t, t.validate(call.arguments), None
        except ToolArgumentsError as e:
            return None, {}, str(e)

    async def approval(
        self, t: Tool, call: ToolCall, approver: Approver | None, emitter: Emitter | None
    ) -> str | None:
        """Why the call may not run (its policy asked, and no one approved it); None: it may."""
        if not needs_approval(t.approval, call.arguments or {}):
            return None
        decision = await self.ask(call, approver, emitter)
        if decision.approved:
            return None
        return (
            f"The call was not approved: {decision.reason}. "
            "Do not repeat it unchanged; choose another way or ask the user."
        )

    async def ask(
        self, call: ToolCall, approver: Approver | None, emitter: Emitter | None
    ) -> Decision:
        if approver is None:
            return Decision(False, "it needs approval and this run has no one to approve it")
        request = ApprovalRequest.for_call(call, getattr(approver, "ttl", None))
        if emitter is not None:
            emitter.approval_requested(**request.to_dict())
        decision = await approver(request)
        if emitter is not None:
            emitter.approval_decided(**decision.event(request.id, call.id))
        return decision

    def run_all(
        self,
        calls: Sequence[ToolCall],
        ctx: RunContext,
        emitter: Emitter,
        approver: Approver | None = None,
        finished: dict[str, ToolResult] | None = None,
    ) -> Awaitable[list[ToolResult]]:
        """All calls of one reply at the same time (each waiting for its own approval where it
        needs one); results in the order of the calls, and in `finished` as each completes.
        Said as `tool_call` events now, and run when awaited: several calls are the gather of
        their own, not a coroutine around it that a run held while they ran."""
        for c in calls:
            emitter.tool_call(**self.call_data(c, emitter.run_id))
        done = {} if finished is None else finished
        if len(calls) == 1:
            return self.run_one(calls[0], ctx, approver, emitter, done)
        return asyncio.gather(*[self.run(c, ctx, approver, emitter, done) for c in calls])

    async def run_one(
        self,
        call: ToolCall,
        ctx: RunContext,
        approver: Approver | None,
        emitter: Emitter,
        finished: dict[str, ToolResult],
    ) -> list[ToolResult]:
        """One call, in the run's own task (no task of its own for a reply of one call)."""
        return [await self.run(call, ctx, approver, emitter, finished)]


def clash_hint(*tools: Tool) -> str:
    """How to tell two tools of one name apart, when one is an MCP server's."""
    source = next((t.source for t in tools if t.source), "")
    if not source:
        return ""
    name = tools[0].name
    return (
        f" (one of them the MCP server {source!r}'s: offer its tools under a prefix, "
        f"--mcp-prefix '{source}=PREFIX', or leave it out, --mcp-skip '{source}#{name}')"
    )


def error(call: ToolCall, message: str) -> ToolResult:
    return ToolResult(call.id, call.name, scrub(message), is_error=True)
