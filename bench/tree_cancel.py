"""Cancel a tree of 100 runs: time from the root's cancel to the last child's end.

    .venv/bin/python bench/tree_cancel.py [--trees 20] [--fan 9] [--leaves 10] [--no-bash]

Each tree is a lead that hands 9 tasks to 9 managers at once, each of which hands 10 to
workers (1 + 9 + 90 = 100 runs, all in one `Runtime`). Half the workers sit in a model stream
(the wire mock sends an event every 50 ms), half in a bash call (`sleep 60`). Once every
worker is busy, the root is cancelled; the figures are the time from the cancel to

- the root's `cancel` returning its result (every run of the tree ended),
- the server seeing the last worker's stream closed,
- the last worker's subprocess gone.

Prints p50/p99/max in milliseconds over the trees.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from tether import Agent, HTTPSettings, OpenAIChatModel, Runtime
from tether.approvals import approve_all
from tether.tools.bash import bash_tool
from wire_server import WireServer, tool_results

SETTINGS = HTTPSettings(max_retries=1, read_timeout=120)


def rule(fan: int, leaves: int, bash: bool) -> Any:
    """The lead and managers fan out; even workers stream slowly, odd ones run `sleep 60`
    (with `bash`; else they stream too)."""

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        system = str(body["messages"][0]["content"])
        task = str(body["messages"][1]["content"])
        if tool_results(body):
            return {"text": "done"}
        if system == "LEAD":
            return {"calls": [("manager", {"task": f"part {i}"}) for i in range(fan)]}
        if system == "MANAGER":
            return {"calls": [("worker", {"task": f"{task}.{i}"}) for i in range(leaves)]}
        if bash and int(task.rsplit(".", 1)[-1]) % 2:
            return {"calls": [("bash", {"command": f"sleep 60; echo {os.getpid()}-tree"})]}
        return {"text": "word " * 400, "deltas": 400, "chunk_delay": 0.05}

    return answer


def sleepers() -> list[int]:
    """The shells of the workers' `sleep 60` (their command line names this bench)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"{os.getpid()}-tree".encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


async def one_tree(
    rt: Runtime, server: WireServer, n: int, fan: int, workers: int, shells: int
) -> tuple[float, ...]:
    streams_before = server.closed_streams
    requests_before = len(server.requests)
    run = await rt.start("lead", "Do it all.", run_id=f"tree{n}", approver=approve_all)
    # every run has made its first request, and the bash workers have started their sleep
    while len(server.requests) - requests_before < 1 + fan + workers or len(sleepers()) < shells:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # the streams are under way
    cancelled = time.monotonic()
    rt.cancel(run.id)
    await run.wait()
    ended = time.monotonic()
    while server.closed_streams - streams_before < workers - shells:
        await asyncio.sleep(0.001)
    streams = max(server.closed_at[-(workers - shells) :])
    while sleepers():
        await asyncio.sleep(0.001)
    gone = time.monotonic()
    return tuple((t - cancelled) * 1000 for t in (ended, streams, gone))


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trees", type=int, default=20)
    ap.add_argument("--fan", type=int, default=9)
    ap.add_argument("--leaves", type=int, default=10)
    ap.add_argument("--no-bash", action="store_true", help="every worker in a model stream")
    args = ap.parse_args()
    server = WireServer().start()
    server.rule = rule(args.fan, args.leaves, not args.no_bash)
    model = OpenAIChatModel("mock", api_key="sk-bench", base_url=server.url, settings=SETTINGS)
    bash = bash_tool()
    bash.approval = "never"
    worker = Agent(model, [bash], system="WORKER", name="worker")
    manager = Agent(model, [worker.as_tool()], system="MANAGER", name="manager")
    lead = Agent(model, [manager.as_tool()], system="LEAD", name="lead")
    workers = args.fan * args.leaves
    shells = 0 if args.no_bash else workers // 2
    figures: list[tuple[float, ...]] = []
    try:
        async with Runtime(agents=[lead]) as rt:
            for n in range(args.trees):
                figures.append(await one_tree(rt, server, n, args.fan, workers, shells))
    finally:
        await model.aclose()
        server.stop()
    print(f"{args.trees} trees of {1 + args.fan + workers} runs, cancelled at the root:")
    for i, what in enumerate(("every run ended", "last stream closed", "last subprocess gone")):
        ms = sorted(f[i] for f in figures)
        p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
        print(
            f"  {what:22s} p50 {statistics.median(ms):6.1f} ms  p99 {p99:6.1f} ms"
            f"  max {ms[-1]:6.1f} ms"
        )


if __name__ == "__main__":
    asyncio.run(main())
