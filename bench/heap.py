#!/usr/bin/env python3
"""What a run holds for the host's garbage collector, counted rather than timed: the tracked
objects (`gc.get_objects()`) a run holds while it runs and after it has ended, by type.

    bench/.venv-bench/bin/python bench/heap.py                 # a Runtime in memory, defaults
    bench/.venv-bench/bin/python bench/heap.py --n 1000 --top 12
    bench/.venv-bench/bin/python bench/heap.py --store sqlite     # durable, on a new SQLite file

The run is `loop_cost.py`'s (3 turns of 3 tool calls against a model that answers after 1 ms,
no HTTP). "While it runs" counts the objects of 1,000 runs caught 3.5 ms in; "ended" counts what
1,000 ended runs the runtime keeps hold. A full collection walks every one of them, so with
many runs in flight or kept, the counts price the collector's work per run, and unlike the CPU
figures of `pairs.py` they do not move with the machine's neighbours (on 2026-12-06 the bare
loop's CPU a turn moved by half within an hour; these counts did not move at all). Written for
#61, where each object a run holds saves about 0.06% of a turn in the 1,000-run scenario.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import tempfile

from loop_cost import OneMillisecond, sleep_tool  # the same directory

from tether import Agent, Runtime


def tracked() -> collections.Counter[str]:
    gc.collect()
    return collections.Counter(type(o).__name__ for o in gc.get_objects())


async def count(
    n: int, caught_ms: float, store: str | None
) -> tuple[collections.Counter[str], ...]:
    """The tracked objects `n` live runs hold `caught_ms` in, and what `n` ended runs leave."""
    agent = Agent(OneMillisecond(), [sleep_tool], system="s", name="bench")
    runtime = Runtime(store, [agent], take_over=False) if store else Runtime(agents=[agent])
    await runtime.open()

    async def one() -> None:  # holds nothing of the run: what is left is the runtime's
        run = await runtime.start("bench", "go")
        await run.wait()

    await asyncio.gather(*(one() for _ in range(50)))  # warm: imports, pools, first runs kept
    before = tracked()
    batch = asyncio.gather(*(one() for _ in range(n)))
    await asyncio.sleep(caught_ms / 1000)
    live = tracked() - before
    await batch
    del batch  # its tasks, which are the benchmark's
    await asyncio.sleep(0.01)  # the tool calls' last limits swept
    ended = tracked() - before
    await runtime.close()
    return live, ended


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1000, help="runs at once")
    ap.add_argument("--top", type=int, default=10, help="types shown")
    ap.add_argument("--at-ms", type=float, default=3.5, help="when the live runs are counted")
    ap.add_argument("--store", choices=["memory", "sqlite"], default="memory")
    a = ap.parse_args()
    store = f"sqlite:///{tempfile.mkdtemp()}/heap.sqlite" if a.store == "sqlite" else None
    live, ended = asyncio.run(count(a.n, a.at_ms, store))
    for name, counts in (("while it runs", live), ("ended, kept", ended)):
        per_run = sum(counts.values()) / a.n
        most = ", ".join(f"{t} {c / a.n:.1f}" for t, c in counts.most_common(a.top))
        print(f"{name:14s} {per_run:5.1f} tracked objects a run  ({most})")


if __name__ == "__main__":
    main()
