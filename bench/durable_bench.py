"""Durable throughput: runs per second and the CPU each step costs, on SQLite and on Postgres,
side by side with the same runs in memory, with the shared rig's mock model (no latency).

    .venv/bin/python bench/durable_bench.py [--runs 100] [--reps 5]
        [--stores memory,sqlite,postgresql://127.0.0.1/postgres]

Each run: 3 turns of 3 parallel tool calls (tools that return at once), then the answer: 13
steps, 4 model calls and 9 tool calls. Every repetition of every store runs in a process of
its own (DBOS serves one store a process), one store after the other, round after round, on a
fresh SQLite file or a fresh Postgres database each time; the table gives medians, and what
durability costs a step: the store's CPU less memory's, from the same round.

    .venv/bin/python bench/durable_bench.py --one STORE    one measurement, as JSON
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from scale import free_port, start_mock  # the same directory

BENCH = Path(__file__).resolve().parent
STEPS = 13  # 4 model steps + 9 tool steps a run


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def bench_agent(base_url: str) -> Any:
    """The same agent for every run, in memory and durable: one tool that returns at once."""
    from tether import Agent, OpenAIChatModel, tool

    @tool(idempotent=True)
    async def sleep_tool(ms: int) -> str:
        """Return at once."""
        return "slept"

    model = OpenAIChatModel("gpt-4.1-mini", api_key="sk-bench", base_url=base_url, stream=False)
    return Agent(model, [sleep_tool], name="bench")


async def measure(store: str | None, base_url: str, runs: int) -> dict[str, float]:
    """`runs` concurrent runs on a Runtime (in memory for `store=None`): the same code. One
    run first, unmeasured, so that imports and connections are not counted."""
    from tether import Runtime
    from tether.approvals import approve_all

    agent = bench_agent(base_url)
    tag = time.strftime("%H%M%S")
    async with Runtime(store, [agent], take_over=False) as rt:
        warm = await rt.start("bench", TASK, run_id=f"warm-{tag}", approver=approve_all)
        await warm.wait()
        c0, t0 = cpu(), time.perf_counter()
        started = [
            await rt.start("bench", TASK, run_id=f"bench-{tag}-{i}", approver=approve_all)
            for i in range(runs)
        ]
        results = [await run.wait() for run in started]
        wall, used = time.perf_counter() - t0, cpu() - c0
    await agent.model.aclose()
    assert all(r is not None and r.outcome == "done" for r in results), results[:1]
    return {"runs_per_s": runs / wall, "wall_s": wall, "cpu_s": used}


TASK = "Run the tools, then answer."


def fresh_store(kind: str) -> tuple[str | None, str | None]:
    """(the store's URL, a Postgres database to drop afterwards) for `kind`: memory, sqlite,
    or a postgresql:// server URL (a new database on it for each measurement)."""
    if kind == "memory":
        return None, None
    if kind == "sqlite":
        return f"sqlite:///{tempfile.mkdtemp()}/bench.sqlite", None
    import psycopg

    name = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(kind.replace("postgresql+psycopg", "postgresql"), autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    return kind.rsplit("/", 1)[0] + "/" + name, name


def drop(server: str, name: str) -> None:
    import psycopg

    with psycopg.connect(server, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def one(kind: str, base_url: str, runs: int) -> dict[str, Any]:
    store, database = fresh_store(kind)
    try:
        out = asyncio.run(measure(store, base_url, runs))
    finally:
        if database is not None:
            drop(kind, database)
    return {
        "store": kind.split("://")[0],
        "runs": runs,
        **{k: round(v, 3) for k, v in out.items()},
        "cpu_ms_per_step": round(out["cpu_s"] * 1000 / (runs * STEPS), 3),
    }


def side_by_side(kinds: list[str], base_url: str, runs: int, reps: int) -> dict[str, Any]:
    """Each store measured `reps` times in processes of its own, taking turns."""
    found: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    for _ in range(reps):
        for kind in kinds:
            cmd = [sys.executable, __file__, "--one", kind, "--runs", str(runs)]
            line = subprocess.run(
                [*cmd, "--base-url", base_url], check=True, capture_output=True, text=True
            ).stdout.strip()
            found[kind].append(json.loads(line.splitlines()[-1]))
    rows = {}
    for kind, ms in found.items():
        per_step = [m["cpu_ms_per_step"] for m in ms]
        rows[kind.split("://")[0]] = {
            "cpu_ms_per_step": statistics.median(per_step),
            "runs_per_s": round(statistics.median(m["runs_per_s"] for m in ms), 1),
            "all_cpu_ms_per_step": per_step,
        }
    if "memory" in found:
        for kind in kinds:
            costs = [
                s["cpu_ms_per_step"] - m["cpu_ms_per_step"]
                for s, m in zip(found[kind], found["memory"], strict=True)
            ]
            rows[kind.split("://")[0]]["durability_ms_per_step"] = round(
                statistics.median(costs), 3
            )
    return {"runs": runs, "reps": reps, "steps_per_run": STEPS, "stores": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument(
        "--stores",
        default="memory,sqlite,postgresql://postgres@127.0.0.1:5432/postgres",
        help="memory, sqlite and postgresql:// server URLs, comma-separated",
    )
    ap.add_argument("--one", help="measure one store in this process (JSON)")
    ap.add_argument("--base-url", help="the mock's URL (with --one)")
    ap.add_argument("--mock", default=str(BENCH / "rig" / "mock_llm.py"))
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a.base_url, a.runs)))
        return
    port = free_port()
    mock = start_mock(Path(a.mock), port, latency_ms=0, tool_ms=0)
    try:
        out = side_by_side(a.stores.split(","), f"http://127.0.0.1:{port}/v1", a.runs, a.reps)
    finally:
        mock.terminate()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
