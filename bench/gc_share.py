#!/usr/bin/env python3
"""How much of a driver's CPU goes to the host's garbage collector, and what it collects: the
shared rig's harness run under GC callbacks, with the default GC (nothing tuned).

    bench/gc_share.py                         Tether, the bare agent loop, the aiohttp baseline
    bench/gc_share.py --n 1000 --repeat 3     (the defaults: scenario b's shape, three batches)

Each variant runs in a process of its own against one mock (the rig's, K=3 T=3, 50 ms model and
tool latency, streamed Chat Completions). For each it prints the CPU per model turn (the rig's
figure), the seconds spent inside collections and how many of each generation, and the object
types found most often in the youngest generation (sampled at every tenth collection): the
objects a turn makes that the collector must track. Issue #61: a turn within 1.2x the bare loop's
CPU with the host's own GC is won by making fewer of those, not by tuning the collector.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RIG = Path(os.environ.get("BENCH_RIG", HERE / "rig"))

PROBE = """
import atexit, collections, gc, json, runpy, sys, time
took, started, counts, kinds, seen = [0.0, 0.0, 0.0], [0.0], [0, 0, 0], collections.Counter(), [0]

def watch(phase, info):
    if phase == "start":
        if info["generation"] == 0:
            seen[0] += 1
            if seen[0] % 10 == 0:  # sampled before the clock starts: not counted as the GC's
                for o in gc.get_objects(0):
                    kinds[type(o).__module__ + "." + type(o).__qualname__] += 1
        started[0] = time.process_time()
    else:
        took[info["generation"]] += time.process_time() - started[0]
        counts[info["generation"]] += 1

gc.callbacks.append(watch)
atexit.register(lambda: print("GC " + json.dumps({"gc_s": sum(took), "by_generation_s": took,
    "collections": counts, "young": kinds.most_common(12)}), file=sys.stderr))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

VARIANTS = {
    "tether (Runtime)": (HERE / "tether_driver.py", []),
    "tether (bare Agent loop)": (HERE / "tether_driver.py", ["--opt", "runtime=0"]),
    "tether (Runtime, SQLite)": (HERE / "tether_driver.py", ["--opt", "store=sqlite:///{tmp}"]),
    "baseline-aiohttp": (RIG / "drivers" / "baseline_aiohttp.py", []),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(driver: Path, extra: list[str], port: int, n: int, repeat: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(RIG / "harness.py"), str(driver), "--port", str(port),
         "--protocol", "chat", "--stream", "1", "--n", str(n), "--repeat", str(repeat),
         "--warmup", "20", "--timeout", "240",
         *(x.format(tmp=f"{tempfile.mkdtemp()}/store.sqlite") for x in extra)],
        capture_output=True, text=True, cwd=RIG, timeout=600, check=False,
    )  # fmt: skip
    result = next(
        (json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("RESULT ")),
        None,
    )
    probe = next(
        (json.loads(line[3:]) for line in done.stderr.splitlines() if line.startswith("GC ")),
        None,
    )
    if result is None or probe is None:
        raise SystemExit(f"gc_share: {driver.name} gave no result:\n{done.stderr[-2000:]}")
    return {**probe, "cpu_s": result["cpu_s"], "ms_per_turn": result["cpu_ms_per_model_turn"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    if not (RIG / "harness.py").exists():
        raise SystemExit(f"gc_share: no benchmark rig at {RIG} (set BENCH_RIG)")
    port = free_port()
    mock = subprocess.Popen(
        [sys.executable, str(RIG / "mock_llm.py"), "--port", str(port), "--steps", "3",
         "--tools", "3", "--latency-ms", "50", "--tool-ms", "50"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(1.5)
        for name, (driver, extra) in VARIANTS.items():
            m = measure(driver, extra, port, a.n, a.repeat)
            share = m["gc_s"] / m["cpu_s"]
            by = "/".join(f"{t:.2f}" for t in m["by_generation_s"])
            gc_line = f"GC {m['gc_s']:.2f} s ({by} s by generation)"
            gc_line += f" of {m['cpu_s']:.2f} s CPU ({share:.0%})"
            print(f"{name:26} {m['ms_per_turn']:.3f} ms/turn  {gc_line}  {m['collections']}")
            young = ", ".join(f"{k.split('.')[-1]} {v}" for k, v in m["young"])
            print(f"    youngest generation, most: {young}")
    finally:
        mock.terminate()


if __name__ == "__main__":
    main()
