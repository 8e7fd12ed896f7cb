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

from scale import free_port, start_mock  # the same directory

BENCH = Path(__file__).resolve().parent


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def args_for(base_url: str, tools: str) -> argparse.Namespace:
    from tether.cli import build_parser

    return build_parser().parse_args(
        [
            "run",
            "Run the tools, then answer.",
            "--base-url",
            base_url,
            "--tools",
            "none",
            "--tools-from",
            tools,
            "--approve",
            "auto",
            "--no-stream",
        ]
    )


async def in_memory(base_url: str, tools: str, runs: int) -> dict[str, float]:
    from tether.cli import build_agent

    agent = build_agent(args_for(base_url, tools))
    c0, t0 = cpu(), time.perf_counter()
    results = await asyncio.gather(*(agent.run("Run the tools, then answer.") for _ in range(runs)))
    wall, used = time.perf_counter() - t0, cpu() - c0
    await agent.model.aclose()
    assert all(r.outcome == "done" for r in results)
    return {"runs_per_s": runs / wall, "wall_s": wall, "cpu_s": used}


async def durable(url: str, base_url: str, tools: str, runs: int) -> dict[str, float]:
    from dbos import DBOS, SetWorkflowID

    from tether import durable as d

    wf = d.prepare(url)
    spec = d.spec_of(args_for(base_url, tools))
    tag = time.strftime("%H%M%S")
    c0, t0 = cpu(), time.perf_counter()
    handles = []
    for i in range(runs):
        with SetWorkflowID(f"bench-{tag}-{i}"):
            handles.append(
                await DBOS.start_workflow_async(
                    wf, f"bench-{tag}-{i}", spec, "Run the tools, then answer."
                )
            )
    results = [await h.get_result() for h in handles]
    wall, used = time.perf_counter() - t0, cpu() - c0
    assert all(r["outcome"] == "done" for r in results)
    return {"runs_per_s": runs / wall, "wall_s": wall, "cpu_s": used}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--store", help="sqlite:///... or postgresql://... (default: a new SQLite)")
    ap.add_argument("--memory", action="store_true", help="measure the in-memory runs instead")
    ap.add_argument("--mock", default=str(BENCH.parents[1] / "shared/bench/mock_llm.py"))
    a = ap.parse_args()
    port = free_port()
    mock = start_mock(Path(a.mock), port, latency_ms=0, tool_ms=0)
    tools = Path(tempfile.mkdtemp()) / "bench_tools.py"
    tools.write_text(
        "from tether import tool\n\n\n@tool(idempotent=True)\n"
        "async def sleep_tool(ms: int) -> str:\n"
        '    """Return at once."""\n    return "slept"\n'
    )
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        if a.memory:
            out = asyncio.run(in_memory(base_url, str(tools), a.runs))
            where = "memory"
        else:
            store = a.store or f"sqlite:///{tempfile.mkdtemp()}/bench.sqlite"
            out = asyncio.run(durable(store, base_url, str(tools), a.runs))
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
