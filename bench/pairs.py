"""Pinned pairs: Tether's CPU per model turn over the bare aiohttp loop's, the bar of #61.

    bench/.venv-bench/bin/python bench/pairs.py                  # 6 pairs, 1,000 runs x 3
    bench/.venv-bench/bin/python bench/pairs.py --src /tmp/old/src --pairs 4   # an older tree
    bench/.venv-bench/bin/python bench/pairs.py --pairs 12 --variant new=src \
        --variant old=/tmp/old/src --variant keep0=keep_finished=0       # sides in one session

One mock model (the rig's `mock_llm.py`, scenario b's script: 3 steps of 3 parallel tool calls,
50 ms model latency, 50 ms tools, 8 streamed deltas) runs pinned to core 0; each harness process
(the rig's `harness.py`, one driver, 1,000 concurrent runs, 3 batches) runs pinned to core 1, so
the two never share a core and neither tunes the garbage collector. A pair is one Tether run and
one bare run back to back, the order alternating pair by pair; the ratio of their CPU per model
turn is the pair's figure. We report the median with min and max, because one run of 3,000 runs
on a 2-core machine moves by 10-20% from minute to minute, and a pair is measured inside one such
minute. Written because the single rows of `bench/peers` at c1000 said 1.0x where six pairs said
1.41x.

`--src` puts another tree's `src` first on the path of Tether's harness (a before/after of a
change, both sides measured in the same minutes as the bare loop). `--opt KEY=VALUE` goes to
Tether's driver: `--opt max_model_calls=0 --opt keep_finished=0` prices what the Runtime's
defaults (a bound of 256 model calls, 10,000 ended runs kept) cost in this scenario.

`--variant NAME=SPEC` (repeated) measures several Tether sides in the same rounds: each round
runs the bare loop and every side once, the first of them changing round by round, and each
side's figure is its ratio to that round's bare run. Compare sides only so: on 2026-12-06 the
bare loop's own CPU a turn moved from 0.31 to 0.56 ms within the hour, and two sessions of
pairs run ten minutes apart disagreed by more than the change they were to price. Results go to
`bench/pairs-<date>.json`.

`--duet` runs a round's sides at the same time, all on core 1, each with a mock of its own on
core 0: whatever the machine does in that minute falls on every side alike. Sequential rounds
of one tree spread from 0.91x to 1.50x on 2026-12-07; duet rounds of one tree spread by some 4%
either side. `--repeat 1` is the shared rig's own scenario b (one batch of 1,000 runs after one
warm-up run); the default three batches is a harder test, as the runs a Runtime keeps after they
end (all of them, up to 10,000) grow the heap every full collection walks:

    bench/.venv-bench/bin/python bench/pairs.py --duet --pairs 10 --repeat 1 --variant now=src
    bench/.venv-bench/bin/python bench/pairs.py --duet --pairs 8 --variant base=/tmp/old/src \
        --variant now=src
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RIG = HERE / "rig"
MOCK = ["--steps", "3", "--tools", "3", "--latency-ms", "50", "--tool-ms", "50", "--deltas", "8"]
TETHER = str(HERE / "tether_driver.py")
BARE = str(RIG / "drivers" / "baseline_aiohttp.py")


def pinned(core: int) -> list[str]:
    """`taskset -c CORE` when the machine has that core and taskset, else nothing."""
    if (os.cpu_count() or 1) > core and subprocess.run(
        ["which", "taskset"], capture_output=True
    ).returncode == 0:
        return ["taskset", "-c", str(core)]
    return []


def start_mock(script: list[str] = MOCK) -> tuple[subprocess.Popen[bytes], int]:
    """The rig's mock model on a free port, pinned to core 0, answering by `script`."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    cmd = [*pinned(0), sys.executable, str(RIG / "mock_llm.py"), "--port", str(port), *script]
    mock = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
            return mock, port
        except OSError:
            time.sleep(0.1)
    mock.kill()
    raise SystemExit("pairs: the mock model did not start")


def harness(
    port: int,
    driver: str,
    n: int,
    repeat: int,
    src: str | None,
    opts: tuple[str, ...] = (),
    prefix: list[str] | None = None,
    timeout: int = 240,
    wait: int = 900,
) -> dict[str, Any]:
    """One harness process, pinned to core 1 (or run under `prefix`: valgrind, for
    `instructions.py`); its RESULT line as a dict. `opts`: the driver's `--opt KEY=VALUE`s;
    `timeout`: the harness's for a batch; `wait`: the process's."""
    cmd = [
        *(pinned(1) if prefix is None else prefix),
        sys.executable,
        str(RIG / "harness.py"),
        driver,
        "--port",
        str(port),
        "--protocol",
        "chat",
        "--stream",
        "1",
        "--n",
        str(n),
        "--repeat",
        str(repeat),
        "--warmup",
        "1",
        "--timeout",
        str(timeout),
        *(arg for opt in opts for arg in ("--opt", opt)),
    ]
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=wait)
    out = out.stdout
    for line in out.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[7:])
            return result
    raise SystemExit(f"pairs: {Path(driver).name} gave no RESULT line")


def commit_of(where: Path) -> str:
    """The commit of the checkout `where` is in ("" outside one): a figure names its tree."""
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=where, capture_output=True, text=True
    ).stdout.strip()


def per_turn(result: dict[str, Any]) -> float:
    ok, want = result.get("completed_ok", 0), result["n"] * result.get("repeat", 1)
    if ok != want:
        raise SystemExit(
            f"pairs: {result['driver']} finished {ok} of {want} runs: {result.get('errors')}"
        )
    return float(result["cpu_ms_per_model_turn"])


def variant_of(spec: str) -> tuple[str, str | None, tuple[str, ...]]:
    """`--variant NAME=SPEC`: SPEC is a tree's src (a path) and/or the driver's KEY=VALUEs,
    comma-separated (`old=/tmp/old/src`, `keep0=keep_finished=0`, `x=/tmp/x,keep_finished=0`)."""
    name, eq, rest = spec.partition("=")
    if not eq or not name:
        raise SystemExit(f"pairs: --variant {spec!r}: write NAME=SRC and/or NAME=KEY=VALUE,...")
    src, opts = None, []
    for part in filter(None, rest.split(",")):
        if "=" in part:
            opts.append(part)
        elif Path(part, "tether").is_dir():
            src = part
        else:
            raise SystemExit(f"pairs: --variant {name}: {part!r} holds no tether/ package")
    return name, src, tuple(opts)


def measure(
    side: str, port: int, variants: dict[str, tuple[str | None, tuple[str, ...]]], a: Any
) -> float:
    """One side's CPU a model turn: one harness process of the bare loop or of a variant."""
    if side == "bare":
        return per_turn(harness(port, BARE, a.n, a.repeat, None))
    return per_turn(harness(port, TETHER, a.n, a.repeat, *variants[side]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=6, help="rounds (a pair: one of each side)")
    ap.add_argument("--n", type=int, default=1000, help="concurrent runs a batch")
    ap.add_argument("--repeat", type=int, default=3, help="batches a harness process")
    ap.add_argument("--src", help="a Tether tree's src to measure instead of the installed one")
    ap.add_argument(
        "--opt",
        action="append",
        default=[],
        help="KEY=VALUE for Tether's driver (max_model_calls=0, keep_finished=0: what a default "
        "costs)",
    )
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME=SRC and/or NAME=KEY=VALUE,...: Tether sides measured in the same rounds "
        "(instead of --src and --opt), each against the round's bare run",
    )
    ap.add_argument(
        "--duet",
        action="store_true",
        help="run a round's sides at the same time, on the same core, each with a mock of its "
        "own: the machine's drift falls on every side alike",
    )
    a = ap.parse_args()
    if a.src is not None and not Path(a.src, "tether").is_dir():
        raise SystemExit(f"pairs: --src {a.src}: no tether/ package there")
    named = [variant_of(v) for v in a.variant] or [("tether", a.src, tuple(a.opt))]
    variants = {name: (src, opts) for name, src, opts in named}
    sides = ["bare", *variants]
    mocks = [start_mock() for _ in (sides if a.duet else sides[:1])]
    rows = []
    try:
        for i in range(a.pairs):
            order = sides[i % len(sides) :] + sides[: i % len(sides)]  # each goes first in turn
            if a.duet:  # all at once, each with a mock of its own (which changes round by round)
                with ThreadPoolExecutor(len(sides)) as pool:
                    futures = {
                        side: pool.submit(measure, side, mocks[k][1], variants, a)
                        for k, side in enumerate(order)
                    }
                got = {side: f.result() for side, f in futures.items()}
            else:
                got = {side: measure(side, mocks[0][1], variants, a) for side in order}
            row = {f"{side}_ms": got[side] for side in sides}
            row.update({name: round(got[name] / got["bare"], 3) for name in variants})
            rows.append(row)
            said = ", ".join(f"{name} {row[name]:.2f}x" for name in variants)
            print(f"round {i + 1}: bare {got['bare']:.3f} ms/turn; {said}", flush=True)
    finally:
        for mock, _ in mocks:
            mock.kill()
    summary = {}
    for name in variants:
        ratios = [r[name] for r in rows]
        summary[name] = {
            "median": statistics.median(ratios),
            "min": min(ratios),
            "max": max(ratios),
        }
        print(
            f"{name} / bare: median {summary[name]['median']:.2f}x",
            f"(min {summary[name]['min']:.2f}, max {summary[name]['max']:.2f})",
        )
    out = HERE / f"pairs-{time.strftime('%Y%m%d-%H%M%S')}.json"
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "n": a.n,
        "repeat": a.repeat,
        "duet": a.duet,
        "variants": {
            name: {"src": src, "src_commit": commit_of(Path(src)) if src else None, "opts": opts}
            for name, (src, opts) in variants.items()
        },
        "mock": MOCK,
        "commit": commit_of(HERE),
    }
    out.write_text(json.dumps({"meta": meta, "rounds": rows, "ratio": summary}, indent=1) + "\n")
    print(f"pairs: wrote {out.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
