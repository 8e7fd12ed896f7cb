"""What an account's budget, or an endpoint's rate, adds to a model call: the same runs with
and without it, side by side, on a store.

    .venv/bin/python bench/accounts.py [--store postgresql://...|sqlite] [--runs 100]
                                       [--calls 5] [--reps 3] [--what account|rate]

Each repetition runs both variants, each in a process of its own (a fresh database each), in
turn: `--runs` durable runs at once, `--calls` model calls each. For an account the model is
scripted (no HTTP: it costs nothing, so what is left is the runtime's work); with an account,
each call reserves its estimate and settles what it used. For a rate the model is the rig's
mock LLM over HTTP (`bench/rig/mock_llm.py`, in a process of its own), and the rate one
too high to make anything wait: each attempt is admitted and recorded by the store all the
same. Reported: the process's CPU (every thread's) per model call, medians of the
repetitions, and the difference: what the reservation or the admission costs a call.
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


def one(store: str, runs: int, calls: int, variant: str, mock: str | None) -> dict[str, Any]:
    """One variant in this process: the CPU seconds of its runs (not of opening the store)."""
    from tether import Agent, Limits, Price, Rate, RunContext, Runtime, ScriptedModel, reply, tool
    from tether.messages import Usage
    from tether.providers.openai_chat import OpenAIChatModel

    @tool
    def look(what: str) -> str:
        """Look something up."""
        return what

    @tool
    def sleep_tool(ms: int) -> str:
        """What the mock LLM asks for (it sleeps nothing here)."""
        return "ok"

    turns = [reply(tool_calls=[("look", {"what": "x"})], usage=Usage(50, 0, 10))] * (calls - 1)
    model: Any = ScriptedModel([*turns, reply("done", usage=Usage(50, 0, 10))])
    if mock is not None:  # the mock's script: calls - 1 turns of one tool call, then an answer
        model = OpenAIChatModel("m", base_url=mock, api_key="sk-bench", stream=False)
    agent = Agent(
        model,
        [look, sleep_tool],
        name="b",
        prices={"scripted": Price(1, 1, 1)},
        max_output_tokens=60,
    )
    account = variant == "account"

    async def go() -> dict[str, Any]:
        async with Runtime(store, [agent], max_runs=runs) as rt:
            if account:
                await rt.set_limits("acme", Limits(cost_total=1e9, tokens_per_day=10**12))
            if variant == "rate":
                await rt.set_rate(model, Rate(requests=10**9, tokens=10**12))
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
    ap.add_argument("--what", choices=("account", "rate"), default="account")
    ap.add_argument("--one", choices=("plain", "account", "rate"), help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--mock", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:  # a child: one variant
        print(json.dumps(one(args.url, args.runs, args.calls, args.one, args.mock)))
        return
    mock = start_mock(args.calls) if args.what == "rate" else None
    taken: dict[str, list[float]] = {"plain": [], args.what: []}
    try:
        for _ in range(args.reps):
            for variant in taken:
                taken[variant].append(child(args, variant, mock[0] if mock else None))
    finally:
        if mock is not None:
            mock[1].kill()
    plain, limited = (statistics.median(taken[v]) for v in taken)
    kind = "SQLite" if args.store == "sqlite" else "Postgres"
    said = "an account with limits" if args.what == "account" else "a rate on its endpoint"
    print(
        f"{kind}, {args.runs} runs at once x {args.calls} calls, medians of {args.reps}: "
        f"CPU ms per model call: none {plain:.2f}, {said} {limited:.2f}, "
        f"the {'reservation' if args.what == 'account' else 'admission'} "
        f"{limited - plain:+.2f} ms"
    )


def child(args: argparse.Namespace, variant: str, mock: str | None) -> float:
    """One variant's run in a process of its own on a fresh store: CPU ms per model call."""
    url, drop = fresh_store(args.store)
    try:
        out = subprocess.run(
            [
                *(sys.executable, __file__, "--one", variant, "--url", url),
                *("--runs", str(args.runs), "--calls", str(args.calls)),
                *(("--mock", mock) if mock else ()),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        drop()
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["done"] == args.runs, got
    return float(got["cpu_s"] * 1000 / got["calls"])


def start_mock(calls: int) -> tuple[str, subprocess.Popen[bytes]]:
    """The rig's mock LLM on a free port: `calls - 1` turns of one tool call, then an answer."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = HERE / "rig" / "mock_llm.py"
    proc = subprocess.Popen(
        [
            *(sys.executable, str(script), "--port", str(port), "--steps", str(calls - 1)),
            *("--tools", "1", "--tool-ms", "0"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    import urllib.request

    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    return f"http://127.0.0.1:{port}/v1", proc


if __name__ == "__main__":
    main()
