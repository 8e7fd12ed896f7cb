"""The web page's runs when they are recorded in a store (`tether serve`, durable by default).

`StoredRuns` stands where the `Supervisor` stands for runs in memory, with the same surface the
page uses: an event bus to follow, runs found by id that take messages, approvals and cancels.
A run started from the page is a durable run (see `durable.py`) executed by the server process;
its live events go to the bus and the journal, so the page replays it from its first event.
Messages go to the store's inbox, approvals travel as the run's durable messages, a cancel stops
it in the store and here at once.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

from .. import durable
from ..approvals import ApprovalError, ApprovalRequest, arguments_hash
from ..bus import Bus, EventLog
from ..errors import NoSuchRun, RunEnded
from ..events import Event, Sink
from ..messages import Message, ToolCall

SpecFactory = Callable[[dict[str, Any]], dict[str, Any]]
"""The page's form (model, tools, budget) -> the run's options, as a worker rebuilds them."""


class StoredRun:
    def __init__(self, run_id: str, store: str) -> None:
        self.id = run_id
        self.store = store
        self.status = "queued"
        self.result: dict[str, Any] | None = None
        self.pending: dict[str, ApprovalRequest] = {}
        self.ended = asyncio.Event()

    @property
    def desk(self) -> StoredRun:  # the page asks `run.desk.waiting()`
        return self

    def waiting(self) -> list[ApprovalRequest]:
        return list(self.pending.values())

    @property
    def transcript(self) -> list[Message]:
        if self.result is not None:
            return list(self.result.get("messages") or [])
        return durable.messages_of(durable.client(self.store), self.id)

    def track(self, event: Event) -> None:
        d = event.data
        if event.type == "approval_requested":
            call = ToolCall(d["id"], d["name"], d["arguments"], "")
            self.pending[d["approval_id"]] = ApprovalRequest(
                d["approval_id"], call, arguments_hash(d["name"], d["arguments"]), None
            )
        elif event.type == "approval_decided":
            self.pending.pop(d["approval_id"], None)

    def send(self, text: str) -> None:
        if self.ended.is_set():
            raise RunEnded(f"run {self.id} has ended ({self.status}); start a new one")
        durable.ledger().send(self.id, text)

    def approve(self, approval_id: str, args_hash: str | None = None) -> None:
        self.answer(approval_id, True, "approved in the web page", args_hash)

    def deny(self, approval_id: str, reason: str = "denied by the user") -> None:
        self.answer(approval_id, False, reason, None)

    def answer(self, approval_id: str, approved: bool, reason: str, args_hash: str | None) -> None:
        request = self.pending.get(approval_id)
        if request is None:
            raise ApprovalError(f"no approval {approval_id!r} is waiting (decided or expired)")
        if args_hash is not None and args_hash != request.args_hash:
            raise ApprovalError(f"approval {approval_id!r} was shown other arguments")
        from dbos import DBOS

        reply = {"approved": approved, "reason": reason}
        durable.detached(DBOS.send_async(self.id, reply, topic=approval_id))

    def cancel(self) -> bool:
        if self.ended.is_set():
            return False
        durable.detached(durable.cancel(self.id))
        return True

    async def wait(self) -> dict[str, Any] | None:
        await self.ended.wait()
        return self.result


class StoredRuns:
    def __init__(self, store: str, spec_for: SpecFactory) -> None:
        self.store = store
        self.spec_for = spec_for
        self.bus = Bus()
        self.runs: dict[str, StoredRun] = {}
        durable.prepare(store)

    async def start_form(
        self, form: dict[str, Any], task: str, run_id: str | None, sinks: list[Sink]
    ) -> StoredRun:
        """Start a run; returns once it is recorded (accepted means durable)."""
        spec = self.spec_for(form)
        run_id = run_id or uuid.uuid4().hex[:12]
        if run_id in self.bus.logs:
            raise ValueError(f"run_id: {run_id!r} is taken")
        agent, _, _ = await durable.agent_for(run_id, spec)
        run = self.runs[run_id] = StoredRun(run_id, self.store)
        log = self.bus.log(run_id)
        emitter = durable.watch(run_id, [log.append, run.track, *sinks])
        emitter.emit(
            "run_started", task=task, provider=agent.model.provider, model=agent.model.name
        )
        handle = await durable.start_spec(self.store, run_id, spec, task)
        run.status = "running"
        durable.detached(self.follow(run, handle))
        return run

    async def follow(self, run: StoredRun, handle: Any) -> None:
        emitter = durable.emitter_for(run.id)
        try:
            result: dict[str, Any] = await handle.get_result()
        except asyncio.CancelledError:
            this = asyncio.current_task()
            if this is not None and this.cancelling():
                raise  # the server stops; the run stays recorded
            run.status = "cancelled"  # the run was cancelled (`durable.cancel`)
            emitter.emit("run_finished", outcome="cancelled", answer="", reason="cancelled")
        except Exception as e:  # cancelled in the store, or failed inside DBOS
            cancelled = "cancel" in type(e).__name__.lower()
            run.status = "cancelled" if cancelled else "failed"
            emitter.emit("run_finished", outcome=run.status, answer="", reason=str(e) or "")
        else:
            run.result = result
            run.status = result["outcome"]
            emitter.emit("run_finished", **durable.finished(result))
        finally:
            self.bus.log(run.id).close()
            durable.unwatch(run.id)
            run.ended.set()

    async def adopt(self, archived: dict[str, list[Event]], sinks: list[Sink]) -> list[str]:
        """Take over the runs of this page that a server here was executing when it died, so
        they finish and their pages go on (`archived`: the journaled runs, by id)."""
        from dbos import DBOS

        if not archived:
            return []
        taken = await durable.recover_orphans(list(archived))
        for run_id in taken:
            events = archived.pop(run_id)
            log = self.bus.logs[run_id] = EventLog(run_id)
            log.events.extend(events)
            run = self.runs[run_id] = StoredRun(run_id, self.store)
            run.status = "running"
            emitter = durable.watch(run_id, [log.append, run.track, *sinks])
            emitter.seq = len(events)  # the page numbers on from the journal
            handle: Any = await DBOS.retrieve_workflow_async(run_id)
            durable.detached(self.follow(run, handle))
        return taken

    def get(self, run_id: str) -> StoredRun:
        run = self.runs.get(run_id)
        if run is None:
            raise NoSuchRun(f"no run {run_id!r}")
        return run

    async def shutdown(self, deadline: float) -> None:
        """Runs still going stay recorded: `tether resume RUN_ID` finishes them."""
