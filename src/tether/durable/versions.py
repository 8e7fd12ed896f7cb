"""Agents' versions across a store's processes: which runs a process may execute, the queues
that carry each version's runs, and a run's upgrade to another version.

A run records the version of the agent it started with (`Agent.version`, else a fingerprint of
what changes its behaviour). Deploys replace workers a few at a time, so for a while the store
has processes of two versions of one agent; a run must go on under the definition it began
with (its recorded steps name tools that may be gone or mean something else in the next one),
or under another only when someone says so (an upgrade).

- A run of a registered agent is queued on its version's queue, `tether:AGENT@VERSION`; a
  worker listens to the queues of the versions it has (`Serving.queues`). A run built from
  recorded options (every `tether run`) is queued on `tether`: any worker rebuilds its agent.
- The runs of a dead process are recovered by a live one that has their version, and put on
  their version's queue otherwise (`route`), where they wait for a worker of it: `tether runs`
  says `waiting for version 1`. A process that starts under the executor id of one that ran
  another version routes that one's runs first, then lets DBOS recover the rest.
- A run's version is its queue's when its queue names one, else the one it recorded: an
  upgrade moves the run to the new version's queue, one UPDATE of DBOS's row (a kill leaves it
  on one queue or the other, never between), and a worker of that version takes it and goes on
  from its last recorded step under the new definition.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from ..events import Emitter
from .formats import RunRecord, WorkflowInput
from .ledger import Ledger

QUEUE = "tether"
"""The queue of runs any worker takes: those built from recorded options, and those recorded
before runs had versions."""


def queue_for(agent: str, version: str | None) -> str:
    """The queue of a version's runs (`tether` for a run with no version to keep)."""
    return f"{QUEUE}:{agent}@{version}" if version else QUEUE


def home_of(record: RunRecord, queue: str | None) -> str:
    """The queue a run belongs on (its version's, or `tether`), from its record and the queue
    it is on now (an upgrade's names the version it goes on under)."""
    return queue_for(str(record.agent), wanted(record, queue))


def version_in(queue: str | None) -> tuple[str, str] | None:
    """The agent and version a queue carries (None: not a version's queue)."""
    if not queue or not queue.startswith(QUEUE + ":"):
        return None
    agent, at, version = queue.removeprefix(QUEUE + ":").rpartition("@")
    return (agent, version) if at and agent and version else None


def record_in(status: Any) -> RunRecord:
    """The run's record, from its DBOS status read with its input (an empty one, with no
    `format`, for a workflow that is not a run's)."""
    given = WorkflowInput.of(status)
    return given.record if given is not None else RunRecord()


def wanted(record: RunRecord, queue: str | None) -> str | None:
    """The version a run is to go on under: its queue's, else the one it recorded. None for a
    run built from recorded options (any process rebuilds its agent) or with no version."""
    if record.options is not None:
        return None
    named = version_in(queue)
    if named is not None and named[0] == record.agent:
        return named[1]
    return record.version


def upgraded(record: RunRecord, queue: str | None) -> bool:
    """Whether a run goes on under another version than it began with."""
    version = wanted(record, queue)
    return version is not None and version != record.version


@dataclass(frozen=True)
class Serving:
    """What a process can execute: the versions of the agents registered in its runtime, and,
    with a factory, runs built from recorded options."""

    agents: dict[str, str] = field(default_factory=dict)
    rebuilds: bool = True

    def takes(self, record: RunRecord, queue: str | None = None) -> bool:
        version = wanted(record, queue)
        if record.options is not None or version is None:
            return self.rebuilds or record.agent in self.agents
        return self.agents.get(str(record.agent)) == version

    def queues(self) -> list[str]:
        """The queues a worker of this process listens to."""
        versioned = [queue_for(agent, version) for agent, version in sorted(self.agents.items())]
        return [QUEUE, *versioned]

    def said(self) -> str:
        """`weather@1, triage@a3f9c2` and whether runs built from options are taken."""
        named = ", ".join(f"{agent}@{version}" for agent, version in sorted(self.agents.items()))
        rebuilt = "runs built from their recorded options" if self.rebuilds else ""
        return " and ".join(p for p in (named and f"agents {named}", rebuilt) if p) or "nothing"

    def to_list(self) -> list[str]:
        return [f"{agent}@{version}" for agent, version in sorted(self.agents.items())]


def route(store: Any, executors: list[str], serving: Serving) -> list[str]:
    """Put the pending runs of these executors (dead, or this process's own before it launches)
    that `serving` cannot take on their version's queue, for a worker that can; the ids moved.
    The rest stay pending for DBOS to recover here."""
    if not executors:
        return []
    found = store.list_workflows(status="PENDING", executor_id=executors, load_input=True)
    moved = []
    for status in found:
        record = record_in(status)
        if record.format is None or serving.takes(record, status.queue_name):
            continue  # not a run's (Tether's runs all record their format), or taken here
        store.resume_workflow(status.workflow_id, queue_name=home_of(record, status.queue_name))
        moved.append(status.workflow_id)
    return moved


class HandedBack(Exception):
    """A run this process took but may not execute: it is back on its version's queue."""


async def on_its_version(
    run_id: str, record: RunRecord, version: str, emitter: Emitter, ledger: Ledger
) -> None:
    """Check, as a run begins to execute here under an agent of `version`, that this is the
    version it is to go on under (`wanted`): its own, or an upgrade's (said as an `upgraded`
    event, and noted in the ledger where its history stands). A run that came here by another
    way (DBOS recovers a run into any process that listens to its queue) is put back on its
    version's queue: HandedBack, and DBOS records no outcome for it here (its row is no
    longer this execution's)."""
    recorded = record.version
    if record.options is not None or not recorded or recorded == version:
        return
    status = await outside_the_run(dbos_status(run_id))
    want = wanted(record, status.queue_name if status is not None else None)
    if want == version:
        await ledger.call(ledger.note_upgrade, run_id, recorded, version)
        emitter.upgraded(**{"from": recorded, "to": version})
        return
    await outside_the_run(dbos_resume(run_id, queue_for(str(record.agent), want)))
    raise HandedBack(f"run {run_id} is of version {want}, and this process has version {version}")


async def dbos_status(run_id: str) -> Any:
    from dbos import DBOS

    return await DBOS.get_workflow_status_async(run_id)


async def dbos_resume(run_id: str, queue: str) -> None:
    from dbos import DBOS

    await DBOS.resume_workflow_async(run_id, queue_name=queue)


def outside_the_run[T](work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """`work` in a fresh context: called inside a run's workflow, DBOS would record it as a
    step of the run, and a later execution of the run would find steps it never takes."""
    return asyncio.get_running_loop().create_task(work, context=contextvars.Context())


def home_queue(store: Any, run_id: str) -> str:
    """The queue a run goes back to (its version's, or `tether`), read from the store."""
    (status,) = store.list_workflows(workflow_ids=[run_id], load_input=True, load_output=False)
    return home_of(record_in(status), status.queue_name)
