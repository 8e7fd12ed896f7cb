"""What `--sandbox` costs a bash call: the same command run plain and in bubblewrap, through
the tool's own `run_command`, interleaved, with the median of each.

    .venv/bin/python bench/sandbox_cost.py --calls 50
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

from tether.tools.bash import CappedOutput, run_command
from tether.tools.sandbox import Sandbox, check


async def once(command: str, workspace: str, sandbox: Sandbox | None) -> float:
    started = time.perf_counter()
    code = await run_command(command, workspace, CappedOutput(), (), sandbox)
    assert code == 0
    return time.perf_counter() - started


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--command", default="true")
    args = parser.parse_args()
    check(False)
    kinds: dict[str, Sandbox | None] = {
        "plain": None,
        "sandboxed": Sandbox(),
        "sandboxed, --sandbox-net": Sandbox(net=True),
    }
    times: dict[str, list[float]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as ws:
        for _ in range(args.calls):
            for kind, sandbox in kinds.items():
                times[kind].append(await once(args.command, ws, sandbox))
    base = statistics.median(times["plain"]) * 1000
    print(f"bash {args.command!r}, {args.calls} calls each, interleaved, median wall time")
    for kind, ts in times.items():
        t = statistics.median(ts) * 1000
        print(f"  {kind:26} {t:6.1f} ms   (+{t - base:.1f} ms)")


if __name__ == "__main__":
    asyncio.run(main())
