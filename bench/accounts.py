"""What an account's budget adds to a model call: the same runs with and without an account
that has limits, side by side, on a store.

    .venv/bin/python bench/accounts.py [--store postgresql://...|sqlite] [--runs 100]
                                       [--calls 5] [--reps 3]

Each repetition runs both variants, each in a process of its own (a fresh database each), in
turn: `--runs` durable runs at once of a scripted model (no HTTP: the model costs nothing, so
what is left is the runtime's work), `--calls` model calls each. With an account, each call
reserves its estimate and settles what it used (two transactions on the ledger). Reported:
the process's CPU (every thread's) per model call, medians of the repetitions, and the
difference: what the reservation costs a call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def one(store: str, runs: int, calls: int, account: bool) -> dict[str, Any]:
    """One variant in this process: the CPU seconds of its runs (not of opening the store)."""
    from tether import Agent, Limits, Price, RunContext, Runtime, ScriptedModel, reply, tool
    from tether.messages import Usage

    @tool
    def look(what: str) -> str:
        """Look something up."""
        return what

    turns = [reply(tool_calls=[("look", {"what": "x"})], usage=Usage(50, 0, 10))] * (calls - 1)
    model = ScriptedModel([*turns, reply("done", usage=Usage(50, 0, 10))])
    agent = Agent(
        model, [look], name="b", prices={"scripted": Price(1, 1, 1)}, max_output_tokens=60
    )

    async def go() -> dict[str, Any]:
        async with Runtime(store, [agent], max_runs=runs) as rt:
            if account:
                await rt.set_limits("acme", Limits(cost_total=1e9, tokens_per_day=10**12))
            context = (lambda: RunContext(account_id="acme")) if account else RunContext
            cpu, wall = time.process_time(), time.perf_counter()
            handles = [await rt.start("b", "go", context=context()) for _ in range(runs)]
            results = [await h.wait() for h in handles]
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        done = sum(r is not None and r.outcome == "done" for r in results)
        return {"cpu_s": cpu, "wall_s": wall, "done": done, "calls": runs * calls}

    return asyncio.run(go())


def fresh_store(kind: str) -> tuple[str, Any]:
    """A new store of this kind and how to drop it."""
    if kind == "sqlite":
        folder = tempfile.mkdtemp(prefix="bench-accounts-")
        return f"sqlite:///{folder}/runs.db", lambda: None
    import psycopg

    name = f"bench_accounts_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(f"{kind}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(f"{kind}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')

    return f"{kind}/{name}", drop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", default="postgresql://postgres@127.0.0.1:5432")
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--one", choices=("plain", "account"), help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:  # a child: one variant
        print(json.dumps(one(args.url, args.runs, args.calls, args.one == "account")))
        return
    taken: dict[str, list[float]] = {"plain": [], "account": []}
    for _ in range(args.reps):
        for variant in taken:
            url, drop = fresh_store(args.store)
            try:
                out = subprocess.run(
                    [
                        *(sys.executable, __file__, "--one", variant, "--url", url),
                        *("--runs", str(args.runs), "--calls", str(args.calls)),
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                )
            finally:
                drop()
            got = json.loads(out.stdout.splitlines()[-1])
            assert got["done"] == args.runs, got
            taken[variant].append(got["cpu_s"] * 1000 / got["calls"])
    plain, account = (statistics.median(taken[v]) for v in ("plain", "account"))
    kind = "SQLite" if args.store == "sqlite" else "Postgres"
    print(
        f"{kind}, {args.runs} runs at once x {args.calls} calls, medians of {args.reps}: "
        f"CPU ms per model call: no account {plain:.2f}, an account with limits {account:.2f}, "
        f"the reservation {account - plain:+.2f} ms"
    )


if __name__ == "__main__":
    main()
