"""The driver's effects in a durable run (see `agent.Effects`): each effect is a recorded step.

The workflow runs the same driver as a run in memory (`agent.execute`) over `RecordedEffects`:
a model call, fitting the context, the guardrails' verdicts, the tool calls of one reply and a
look at the inbox are each a step, numbered in the order the run takes them and recorded in the
ledger (`ledger.py`, group commit) as typed values (`steps.py`). A replay after a crash gets the
recorded answers without the work; the first unfinished step runs again. Inside a tool step each
call is journaled on its own: a call the journal shows finished gives back its result, one that
started and never finished runs again only if its tool is idempotent, and otherwise gives the
model an "outcome unknown" error, so a payment is never made twice silently.

Approvals are decided in the workflow (`decide`), as DBOS messages, so a waiting call survives
restarts; the clock is the recorded time of the last step, so reading it costs no step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..accounts import Cost
from ..admission import Limiter
from ..agent import Agent, judge
from ..approvals import (
    ApprovalRequest,
    Decision,
    approve_all,
    arguments_hash,
    deny_all,
    needs_approval,
)
from ..context import fit
from ..errors import RecordError, ReplayDiverged, StoreUnavailable, known
from ..events import Emitter, Event, tool_result_data
from ..guardrails import Kind, Verdict
from ..loop import LoopState
from ..messages import (
    Message,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolResult,
    filled,
    hollow,
    hollow_result,
)
from ..paying import lend_model, model_call, summarized
from ..tools.tool import RunContext
from . import notices
from .accounts import StoredAccounts
from .formats import RunRecord
from .ledger import CallState, Ledger
from .run import DurableRun
from .steps import KIND_OF, ContextStep, GuardStep, InboxStep, ModelStep, Step, ToolsStep, kind_of
from .steps import read as read_step
from .steps import record as step_record
from .view import MAIL

S = TypeVar("S", bound=Step)

IDLE_WAIT_S = 24 * 3600.0
"""How long a permanent run idles for its next message before it looks again (a wake-up is a
durable message, so the wait survives restarts either way)."""
APPROVAL_WAIT_S = 24 * 3600.0
"""How long a call waits for its approval before it is denied as expired."""

UNKNOWN_OUTCOME = (
    "Outcome unknown: this call started before a crash and may or may not have taken effect. "
    "It was not run again; check its effect before retrying."
)


class RecordedEffects:
    """A durable run's effects, each a recorded step (see `step`)."""

    def __init__(self, run: DurableRun, record: RunRecord, limiter: Limiter | None) -> None:
        self.run, self.record, self.limiter = run, record, limiter
        self.agent: Agent = known(run.agent, "the agent of a run that executes here")
        self.context: RunContext = known(run.context, "the context of a run that executes here")
        self.account, self.rates = self.context.account_id, self.context.rates
        self.ledger: Ledger = run.host.ledger
        self.clock = 0.0  # until the first model call (its recorded start), no time has passed
        self.seen = 0  # the last inbox message delivered
        self.mail = run.mail_before if run.fresh else None
        """What was said of mail when the inbox was last read (for a run begun here, before it
        was recorded: until something is said, its inbox is empty and not read)."""
        self.n = 0  # the number of the next step
        self.recorded: dict[int, tuple[str, bytes]] = {}  # what a replay has yet to go through
        self.origin = record.origin  # a fork's
        self.riders: list[tuple[str, dict[str, Any]]] = []
        """Writes that go with the next step's record: its model call's settlement."""
        self.calls_left = 0  # the calls of the running tool step yet to end
        self.last: ToolResult | None = None  # the call whose result rides with its step

    guard_beside_model = False  # its steps must keep one order: the guardrails ask first

    def replay(self, steps: list[tuple[int, str, bytes, float]]) -> None:
        """Go through these recorded steps (the ledger's, in order) before doing any work."""
        self.recorded = {n: (kind, output) for n, kind, output, _ in steps}

    async def step(self, kind: type[S], work: Callable[[], Awaitable[S]]) -> S:
        """The run's next step (of the step type `kind`, `steps.py`): what was recorded of it, or
        `work` done and recorded (with the steps of other runs that complete at the same
        moment: `ledger.Writer`). A step recorded as another kind means that the agent's code
        no longer takes the same path: the replay stops there instead of pairing answers with
        the wrong questions."""
        n, self.n = self.n, self.n + 1
        found = self.recorded.pop(n, None)
        if found is not None:
            recorded = read_step(found[0], found[1], f"run {self.run.id}'s step {n}")
            if not isinstance(recorded, kind):
                raise ReplayDiverged(
                    f"run {self.run.id}: step {n} was recorded as {found[0]} and is now "
                    f"{KIND_OF[kind]}; the agent's code changed since the run started"
                )
            return recorded
        self.run.stepped = True  # live from here: its events are shown
        self.riders = []  # a step that failed left its writes: its held call counts as spent
        out = await work()
        also, self.riders = self.riders, []
        await self.ledger.record_step(self.run.id, n, kind_of(out), step_record(out), also)
        return out

    def now(self) -> float:
        return self.clock

    def stopped(self) -> StoreUnavailable | None:
        return self.run.lost

    def told(self, text: str) -> None:
        if self.run.stepped:  # live: a replay's watchers saw it already
            self.run.emitter.user_message(text=text, by="check")

    async def filled(self, messages: list[Message]) -> list[Message]:
        """`messages` with the bytes of their images read back (records hold them hollow)."""
        wanted = sorted({i.sha256 for m in messages for i in m.images if i.data is None})
        if not wanted:
            return messages
        found = await self.ledger.call(self.ledger.images, wanted)
        lost = [h[:12] for h in wanted if h not in found]
        if lost:
            raise RecordError(f"the store has lost the bytes of image(s) {', '.join(lost)}")
        return [filled(m, found) for m in messages]

    # -- the effects ------------------------------------------------------------------------

    async def guard(self, kind: Kind, value: Any) -> list[Verdict]:
        found = await self.step(GuardStep, lambda: self.guard_step(kind, value))
        return [Verdict.from_dict(v) for v in found.verdicts]

    async def fit(self, state: LoopState, force: bool) -> None:
        messages, key = list(state.messages), f"step {self.n}"
        out = await self.step(ContextStep, lambda: self.context_step(messages, force, key))
        state.messages[:] = await self.filled(out.messages)
        self.agent.charge(state, out.usage)

    async def call_model(self, state: LoopState) -> ModelResponse:
        request = self.agent.request(state)
        # the call is settled with its account in the transaction that records its step
        key, first = f"step {self.n}", state.steps == 0
        out = await self.step(ModelStep, lambda: self.model_step(request, key, first))
        self.clock = out.ended
        if state.steps == 0:
            state.started_at = out.began
        # the messages went in before the reply: the transcript says so too
        state.messages.extend(Message.user(text) for _, text in out.arrived)
        state.inbox.extend(text for _, text in out.late)  # after the answer
        self.seen = max([self.seen, *(n for n, _ in out.arrived + out.late)])
        return out.response

    async def run_tools(self, state: LoopState, calls: list[ToolCall]) -> list[ToolResult]:
        if self.run.stepped:  # while the run replays, its watchers saw these
            self.run.announce(calls)
        decisions = await self.decide(calls)
        # live since an earlier step (the reply, or the guardrails after it): a step is
        # recorded before the next begins, so no earlier attempt can have started these calls
        fresh = self.run.stepped
        out = await self.step(ToolsStep, lambda: self.tools_step(calls, decisions, fresh))
        if self.last is not None:  # its result is recorded now, with the step: say so
            self.run.emitter.tool_result(**tool_result_data(self.last))
            self.last = None
        results, self.clock = out.results, out.ended
        if not any(r.images for r in results):
            return list(results)
        (message,) = await self.filled([Message("tool", tuple(results))])
        return message.tool_results

    async def next_message(self) -> None:
        """Idle (a permanent run between answers; `idle` is announced) until the inbox has a
        message the run has not seen; the next model call takes it. A wake-up is a DBOS
        message, so the wait survives restarts; the inbox is read in a step, so a replay sees
        what the run saw."""
        from dbos import DBOS

        idle = False
        while not (await self.step(InboxStep, self.inbox_step)).unseen:
            if not idle:
                self.run.emitter.idle()
                idle = True
            await DBOS.recv_async(MAIL, timeout_seconds=IDLE_WAIT_S)

    async def decide(self, calls: list[ToolCall]) -> list[Decision | None]:
        """Approvals are decided in the workflow, durably: a waiting call survives restarts.
        Every call of the reply is put to the user at once and each is decided on its own; the
        answers are taken in the order of the calls (they wait as messages until then)."""
        from dbos import DBOS

        emitter = self.run.emitter
        policy = self.record.approvals
        decisions: list[Decision | None] = [None] * len(calls)
        waiting: list[tuple[int, ToolCall, str]] = []
        for i, call in enumerate(calls):
            tool = self.agent.toolbox.tools.get(call.name)
            if tool is None or not needs_approval(tool.approval, call.arguments):
                continue
            request = ApprovalRequest.for_call(call)  # waits a day at most (APPROVAL_WAIT_S)
            if policy == "wait":  # what `tether approve` checks an answer against
                await DBOS.set_event_async(request.id, {**shown_of(call), "state": "waiting"})
            emitter.approval_requested(**request.to_dict())
            if policy == "wait":
                waiting.append((i, call, request.id))
                continue
            decision = await (approve_all if policy == "auto" else deny_all)(request)
            emitter.approval_decided(**decision.event(request.id, call.id))
            decisions[i] = decision
        for i, call, ap in waiting:
            decisions[i] = await self.answer_to(call, ap)
        return decisions

    async def answer_to(self, call: ToolCall, ap: str) -> Decision:
        """The person's answer to approval `ap` (denied as expired after a day); what it
        showed stays in the store, with the answer: a page following the store shows both."""
        from dbos import DBOS

        answer = await DBOS.recv_async(ap, timeout_seconds=APPROVAL_WAIT_S)
        if answer is None:
            decision = Decision(False, "the approval expired")
        else:
            decision = Decision(bool(answer.get("approved")), str(answer.get("reason", "")))
        state = {"state": "decided", "approved": decision.approved, "reason": decision.reason}
        await DBOS.set_event_async(ap, {**shown_of(call), **state})
        self.run.emitter.approval_decided(**decision.event(ap, call.id))
        return decision

    # -- the work each step does when it is not replayed -----------------------------------

    def riding(self, key: str) -> Callable[[Cost], Awaitable[None]] | None:
        """How the call `key` is settled with its account on a store: in the transaction that
        records its step (none of its own), so a recorded step is settled and one that is not
        recorded still holds its estimate (a repeat counts it spent, as for a crash)."""
        accounts, account = self.context.accounts, self.context.account_id
        if not isinstance(accounts, StoredAccounts) or account is None:
            return None

        async def ride(cost: Cost) -> None:
            self.riders.extend(accounts.settlement(account, self.run.id, key, cost))

        return ride

    async def model_step(self, request: ModelRequest, key: str, first: bool) -> ModelStep:
        """One model call, with the user messages that arrived since message `seen`: the
        recorded output says which went in, so a replay delivers the same ones. The call is
        reserved against the run's account as `key` (`agent.paid`)."""
        emitter, seen = self.run.emitter, self.seen
        arrived = await self.unread(seen)
        if arrived:
            extra = tuple(Message.user(text) for _, text in arrived)
            request = dataclasses.replace(request, messages=request.messages + extra)
            for _, text in arrived:
                emitter.user_message(text=text)

        began = time.time()

        def sent() -> None:
            nonlocal began  # from here: an account's queue is no model latency
            began = time.time()

        response = await model_call(
            self.agent, self.context, key, request, first, emitter, self.limiter,
            self.riding(key), sent,
        )  # fmt: skip
        late: list[tuple[int, str]] = []
        if not response.message.tool_calls:  # an answer: a message sent meanwhile reopens it
            last = max([seen, *(n for n, _ in arrived)])
            late = await self.unread(last)
            for _, text in late:
                emitter.user_message(text=text)
        return ModelStep(response, began, time.time(), arrived, late)

    async def unread(self, seen: int) -> list[tuple[int, str]]:
        """The messages in the run's inbox past message `seen`: none without a look when no
        message was sent to any run of the store since this run last looked (`notices.py`; a
        query a model call, for runs that are almost never sent one)."""
        ledger = self.ledger
        mark = ledger.notices.mark(notices.MAIL)  # first: one sent during the read: next time
        if mark is not None and mark == self.mail:
            return []
        found = await ledger.call(ledger.messages_after, self.run.id, seen)
        self.mail = mark
        return found

    async def context_step(self, messages: list[Message], force: bool, key: str) -> ContextStep:
        """Fit the conversation to the model's window (`context.fit`): the new messages, the
        summary call's usage (counted against the run's account with the step's record), and
        what was replaced, recorded as one step."""
        agent, live = self.agent, self.run.emitter
        window = known(agent.context, "the context window of an agent that fits one")
        happened: list[tuple[str, dict[str, Any]]] = []

        def keep(event: Event) -> None:
            happened.append((event.type, event.data))
            live.send(event.type, dict(event.data))

        quiet = Emitter(self.run.id, [keep])
        usage = await fit(agent.model, messages, agent.system, window, quiet, force)
        await summarized(agent, self.context, usage, key, self.riding(key))
        return ContextStep([hollow(m) for m in messages], usage, happened)

    async def tools_step(
        self, calls: list[ToolCall], decisions: list[Decision | None], fresh: bool
    ) -> ToolsStep:
        """The calls of one reply, at the same time, in one recorded step; each call is
        journaled on its own (see `ledger.py`), so a step made again repeats no finished call.
        `fresh`: the reply was made here, so no earlier attempt can have started its calls
        (none is read)."""
        self.run.announce(calls)  # those a replay passed over silently
        ledger, run_id = self.ledger, self.run.id
        ids = [c.id for c in calls]
        started: dict[str, tuple[CallState, ToolResult | None]]
        if fresh:
            await ledger.start_fresh(run_id, ids)
            started = {i: ("fresh", None) for i in ids}
        else:
            started = await ledger.call(ledger.start_calls, run_id, ids)
        self.calls_left, self.last = len(calls), None
        results = await asyncio.gather(
            *(self.one_call(c, d, *started[c.id]) for c, d in zip(calls, decisions, strict=True))
        )
        return ToolsStep(list(results), time.time())

    async def inbox_step(self) -> InboxStep:
        """Whether the run's inbox has a message after message `seen`."""
        ledger = self.ledger
        return InboxStep(bool(await ledger.call(ledger.messages_after, self.run.id, self.seen)))

    async def guard_step(self, kind: Kind, value: Any) -> GuardStep:
        """The verdicts of the agent's guardrails of `kind`, recorded: a replay asks none."""
        found = await judge(self.agent, kind, value, self.run.emitter)
        return GuardStep([v.to_dict() for v in found])

    async def one_call(
        self, call: ToolCall, decision: Decision | None, state: str, recorded: ToolResult | None
    ) -> ToolResult:
        """One call of a tool step: its journaled result, "outcome unknown" for one that
        started before a crash and may not run twice, or the call made and journaled."""
        tool = self.agent.toolbox.tools.get(call.name)
        if recorded is not None:
            result = recorded
        elif state == "interrupted" and tool is not None and not tool.idempotent:
            result = ToolResult(call.id, call.name, UNKNOWN_OUTCOME, is_error=True)
        else:
            result = await self.call_tool(call, decision)
        self.calls_left -= 1
        if recorded is None:
            if result.images:  # kept once; the records name them
                await self.ledger.call(self.ledger.keep_images, list(result.images))
            if not self.calls_left:  # the step's last: its record is the step's (ledger.py)
                self.last = result  # its event once that commits (`run_tools`)
                return hollow_result(result)
            await self.ledger.finish_call(self.run.id, result)
        self.run.emitter.tool_result(**tool_result_data(result))
        return hollow_result(result)

    async def call_tool(self, call: ToolCall, decision: Decision | None) -> ToolResult:
        ctx = known(self.run.context, "the context of a run that executes").copy()
        ctx.idempotency_key = f"{self.run.id}:{call.id}"
        ctx.emitter = self.run.emitter  # the call's progress and questions are the run's events
        lend_model(self.agent, ctx, self.run.emitter)  # the run's, on its budget
        approver = None
        if decision is not None:

            async def given(request: Any) -> Decision:
                return decision

            approver = given
        # decided in the workflow (`decide`), which told the watchers already
        return await self.agent.toolbox.run(call, ctx, approver)


def shown_of(call: ToolCall) -> dict[str, Any]:
    """What a person is asked to approve, and what `tether approve` checks an answer against."""
    return {
        "name": call.name,
        "arguments": call.arguments,
        "args_hash": arguments_hash(call.name, call.arguments),
    }
