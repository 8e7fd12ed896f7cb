"""The rig's scenario counted in instructions and cache misses, not timed: what each side does
a model turn, the same from run to run whatever the machine's neighbours do.

    bench/.venv-bench/bin/python bench/instructions.py                  # bare loop and Tether
    bench/.venv-bench/bin/python bench/instructions.py --variant old=/tmp/old/src --variant new=src

Each side is the rig's harness (`pairs.py`'s mock model and script, streamed Chat Completions,
`--n` concurrent runs) under valgrind's callgrind with its cache simulation, once with one batch
and once with `--repeat` batches: the difference, over the model turns it added, is a turn's
count with start-up, imports and warm-up taken out. Reported a turn: instructions (`Ir`), first
level data and instruction cache misses (`D1mr`, `D1mw`, `I1mr`), last level misses (`LLm`) and
callgrind's cycle estimate (`Ir + 10 x L1 misses + 100 x LL misses`), each side also over the
bare loop's.

Written for #61 because the CPU figures of `pairs.py` move by 5% between rounds of the same
tree, more than most changes they were to price; these counts moved by 0.9% (the same tree
twice: how the mock's bytes fall into reads still varies). What they leave out: the kernel's
work (sockets, page faults), and timing itself: under valgrind a side runs some 50 times
slower, so the mock's 50 ms is short and the runs of a batch move more in step than they do at
full speed. Its first finding (2026-12-07): Tether runs fewer
instructions a turn than the bare loop (the bare loop reads its stream line by line) and misses
the first-level data cache half as often again, so its extra CPU a turn is where its memory is,
not how much it computes. Results go to `bench/instructions-<date>.json`.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pairs import BARE, TETHER, commit_of, harness, start_mock, variant_of  # the same directory

HERE = Path(__file__).resolve().parent
L1 = ("I1mr", "D1mr", "D1mw")
LL = ("ILmr", "DLmr", "DLmw")


def counted(
    port: int, driver: str, n: int, repeat: int, src: str | None, opts: tuple[str, ...]
) -> tuple[dict[str, int], int]:
    """One harness process under callgrind (`pairs.harness`): its event totals and the model
    turns it made."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "callgrind.out")
        grind = ["valgrind", "--tool=callgrind", "--cache-sim=yes", f"--callgrind-out-file={out}"]
        result = harness(port, driver, n, repeat, src, opts, prefix=grind, timeout=1800, wait=7200)
        if result.get("completed_ok") != n * repeat:
            raise SystemExit(f"instructions: {Path(driver).name} did not finish: {result}")
        text = out.read_text()
    names = re.search(r"^events: (.*)$", text, re.M)
    totals = re.search(r"^summary: (.*)$", text, re.M)
    if names is None or totals is None:
        raise SystemExit("instructions: callgrind wrote no summary")
    counts = dict(zip(names.group(1).split(), map(int, totals.group(1).split()), strict=True))
    return counts, int(result["model_requests"])


def per_turn(
    driver: str, n: int, repeat: int, src: str | None, opts: tuple[str, ...]
) -> dict[str, float]:
    """A model turn's counts: `repeat` batches less one, over the turns they added. Each side
    has a mock model of its own: the harness counts turns by the mock's requests."""
    mock, port = start_mock()
    try:
        one, turns_one = counted(port, driver, n, 1, src, opts)
        many, turns_many = counted(port, driver, n, repeat, src, opts)
    finally:
        mock.kill()
    turns = turns_many - turns_one
    row = {k: (many[k] - one[k]) / turns for k in many}
    row["L1m"] = sum(row[k] for k in L1)
    row["LLm"] = sum(row[k] for k in LL)
    row["CEst"] = row["Ir"] + 10 * row["L1m"] + 100 * row["LLm"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=300, help="concurrent runs a batch")
    ap.add_argument("--repeat", type=int, default=3, help="batches of the longer process")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME=SRC and/or NAME=KEY=VALUE,... (as pairs.py): Tether sides to count",
    )
    a = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("instructions: valgrind is not installed (apt-get install -y valgrind)")
    named = [variant_of(v) for v in a.variant] or [("tether", None, ())]
    sides: dict[str, tuple[str, str | None, tuple[str, ...]]] = {"bare": (BARE, None, ())}
    sides.update({name: (TETHER, src, opts) for name, src, opts in named})
    with ThreadPoolExecutor(max_workers=2) as pool:  # a side's count is its own either way
        futures = {
            name: pool.submit(per_turn, driver, a.n, a.repeat, src, opts)
            for name, (driver, src, opts) in sides.items()
        }
        rows = {name: f.result() for name, f in futures.items()}
    shown = ("Ir", "D1mr", "D1mw", "I1mr", "LLm", "CEst")
    print(f"{'a model turn':12s} " + " ".join(f"{k:>10s}" for k in shown))
    for name, row in rows.items():
        print(f"{name:12s} " + " ".join(f"{row[k]:10.0f}" for k in shown))
        if name != "bare":
            over = {k: row[k] / rows["bare"][k] for k in shown if rows["bare"][k]}
            print(f"{'  / bare':12s} " + " ".join(f"{over.get(k, 0):10.2f}" for k in shown))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = HERE / f"instructions-{stamp}.json"
    record: dict[str, Any] = {
        "commit": commit_of(HERE),
        "n": a.n,
        "repeat": a.repeat,
        "sides": {name: {"spec": list(map(str, sides[name][1:]))} | rows[name] for name in rows},
    }
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"instructions: wrote {path.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
