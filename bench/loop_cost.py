#!/usr/bin/env python3
"""What Tether's own layers cost a turn, without HTTP: the rig's shape (1,000 runs at once, 3
turns of 3 tool calls, then an answer) against a model that answers after 1 ms, so nothing but
the loop and its supervision is measured. CPU per model turn, default GC, one process a mode:

    bench/.venv-bench/bin/python bench/loop_cost.py              # every mode, twice, in turn
    bench/.venv-bench/bin/python bench/loop_cost.py --modes runtime,runtime-keep0

Modes: `bare` (the rig's baseline loop over dicts, the same sleeps), `agent` (`Agent.run`, no
events), `agent-log` (`Agent.run` writing an event log), `runtime` (a `Runtime` in memory, as
the rig's Tether driver runs), `runtime-unbounded` (no bound on model calls, so no `queued`
and `admitted`), `runtime-keep0` (ended runs forgotten at once). The differences between
neighbouring modes price each layer: events, the model-call queue, ended runs kept, the run's
task, registry and mailbox. Written for #61, where the rig's figure alone could not say which.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import subprocess
import sys
import time
from typing import Any

from tether import Agent, Runtime, tool
from tether.bus import EventLog
from tether.events import Emitter
from tether.messages import Message, ModelRequest, ModelResponse, TextPart, ToolCall, Usage

MODES = ["bare", "agent", "agent-log", "runtime", "runtime-unbounded", "runtime-keep0"]
TURNS, TOOLS = 3, 3
ids = itertools.count()


class OneMillisecond:
    """A model that asks for TOOLS calls TURNS times, then answers; each reply after 1 ms."""

    name = "ms"
    provider = "ms"

    async def respond(
        self, request: ModelRequest, on_text: Any = None, on_retry: Any = None
    ) -> ModelResponse:
        await asyncio.sleep(0.001)
        if sum(1 for m in request.messages if m.role == "assistant") >= TURNS:
            answer = Message("assistant", (TextPart("done"),))
            return ModelResponse(answer, "end_turn", Usage(10, 2))
        calls = tuple(
            ToolCall(f"c{next(ids)}", "sleep_tool", {"ms": 1}, '{"ms": 1}') for _ in range(TOOLS)
        )
        return ModelResponse(Message("assistant", calls), "tool_use", Usage(10, 2))

    async def aclose(self) -> None:
        return None


@tool
async def sleep_tool(ms: int) -> str:
    """Sleep for ms milliseconds."""
    await asyncio.sleep(ms / 1000)
    return "slept"


async def bare_run() -> str:
    """The rig's baseline loop, its model and tools replaced by the same sleeps."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for _ in range(TURNS):
        await asyncio.sleep(0.001)
        calls = [(f"c{next(ids)}", "sleep_tool", '{"ms": 1}') for _ in range(TOOLS)]
        results = await asyncio.gather(
            *(asyncio.sleep(json.loads(a)["ms"] / 1000, "slept") for _, _, a in calls)
        )
        messages.append({"role": "assistant", "tool_calls": [list(c) for c in calls]})
        for (call_id, _, _), result in zip(calls, results, strict=True):
            messages.append({"role": "tool", "id": call_id, "content": result})
    await asyncio.sleep(0.001)
    return "done"


async def measure(mode: str, n: int, repeat: int) -> float:
    """CPU µs per model turn of `repeat` batches of `n` concurrent runs (after a warm-up)."""
    agent = Agent(OneMillisecond(), [sleep_tool], system="s", name="bench")
    runtime = None
    if mode.startswith("runtime"):
        runtime = Runtime(
            agents=[agent],
            max_model_calls=None if mode == "runtime-unbounded" else 256,
            keep_finished=0 if mode == "runtime-keep0" else 10_000,
        )
        await runtime.open()

    async def one() -> str:
        if mode == "bare":
            return await bare_run()
        if mode == "agent":
            return (await agent.run("go")).answer
        if mode == "agent-log":
            emitter = Emitter("r", log=EventLog("r"))
            return (await agent.run("go", emitter=emitter)).answer
        if runtime is None:
            raise SystemExit(f"loop_cost: no mode {mode!r}")
        run = await runtime.start("bench", "go")
        return (await run.wait()).answer

    await asyncio.gather(*(one() for _ in range(50)))
    start = time.process_time()
    for _ in range(repeat):
        answers = await asyncio.gather(*(one() for _ in range(n)))
        if any(a != "done" for a in answers):
            raise SystemExit(f"loop_cost: {mode} gave {answers[0]!r}")
    spent = time.process_time() - start
    if runtime is not None:
        await runtime.close()
    return spent * 1e6 / (n * repeat * (TURNS + 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="times each mode runs, in turn")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a child process: measure this mode
    a = ap.parse_args()
    if a.one:
        print(json.dumps(asyncio.run(measure(a.one, a.n, a.repeat))))
        return
    got: dict[str, list[float]] = {m: [] for m in a.modes.split(",")}
    for _ in range(a.rounds):
        for mode in got:
            cmd = [sys.executable, __file__, "--one", mode, "--n", str(a.n)]
            out = subprocess.run([*cmd, "--repeat", str(a.repeat)], capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"loop_cost: {mode} failed: {out.stderr[-500:]}")
            got[mode].append(float(out.stdout))
    for mode, figures in got.items():
        print(f"{mode:18s} " + " ".join(f"{f:6.1f}" for f in figures) + " µs a turn")


if __name__ == "__main__":
    main()
