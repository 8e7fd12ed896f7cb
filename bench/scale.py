"""Scale: N concurrent supervised runs in one process against the shared scripted mock.

    .venv-bench/bin/python bench/scale.py --n 10000          (bench/run-scale does the set-up)

Scenario (the rig's scenario c): 3 turns of 3 parallel tool calls, 50 ms model latency, 50 ms
tools, so one run ideally takes 3 x (50 + 50) + 50 = 350 ms. Reports completed runs, wall time
against that ideal, CPU ms per model turn, peak RSS, RSS per idle run, and the latency from
`cancel()` to a run's end for runs cancelled at random moments under the load.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import resource
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tether import Agent, HTTPSettings, OpenAIChatModel, ScriptedModel, reply, tool
from tether.run import RestartPolicy, Run
from tether.supervisor import Supervisor

IDEAL_S = 0.35


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def rss_mb() -> float:
    """Current resident set size, from /proc."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def mock_requests(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as r:
        stats = json.loads(r.read())
    return int(stats.get("requests", stats.get("chat", 0)))


def start_mock(
    mock: Path, port: int, latency_ms: int = 50, tool_ms: int = 50
) -> subprocess.Popen[bytes]:
    """The rig's mock: 3 turns of 3 parallel tool calls, then the answer."""
    cmd = [
        sys.executable,
        str(mock),
        "--port",
        str(port),
        "--steps",
        "3",
        "--tools",
        "3",
        "--latency-ms",
        str(latency_ms),
        "--tool-ms",
        str(tool_ms),
        "--deltas",
        "8",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the mock did not start")


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


async def measure(
    port: int, n: int, probes: int, idle: int, max_runs: int | None, max_calls: int | None
) -> dict[str, object]:
    @tool
    async def sleep_tool(ms: int) -> str:
        """Sleep for ms milliseconds."""
        await asyncio.sleep(ms / 1000)
        return f"slept {ms} ms"

    model = OpenAIChatModel(
        "mock",
        api_key="k",
        base_url=f"http://127.0.0.1:{port}/v1",
        settings=HTTPSettings(read_timeout=600, connect_timeout=60),
    )
    agent = Agent(model, [sleep_tool], system="You are a benchmark agent.")
    sup = Supervisor(max_runs=max_runs, max_model_calls=max_calls, gc_tuning=True)
    for run in [sup.start(agent, "warm up") for _ in range(20)]:
        await run.wait()

    # idle runs: alive, with a conversation, waiting for their next message
    gc.collect()
    before = rss_mb()
    idle_agent = Agent(ScriptedModel([reply("Ready when you are.")] * idle), [sleep_tool])
    parked = [
        sup.start(idle_agent, "Wait for me.", restart=RestartPolicy("permanent"))
        for _ in range(idle)
    ]
    while any(r.status != "idle" for r in parked):
        await asyncio.sleep(0.05)
    gc.collect()
    per_idle_kb = (rss_mb() - before) * 1024 / max(1, idle)
    for r in parked:
        r.cancel()
    await asyncio.gather(*(r.wait() for r in parked))
    sup.runs.clear()
    sup.bus.logs.clear()
    del parked
    gc.collect()

    gc.collect()
    requests0, cpu0, t0 = mock_requests(port), cpu_s(), time.perf_counter()
    runs: list[Run] = []
    probe_runs: list[Run] = []
    every = max(1, n // max(1, probes))
    for i in range(n):  # the probes are interleaved with the load, not queued behind it
        runs.append(sup.start(agent, "Run the tools, then answer."))
        if probes and i % every == 0 and len(probe_runs) < probes:
            probe_runs.append(sup.start(agent, "I will be cancelled."))
    latencies: list[float] = []

    async def cancel_later(run: Run) -> None:
        while run.status == "queued":  # cancel it in flight: in a stream or a tool
            await asyncio.sleep(0.005)
        await asyncio.sleep(random.uniform(0.0, 0.3))
        cancelled_at = time.time()
        if run.cancel():
            await run.wait()
            # when the run itself had ended: its last event, stamped as it was emitted
            latencies.append((run.log.events[-1].ts - cancelled_at) * 1000)

    await asyncio.gather(*(cancel_later(r) for r in probe_runs))
    results = [await r.wait() for r in runs]
    wall = time.perf_counter() - t0
    cpu = cpu_s() - cpu0
    turns = mock_requests(port) - requests0
    completed = sum(
        1 for r in results if r and r.outcome == "done" and r.answer.startswith("Final answer")
    )
    peak = peak_rss_mb()
    failures: dict[str, int] = {}
    for r in results:
        if r is None or r.outcome != "done":
            key = r.reason[:80] if r else "never ran"
            failures[key] = failures.get(key, 0) + 1

    await model.aclose()
    return {
        "runs": n,
        "completed_ok": completed,
        "failures": failures,
        "wall_s": round(wall, 2),
        "ideal_s": IDEAL_S,
        "wall_over_ideal": round(wall / IDEAL_S, 1),
        "model_turns": turns,
        "cpu_s": round(cpu, 2),
        "cpu_ms_per_model_turn": round(cpu * 1000 / max(1, turns), 3),
        "peak_rss_mb": round(peak, 1),
        "idle_runs": idle,
        "rss_per_idle_run_kb": round(per_idle_kb, 1),
        "cancel_probes": len(latencies),
        "cancel_p50_ms": round(statistics.median(latencies), 2) if latencies else None,
        "cancel_p99_ms": round(percentile(latencies, 0.99), 2) if latencies else None,
        "cancel_max_ms": round(max(latencies), 2) if latencies else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--probes", type=int, default=200, help="extra runs cancelled under load")
    ap.add_argument("--idle", type=int, default=10_000, help="idle runs for RSS per run")
    ap.add_argument("--max-runs", type=int, help="Supervisor(max_runs=...): admission control")
    ap.add_argument(
        "--max-model-calls",
        type=int,
        default=256,
        help="Supervisor(max_model_calls=...) (default: the Supervisor's, 256)",
    )
    ap.add_argument("--uvloop", action="store_true", help="run on uvloop")
    ap.add_argument("--mock", default=str(Path(__file__).resolve().parent / "rig" / "mock_llm.py"))
    args = ap.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    port = free_port()
    mock = start_mock(Path(args.mock), port)
    try:
        coro = measure(port, args.n, args.probes, args.idle, args.max_runs, args.max_model_calls)
        if args.uvloop:
            import uvloop

            result = uvloop.run(coro)
        else:
            result = asyncio.run(coro)
        result.update(
            max_runs=args.max_runs, max_model_calls=args.max_model_calls, uvloop=args.uvloop
        )
    finally:
        mock.terminate()
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
