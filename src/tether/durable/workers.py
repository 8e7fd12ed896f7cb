"""A worker (`tether worker`): takes queued runs, beats, and recovers the runs of the dead.

Every worker on a store beats in the ledger; one that stops beating for `dead_after` seconds is
dead, and the next worker to notice recovers its runs (DBOS's open source edition does not move a
dead executor's runs by itself). A worker also takes over the runs of this machine's `tether run`
processes that died, and queues again the runs it stopped while the store did not answer.
"""

from __future__ import annotations

import asyncio
import time

from ..admission import Limiter
from .dbos_private import listen_to
from .outage import cause_of
from .process import DurableRuns, say
from .versions import QUEUE, home_queue, route


async def work(runs: DurableRuns, concurrency: int, beat: float, dead_after: float) -> None:
    """Run queued runs until cancelled. Every `beat` seconds this worker records that it is
    alive, and recovers the runs of any worker silent for `dead_after` seconds (DBOS's open
    source edition does not move a dead executor's runs by itself)."""
    from dbos import DBOS

    serving = runs.serving()
    queues = serving.queues()  # runs built from options, and each version's here
    for queue in queues:
        await DBOS.register_queue_async(queue, worker_concurrency=concurrency)
        listen_to(queue)
    if len(queues) > 1 and runs.run_slots is None:  # DBOS bounds each queue on its own:
        runs.run_slots = Limiter(concurrency)  # the worker's runs at once stay `concurrency`
    runs.working = True
    name = runs.executor_id
    await runs.ledger.call(runs.ledger.serve, name, serving.to_list(), dead_after)
    say(f"tether worker {name}: executes {serving.said()}")
    while True:
        try:
            dead = await beat_once(runs, name, dead_after)
            await tend(runs, name, dead)  # recovering hundreds of runs takes its time
        except Exception as e:
            say(f"tether worker {name}: {type(e).__name__}: {cause_of(str(e))}; goes on")
        await asyncio.sleep(beat)


async def beat_once(runs: DurableRuns, name: str, dead_after: float) -> list[str]:
    """Record that this worker is alive; the workers that stopped beating, to recover.
    The beat also tells whether the store answers: one that has not after the patience
    is said once, and the worker waits for it. The beat is never cancelled, for it forgets
    the dead workers it returns: its answer must not be lost."""
    beating = asyncio.ensure_future(runs.ledger.call(runs.ledger.beat, name, dead_after))
    done, _ = await asyncio.wait({beating}, timeout=runs.patience)
    if done:
        return beating.result()
    since = time.monotonic() - runs.patience
    cause = runs.quiet.cause or "no reply"
    say(f"tether worker {name}: the store does not answer ({cause}); waiting")
    dead = await beating
    waited = time.monotonic() - since
    say(f"tether worker {name}: the store answers again (after {waited:.0f} s)")
    return dead


async def tend(runs: DurableRuns, name: str, dead: list[str]) -> None:
    """A worker's round after its beat: take over the runs of dead processes here,
    recover the runs of the workers that stopped beating (`dead`), and queue again the
    runs this worker stopped when the store did not answer (`give_up`), now that it does."""
    from dbos import DBOS

    taken = await runs.take_over()  # runs of `tether run` processes that died here
    if taken:
        say(
            f"tether worker {name}: took over {len(taken)} runs whose process died: "
            f"{', '.join(taken)}"
        )
    if dead:  # each run to a worker of its version: here, or its version's queue
        moved = await asyncio.to_thread(route, runs.reader, dead, runs.serving())
        recovered = await asyncio.to_thread(DBOS._recover_pending_workflows, dead)
        say(
            f"tether worker {name}: executors {', '.join(dead)} stopped beating; "
            f"recovered {len(recovered)} runs"
            + (f", and put {len(moved)} on their versions' queues" if moved else "")
        )
    for line in await asyncio.to_thread(unserved, runs):
        say(f"tether worker {name}: {line}")
    if runs.abandoned:
        stopped = sorted(runs.abandoned)
        for run_id in stopped:
            queue = await asyncio.to_thread(home_queue, runs.reader, run_id)
            await DBOS.resume_workflow_async(run_id, queue_name=queue)
            runs.abandoned.discard(run_id)
        say(
            f"tether worker {name}: queued again {len(stopped)} runs stopped while the store "
            f"did not answer: {', '.join(stopped)}"
        )


UNSERVED_LOOK = 100
"""The most recently queued runs a worker looks at, each round, for ones it cannot take."""


def unserved(runs: DurableRuns) -> list[str]:
    """What to say of the queued runs this worker cannot take, each once: a Python agent's run
    waits on its version's queue for a worker that registers that agent (`tether worker
    --tools-from app.py` builds runs from their recorded options only), and the worker's log
    said nothing while the run waited for ever."""
    from .view import WORKFLOW

    mine = set(runs.serving().queues())
    queued = runs.reader.list_workflows(
        name=WORKFLOW, status="ENQUEUED", load_input=False, limit=UNSERVED_LOOK, sort_desc=True
    )
    said = []
    for w in queued:
        queue = w.queue_name or ""
        if queue in mine or w.workflow_id in runs.unserved_said or not queue.startswith(QUEUE):
            continue
        runs.unserved_said.add(w.workflow_id)
        agent, _, version = queue.removeprefix(f"{QUEUE}:").rpartition("@")
        said.append(
            f"run {w.workflow_id} waits for a worker of agent {agent or '?'} version "
            f"{version or '?'}, which this one does not have (it executes "
            f"{runs.serving().said()}): "
            f"start a Python worker that registers the agent (Runtime(store=..., agents=[...]) "
            "and `await rt.work()`), or `tether upgrade` the run"
        )
    return said
