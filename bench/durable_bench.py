"""Durable throughput: runs per second and the cost of each recorded step, on SQLite and on
Postgres, against the same runs in memory, with the shared rig's mock model (no latency).

    .venv/bin/python bench/durable_bench.py [--runs 50] [--postgres postgresql://...]

Each run: 3 turns of 3 parallel tool calls (tools that return at once), then the answer, so
4 model steps and 9 tool steps, each a recorded DBOS step in the durable case.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from scale import free_port, start_mock  # the same directory

BENCH = Path(__file__).resolve().parent


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
    """`runs` concurrent runs on a Runtime (in memory for `store=None`): the same code."""
    from tether import Runtime
    from tether.approvals import approve_all

    agent = bench_agent(base_url)
    tag = time.strftime("%H%M%S")
    async with Runtime(store, [agent], take_over=False) as rt:
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--store", help="sqlite:///... or postgresql://... (default: a new SQLite)")
    ap.add_argument("--memory", action="store_true", help="measure the in-memory runs instead")
    ap.add_argument("--mock", default=str(BENCH.parents[1] / "shared/bench/mock_llm.py"))
    a = ap.parse_args()
    port = free_port()
    mock = start_mock(Path(a.mock), port, latency_ms=0, tool_ms=0)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        if a.memory:
            out = asyncio.run(measure(None, base_url, a.runs))
            where = "memory"
        else:
            store = a.store or f"sqlite:///{tempfile.mkdtemp()}/bench.sqlite"
            out = asyncio.run(measure(store, base_url, a.runs))
            where = store.split("://")[0]
    finally:
        mock.terminate()
    steps = a.runs * 13  # 4 model steps + 9 tool steps a run
    print(
        json.dumps(
            {
                "store": where,
                "runs": a.runs,
                **{k: round(v, 3) for k, v in out.items()},
                "ms_per_step_wall": round(out["wall_s"] * 1000 / steps, 3),
                "cpu_ms_per_step": round(out["cpu_s"] * 1000 / steps, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
