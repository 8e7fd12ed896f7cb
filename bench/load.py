"""Durable runs under load: N concurrent runs on a store, repeated, from one process or queued
for worker processes, with what the store's connections did meanwhile.

    .venv/bin/python bench/load.py --store postgresql://.../db --runs 1000 --reps 5
    .venv/bin/python bench/load.py --store postgresql://.../db --runs 1000 --workers 2
    .venv/bin/python bench/load.py --memory --runs 1000            (the same runs in memory)

Scenario (the shared rig's scenario c): 3 turns of 3 parallel tool calls, 50 ms model latency,
50 ms tools. Each repetition uses a fresh database (Postgres: `--store` names the server and a
database prefix) or SQLite file. Prints one JSON line per repetition: completed, failed,
wall time, CPU per step (this process; workers report their own), and the most connections the
store had open at once (Postgres, sampled every 0.2 s from pg_stat_activity).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
PATH = os.pathsep.join([str(BENCH.parent / "src"), str(BENCH)])  # this tree's Tether, bench/
sys.path[:0] = PATH.split(os.pathsep)

from durable_bench import cpu
from scale import free_port, start_mock

from tether import RunContext  # a tool's annotation names it

STEPS_PER_RUN = 4 + 9  # 4 model calls, 9 tool calls
TASK = "Run the tools, then answer."


def load_agent(base_url: str) -> Any:
    from tether import Agent, OpenAIChatModel, tool

    effects = os.environ.get("LOAD_EFFECTS")  # a file each finished call appends its key to

    @tool(idempotent=not effects)  # counted, it stands for a payment: never made twice
    async def sleep_tool(ms: int, ctx: RunContext) -> str:
        """Sleep for ms milliseconds."""
        await asyncio.sleep(ms / 1000)
        if effects:
            fd = os.open(effects, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.write(fd, f"{ctx.idempotency_key}\n".encode())  # one write: no interleaving
            os.close(fd)
        return "slept"

    model = OpenAIChatModel("gpt-4.1-mini", api_key="sk-bench", base_url=base_url, stream=False)
    return Agent(model, [sleep_tool], name="load")


class Connections:
    """The most connections a Postgres database had open at once, sampled in a thread."""

    def __init__(self, url: str | None) -> None:
        self.url, self.peak, self.stop = url, 0, threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)

    def __enter__(self) -> Connections:
        if self.url and self.url.startswith("postgres"):
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()

    def sample(self) -> None:
        import psycopg

        assert self.url is not None
        db = self.url.rsplit("/", 1)[1]
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.wait(0.2):
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (db,)
                ).fetchone()
                self.peak = max(self.peak, int(row[0]) - 1 if row else 0)  # not this one


def fresh_store(spec: str | None, tmp: Path) -> str | None:
    """A new database (or SQLite file) for one repetition."""
    if spec is None:
        return f"sqlite:///{tmp}/load-{uuid.uuid4().hex[:8]}.sqlite"
    if not spec.startswith("postgres"):
        return spec
    import psycopg

    server, _ = spec.rsplit("/", 1)
    name = f"tether_load_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    return f"{server}/{name}"


def drop_store(store: str | None) -> None:
    """Drop a repetition's Postgres database (SQLite files go with the temporary directory)."""
    if store is None or not store.startswith("postgres"):
        return
    import psycopg

    server, name = store.rsplit("/", 1)
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def in_process(store: str | None, base_url: str, runs: int, limit: float) -> dict[str, Any]:
    """`runs` runs started at once on one Runtime (in memory for `store=None`)."""
    from tether import Runtime
    from tether.approvals import approve_all

    agent = load_agent(base_url)
    async with Runtime(store, [agent], take_over=False) as rt:
        c0, t0 = cpu(), time.perf_counter()
        started = [await rt.start("load", TASK, approver=approve_all) for _ in range(runs)]
        waits = [asyncio.ensure_future(run.wait()) for run in started]
        done, pending = await asyncio.wait(waits, timeout=limit)
        wall, used = time.perf_counter() - t0, cpu() - c0
        outcomes = [w.result().outcome if w.exception() is None else "error" for w in done]
        for w in pending:
            w.cancel()
    await agent.model.aclose()
    return {
        "completed": outcomes.count("done"),
        "failed": len(outcomes) - outcomes.count("done"),
        "stuck": len(pending),
        "wall_s": round(wall, 2),
        "cpu_ms_per_step": round(used * 1000 / (runs * STEPS_PER_RUN), 3),
    }


def by_workers(
    store: str,
    base_url: str,
    runs: int,
    workers: int,
    timeout: float,
    kill_at: int = 0,
    concurrency: int = 10_000,
) -> dict[str, Any]:
    """`runs` runs queued at once, executed by `workers` worker processes; with `kill_at`,
    the first worker is killed with SIGKILL once that many runs have ended. The tool stands
    for a payment here (not idempotent), and each call writes its idempotency key to a file
    once made: the crash suite's rules are that every run ends done (nothing lost) and no call
    is made twice; a call the kill left started but unrecorded reaches the model as "outcome
    unknown" instead of running again (counted: calls of the runs whose key is not there)."""
    from tether import Runtime
    from tether.durable.view import ENDED, WORKFLOW, client

    agent = load_agent(base_url)
    effects = Path(tempfile.mkdtemp()) / "effects"
    env = {**os.environ, "PYTHONPATH": PATH, "LOAD_EFFECTS": str(effects)}
    argv = [sys.executable, __file__, "--be-worker", store, "--base-url", base_url]
    argv += ["--concurrency", str(concurrency)]
    procs = [subprocess.Popen(argv, env=env) for _ in range(workers)]
    try:
        t0 = time.perf_counter()
        Runtime(store, [agent]).enqueue_many(agent, [TASK] * runs)
        reader = client(store)
        ended: list[Any] = []
        killed = False
        while time.perf_counter() - t0 < timeout:
            ended = reader.list_workflows(
                name=WORKFLOW, status=list(ENDED), load_input=False, load_output=True
            )
            if len(ended) >= runs:
                break
            if kill_at and not killed and len(ended) >= kill_at:
                busiest(reader, procs).kill()  # the one that holds the most runs
                killed = True
            time.sleep(0.5)
        wall = time.perf_counter() - t0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
    done = sum(w.status == "SUCCESS" and (w.output or {}).get("outcome") == "done" for w in ended)
    keys = effects.read_text().split() if effects.exists() else []
    return {
        "completed": done,
        "failed": len(ended) - done,
        "stuck": runs - len(ended),
        "wall_s": round(wall, 2),
        "tool_calls_made_twice": len(keys) - len(set(keys)),
        "tool_calls_outcome_unknown": runs * 9 - len(set(keys)),
    }


def busiest(reader: Any, procs: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """The worker process executing the most runs now (a worker's executor id ends in its
    pid): one worker may have dequeued every run, and killing the other would test nothing."""
    running = reader.list_workflows(status="PENDING", load_input=False, load_output=False)
    held = {p: sum(str(w.executor_id).endswith(f"-{p.pid}") for w in running) for p in procs}
    return max(procs, key=lambda p: held[p])


def one_process(store: str, base_url: str, runs: int, timeout: float) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--be-process", store, "--base-url", base_url]
    argv += ["--runs", str(runs), "--timeout", str(timeout)]
    env = {**os.environ, "PYTHONPATH": PATH}
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"error": done.stderr.strip().splitlines()[-1:]}
    out: dict[str, Any] = json.loads(lines[-1])
    out["warnings"] = done.stderr.count("WARNING")
    return out


async def be_worker(store: str, base_url: str, concurrency: int) -> None:
    from tether import Runtime

    async with Runtime(store, [load_agent(base_url)]) as rt:
        await rt.work(concurrency=concurrency)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--store", help="postgresql://server/prefix, or sqlite (default: SQLite)")
    ap.add_argument("--memory", action="store_true")
    ap.add_argument("--workers", type=int, default=0, help="queue the runs for N workers")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument(
        "--kill-at", type=int, default=0, metavar="K", help="SIGKILL a worker after K runs end"
    )
    ap.add_argument(
        "--concurrency",
        type=int,
        default=10_000,
        help="runs a worker takes at once (with --workers; the rest wait on the queue)",
    )
    ap.add_argument("--mock", default=str(BENCH / "rig" / "mock_llm.py"))
    ap.add_argument("--be-worker", metavar="STORE", help=argparse.SUPPRESS)
    ap.add_argument("--be-process", metavar="STORE", help=argparse.SUPPRESS)
    ap.add_argument("--base-url", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.be_worker:
        asyncio.run(be_worker(a.be_worker, a.base_url, a.concurrency))
        return
    if a.be_process:
        print(json.dumps(asyncio.run(in_process(a.be_process, a.base_url, a.runs, a.timeout))))
        return
    port = free_port()
    mock = start_mock(Path(a.mock), port, latency_ms=50, tool_ms=50)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for rep in range(1, a.reps + 1):
                store = None if a.memory else fresh_store(a.store, Path(tmp))
                with Connections(store) as conns:
                    if a.workers and store:
                        out = by_workers(
                            store, base_url, a.runs, a.workers, a.timeout, a.kill_at, a.concurrency
                        )
                    elif store is None:
                        out = asyncio.run(in_process(store, base_url, a.runs, a.timeout))
                    else:  # DBOS launches once per process: a process per repetition
                        out = one_process(store, base_url, a.runs, a.timeout)
                where = "memory" if store is None else store.split(":", 1)[0]
                line = {"rep": rep, "store": where, "runs": a.runs, "workers": a.workers, **out}
                if conns.peak:
                    line["peak_connections"] = conns.peak
                print(json.dumps(line), flush=True)
                drop_store(store)
    finally:
        mock.terminate()


if __name__ == "__main__":
    main()
