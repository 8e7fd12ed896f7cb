"""What one write of the ledger costs the client on Postgres: CPU and wall time a transaction,
one row of `tether_steps` each, the ways the ledger could make it (#61 item 2).

    bench/.venv-bench/bin/python bench/pg_writes.py [--store postgresql://127.0.0.1/postgres]
        [--writes 3000]

- `sqlalchemy`: a `Connection` of SQLAlchemy's engine, `text()`, begin and commit (the ledger
  before 2026-12-06, night);
- `psycopg transaction`: psycopg's own connection from the same pool, begin, insert, commit
  (`Ledger.transaction` now);
- `psycopg autocommit`: the insert alone, committed as it runs (`Ledger.once`, and a write of
  one row).

Each is timed on the calling thread and through `asyncio.to_thread`, as the ledger is called
from a run. A fresh database is made on the server and dropped after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from durable_bench import cpu, drop, fresh_store  # the same directory

from tether.durable.ledger import STEP_SQL, Ledger
from tether.durable.statements import pyformat


def row(i: int, run_id: str) -> dict[str, Any]:
    return {"r": run_id, "n": i, "k": "model", "o": b"x" * 200, "t": time.time()}


def ways(ledger: Ledger) -> dict[str, Callable[[dict[str, Any]], None]]:
    from sqlalchemy import text

    def sqlalchemy(params: dict[str, Any]) -> None:
        with ledger.engine.begin() as c:
            c.execute(text(STEP_SQL), params)

    def transaction(params: dict[str, Any]) -> None:
        with ledger.transaction() as run:
            run(STEP_SQL, params)

    def autocommit(params: dict[str, Any]) -> None:
        with ledger.connection(autocommit=True) as pg:
            pg.execute(pyformat(STEP_SQL), params)

    return {
        "sqlalchemy": sqlalchemy,
        "psycopg transaction": transaction,
        "psycopg autocommit": autocommit,
    }


async def measure(ledger: Ledger, writes: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, way in ways(ledger).items():
        for how in ("inline", "thread"):
            run_id = uuid.uuid4().hex
            c0, t0 = cpu(), time.perf_counter()
            for i in range(writes):
                if how == "inline":
                    way(row(i, run_id))
                else:
                    await asyncio.to_thread(way, row(i, run_id))
            used, wall = cpu() - c0, time.perf_counter() - t0
            out[f"{name}, {how}"] = {
                "cpu_us": round(used * 1e6 / writes),
                "wall_us": round(wall * 1e6 / writes),
            }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--store", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--writes", type=int, default=3000)
    a = ap.parse_args()
    url, database = fresh_store(a.store)
    assert url is not None and database is not None
    ledger = Ledger(url)
    try:
        found = asyncio.run(measure(ledger, a.writes))
    finally:
        ledger.close()
        drop(a.store, database)
    for name, figures in found.items():
        print(f"{name:38s} {figures['cpu_us']:5d} us CPU  {figures['wall_us']:5d} us wall")
    print(json.dumps(found))


if __name__ == "__main__":
    main()
