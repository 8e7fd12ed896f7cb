"""Cancel a tree of 100 runs: time from the root's cancel to the last child's end.

    .venv/bin/python bench/tree_cancel.py [--trees 20] [--fan 9] [--leaves 10] [--no-bash]

Each tree is a lead that hands 9 tasks to 9 managers at once, each of which hands 10 to
workers (1 + 9 + 90 = 100 runs, all in one `Runtime`). Half the workers sit in a model stream
(the wire mock sends an event every 50 ms), half in a bash call (`sleep 60`). Once every
worker is busy, the root is cancelled; the figures are the time from the cancel to

- the root's `cancel` returning its result (every run of the tree ended),
- the server seeing the last worker's stream closed,
- the last worker's subprocess gone.

Prints p50/p99/max in milliseconds over the trees. The wire mock runs in a process of its own
(`--mock-here` puts it in this one, as before): a model server is never in the user's process,
and in it the mock's 45 streams took their share of the GIL from the cancel being measured.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import multiprocessing.sharedctypes
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from tether import Agent, HTTPSettings, OpenAIChatModel, Runtime
from tether.approvals import approve_all
from tether.tools.bash import bash_tool
from wire_server import WireServer, tool_results

SETTINGS = HTTPSettings(max_retries=1, read_timeout=120)


MARK = f"{os.getpid()}-tree"
"""Names this bench's `sleep 60` shells (the rule may run in the mock's own process)."""


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
            return {"calls": [("bash", {"command": f"sleep 60; echo {MARK}"})]}
        return {"text": "word " * 400, "deltas": 400, "chunk_delay": 0.05}

    return answer


def sleepers() -> list[int]:
    """The shells of the workers' `sleep 60` (their command line names this bench)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if MARK.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


class Counted(list[Any]):
    """A list whose length (and, for times, whose items) are mirrored in shared memory, so the
    bench reads what the mock in another process saw."""

    def __init__(self, count: Any, times: Any = None) -> None:
        super().__init__()
        self.count, self.times = count, times

    def append(self, item: Any) -> None:
        super().append(item)
        if self.times is not None:
            self.times[(self.count.value) % len(self.times)] = item
        self.count.value += 1


class Mock:
    """The wire mock, here or in a process of its own; what it saw is read the same way."""

    def __init__(self, answer: Any, apart: bool) -> None:
        ctx = multiprocessing.get_context("fork")
        self.requests = ctx.Value("q", 0, lock=False)
        self.closed = ctx.Value("q", 0, lock=False)
        self.closed_times = ctx.Array("d", 4096, lock=False)
        self.answer, self.process, self.here = answer, None, None
        if apart:
            port = ctx.Value("i", 0, lock=False)
            self.process = ctx.Process(target=self.serve, args=(port,), daemon=True)
            self.process.start()
            while not port.value:
                time.sleep(0.01)
            self.url = f"http://127.0.0.1:{port.value}/v1"
        else:
            self.here = self.server()
            self.url = self.here.url

    def server(self) -> WireServer:
        server = WireServer()
        server.rule = self.answer
        server.requests = Counted(self.requests)
        server.closed_at = Counted(self.closed, self.closed_times)
        return server.start()

    def serve(self, port: Any) -> None:
        server = self.server()
        port.value = server.port
        threading.Event().wait()  # until killed

    def closed_at(self, last: int) -> float:
        n = self.closed.value
        return max(self.closed_times[i % len(self.closed_times)] for i in range(n - last, n))

    def stop(self) -> None:
        if self.here is not None:
            self.here.stop()
        if self.process is not None:
            self.process.kill()
            self.process.join()


async def one_tree(
    rt: Runtime, server: Mock, n: int, fan: int, workers: int, shells: int
) -> tuple[float, ...]:
    streams_before = server.closed.value
    requests_before = server.requests.value
    run = await rt.start("lead", "Do it all.", run_id=f"tree{n}", approver=approve_all)
    # every run has made its first request, and the bash workers have started their sleep
    while server.requests.value - requests_before < 1 + fan + workers or len(sleepers()) < shells:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # the streams are under way
    cancelled = time.monotonic()
    rt.cancel(run.id)
    await run.wait()
    ended = time.monotonic()
    while server.closed.value - streams_before < workers - shells:
        await asyncio.sleep(0.001)
    streams = server.closed_at(workers - shells)
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
    ap.add_argument("--mock-here", action="store_true", help="the mock in this process")
    args = ap.parse_args()
    server = Mock(rule(args.fan, args.leaves, not args.no_bash), apart=not args.mock_here)
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
