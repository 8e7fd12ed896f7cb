"""The Supervisor: starts, finds, cancels and restarts runs; one run's crash touches no other.

    sup = Supervisor(max_runs=5000, max_model_calls=64)
    run = sup.start(agent, "Summarise the logs", restart=RestartPolicy("transient"))
    async for event in sup.bus.subscribe(run.id):  # from any offset
        ...
    run.send("Also count the errors")               # delivered before the next model call
    sup.cancel(run.id)
    await sup.shutdown(deadline=10)

Each run is its own asyncio task with a registry entry (at most one live run per id). Runs over
`max_runs` wait in a visible queue; model calls over `max_model_calls` per provider endpoint and
key wait likewise (both emit `queued` and `admitted`).
"""

from __future__ import annotations

import asyncio
import gc
import uuid
from collections import deque

from .admission import Limiter
from .agent import Agent
from .approvals import Approver
from .bus import Bus
from .errors import NoSuchRun, RunError, RunExists
from .events import Sink
from .messages import ImagePart, Message
from .run import RestartPolicy, Run, forget_old, supervise
from .tools.tool import RunContext

DEFAULT_MAX_MODEL_CALLS = 256
"""Measured on 2 cores with 10,000 concurrent runs (bench/scale.py): unbounded, a cancel took
3.5 s to land; bounded at 150-300, p99 20-31 ms at the same throughput."""


def tune_gc() -> None:
    """Collect garbage less often. Thousands of live runs keep many objects alive, and with
    CPython's default thresholds (700, 10, 10) full collections rescan them again and again:
    measured here, 65% of the CPU of 10,000 concurrent runs went to the collector; with these
    thresholds, 7% (bench/scale.py)."""
    gc.set_threshold(50_000, 50, 100)


class Supervisor:
    def __init__(
        self,
        *,
        max_runs: int | None = None,
        max_model_calls: int | None = DEFAULT_MAX_MODEL_CALLS,
        approval_ttl: float | None = None,
        gc_tuning: bool = False,
        keep_finished: int | None = 10_000,
    ) -> None:
        """`max_runs` bounds live runs (None: no bound); `max_model_calls` bounds concurrent
        model calls per provider endpoint and key, which keeps the event loop responsive under
        load (cancel stays fast) without holding a slot for runs that wait on a person.
        `keep_finished` is how many ended runs stay in memory (registry and event log) for
        lookups and replay; older ones are forgotten (None: all stay). `gc_tuning` sets the
        process's collector thresholds for many live runs (`tune_gc`): off by default, as the
        process may be another application's, which owns them."""
        if gc_tuning:
            tune_gc()
        self.bus = Bus()
        self.runs: dict[str, Run] = {}
        self.run_slots = Limiter(max_runs) if max_runs else None
        self.max_model_calls = max_model_calls
        self.call_limits: dict[str, Limiter] = {}
        self.approval_ttl = approval_ttl
        self.accepting = True
        self.keep_finished = keep_finished
        self.finished: deque[str] = deque()

    def start(
        self,
        agent: Agent,
        task: str | None,
        *,
        run_id: str | None = None,
        context: RunContext | None = None,
        restart: RestartPolicy | None = None,
        approver: Approver | None = None,
        sinks: list[Sink] | None = None,
        transcript: list[Message] | None = None,
        images: tuple[ImagePart, ...] = (),
    ) -> Run:
        """Start a run now (or queue it, over `max_runs`) and return it at once. `sinks` see
        every event as it is emitted (a journal, a tracer), before any subscriber does."""
        if not self.accepting:
            raise RunError("the supervisor is shutting down")
        run_id = run_id or uuid.uuid4().hex[:12]
        old = self.runs.get(run_id)
        if old is not None and old.alive:
            raise RunExists(f"a live run already has the id {run_id!r}")
        run = Run(
            run_id,
            agent,
            task,
            self.bus.log(run_id),
            context=context,
            approver=approver,
            approval_ttl=self.approval_ttl,
            restart=restart,
            transcript=transcript,
            images=images,
        )
        if sinks:
            run.emitter.watch(sinks)
        self.runs[run_id] = run
        run.limiter = self.limiter_for(agent)
        run.task_handle = asyncio.create_task(  # how it ended, its task says (`Run.task_ended`)
            supervise(run, run.restart, task, self.run_slots), name=f"run:{run_id}"
        )
        run.forget = self.forget_old
        run.task_handle.add_done_callback(run.task_ended)
        return run

    def get(self, run_id: str) -> Run:
        run = self.runs.get(run_id)
        if run is None:
            raise NoSuchRun(f"no run {run_id!r}")
        return run

    def cancel(self, run_id: str) -> bool:
        return self.get(run_id).cancel()

    def live(self) -> list[Run]:
        return [r for r in self.runs.values() if r.alive]

    def forget_old(self, run_id: str) -> bool:
        """Remember `run_id` as ended, and forget the oldest ended runs past the limit; whether
        this one is kept."""
        return forget_old(self.finished, self.keep_finished, self.runs, self.bus.logs, run_id)

    def limiter_for(self, agent: Agent) -> Limiter | None:
        if not self.max_model_calls:
            return None
        key = getattr(agent.model, "endpoint", agent.model.provider)
        limiter = self.call_limits.get(key)
        if limiter is None:
            limiter = self.call_limits[key] = Limiter(self.max_model_calls)
        return limiter

    async def shutdown(self, deadline: float = 10.0) -> list[str]:
        """Stop taking runs, give live ones `deadline` seconds to end, then cancel the rest.
        Returns the ids of the runs that had to be cancelled."""
        self.accepting = False
        tasks = {r.id: r.task_handle for r in self.live() if r.task_handle is not None}
        if not tasks:
            return []
        _, pending = await asyncio.wait(tasks.values(), timeout=deadline)
        cancelled = [rid for rid, t in tasks.items() if t in pending]
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5.0)
        return cancelled
