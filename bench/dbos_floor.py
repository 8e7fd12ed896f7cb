"""DBOS's own cost of a run: the CPU of a workflow that does nothing, started and awaited the
way Tether starts a durable run (with its id, from async code), on the store Tether would use.

    .venv/bin/python bench/dbos_floor.py [--workflows 1000] [--store sqlite | postgresql://...]

Every durable run is one such workflow (its start and end records), whatever its length, so
this is the floor under a durable run's cost while DBOS keeps the runs' lives (#15). SQLite
connections are set up as Tether sets them (`sqlite.sqlite_engine_kwargs`: WAL, synchronous
NORMAL); a Postgres URL names a database to connect to first: a fresh one is made beside it,
and dropped after. One workflow runs first, unmeasured (imports, connections). Then the CPU of
reading an ended workflow's result: DBOS's `get_result` against Tether's `result_of`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

from durable_bench import cpu, drop, fresh_store  # the same directory


async def measure(workflows: int) -> dict[str, float]:
    from dbos import DBOS, SetWorkflowID

    from tether.durable.dbos_private import result_of

    @DBOS.workflow(name="floor")
    async def nothing(n: int) -> int:
        return n

    async def started(prefix: str) -> list[Any]:
        handles = []
        for n in range(workflows):
            with SetWorkflowID(f"{prefix}-{n}"):
                handles.append(await DBOS.start_workflow_async(nothing, n))
        return handles

    DBOS.launch()
    first = await DBOS.start_workflow_async(nothing, -1)
    await first.get_result()
    c0, t0 = cpu(), time.perf_counter()
    for h in await started("floor"):
        await result_of(h)  # as Tether reads a run's end
    used, wall = cpu() - c0, time.perf_counter() - t0
    # a result read each way, of workflows ended already: DBOS's own `get_result` serializes
    # it and hops to a thread to record the read (for a caller inside a workflow only)
    reads = {}
    for how, read in (("get_result", lambda h: h.get_result()), ("result_of", result_of)):
        handles = await started(how)
        await asyncio.gather(*(asyncio.shield(h.task) for h in handles))
        c1 = cpu()
        for h in handles:
            await read(h)
        reads[f"{how}_us"] = round((cpu() - c1) * 1e6 / workflows, 1)
    return {
        "cpu_ms_per_workflow": round(used * 1000 / workflows, 3),
        "wall_s": round(wall, 2),
        **reads,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workflows", type=int, default=1000)
    ap.add_argument("--store", default="sqlite", help="sqlite, or postgresql://server/database")
    ap.add_argument("--threads", type=int, default=20, help="DBOS's threads and connections")
    a = ap.parse_args()
    url, database = fresh_store(a.store)
    assert url is not None, "memory has no workflows"
    from dbos import DBOS

    from tether.durable.sqlite import sqlite_engine_kwargs

    config: dict[str, Any] = {
        "name": "tether-floor",
        "system_database_url": url,
        "log_level": "WARNING",
        "application_version": "floor",
        "sys_db_pool_size": a.threads,
        "max_executor_threads": a.threads,
    }
    if url.startswith("sqlite"):
        config["db_engine_kwargs"] = sqlite_engine_kwargs(url)  # as Tether's store has it
    DBOS(config=config)  # type: ignore[arg-type]
    try:
        out = asyncio.run(measure(a.workflows))
    finally:
        DBOS.destroy()
        if database is not None:
            drop(a.store, database)
    print(json.dumps({"store": a.store.split("://")[0], "workflows": a.workflows, **out}))
    os._exit(0)  # DBOS's threads are done with; nothing is left to write


if __name__ == "__main__":
    main()
