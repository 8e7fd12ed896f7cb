"""Where Tether's own Python goes in a model turn: the rig's scenario with every bytecode
counted by the function that ran it, not timed.

    bench/.venv-bench/bin/python bench/bytecodes.py                      # this tree, top 30
    bench/.venv-bench/bin/python bench/bytecodes.py --variant old=/tmp/old/src --variant new=src

Each side is the rig's harness (`pairs.py`'s mock model and script, streamed Chat Completions,
`--n` concurrent runs) with `sys.monitoring` counting every bytecode it runs by its code object,
once with one batch and once with two: the difference over the model turns it added is a
turn's count, imports and warm-up taken out. It prints the functions of Tether's own code by
bytecodes a turn (with two sides, what changed most). Written for #61 on 2026-12-07: it found
a third of Tether's own bytecodes in the Chat Completions client, the conversation made into
its wire form again at every call among them.

A guide within one side, not across sides: bytecodes are not CPU (a bytecode may be a dict
lookup or a call into C), and the counting slows a side some tenfold, which changes how the
mock's bytes fall into reads. The bare loop runs 2.7 times Tether's bytecodes a turn (it reads
its stream line by line through aiohttp's Python) and less CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from pairs import TETHER, harness, start_mock, variant_of  # the same directory

PROBE = """
import atexit, collections, json, runpy, sys
counts = collections.Counter()
def count(code, offset):
    counts[code] += 1
mon = sys.monitoring
mon.use_tool_id(3, "bytecodes")
mon.register_callback(3, mon.events.INSTRUCTION, count)
mon.set_events(3, mon.events.INSTRUCTION)
def report():
    mon.set_events(3, 0)
    by = {f"{c.co_qualname} {c.co_filename}:{c.co_firstlineno}": n for c, n in counts.items()}
    with open(out, "w") as f:
        json.dump(by, f)
atexit.register(report)
out = sys.argv[1]
sys.argv = sys.argv[3:]  # past the output's path and the interpreter's, which pairs.harness adds
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def counted(port: int, n: int, src: str | None, opts: tuple[str, ...]) -> dict[str, float]:
    """Bytecodes a model turn by function: two batches less one, over the model turns the
    second added (the harness counts them by the mock's requests; sides run one at a time)."""
    got, turns = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in (1, 2):
            out = f"{tmp}/{repeat}.json"
            probe = [sys.executable, "-c", PROBE, out]
            result = harness(port, TETHER, n, repeat, src, opts, prefix=probe, wait=3600)
            if result.get("completed_ok") != n * repeat:
                raise SystemExit(f"bytecodes: the harness did not finish: {result}")
            got.append(json.loads(Path(out).read_text()))
            turns.append(int(result["model_requests"]))
    (one, two), added = got, turns[1] - turns[0]
    return {k: (two.get(k, 0) - one.get(k, 0)) / added for k in one.keys() | two.keys()}


def own(counts: dict[str, float]) -> dict[str, float]:
    """Tether's own functions, named short and without their line, so a function that moved
    is still itself (`providers/openai_chat.py parse_stream`)."""
    out: dict[str, float] = {}
    for key, n in counts.items():
        name, _, where = key.rpartition(" ")
        if "/tether/" in where:
            short = f"{where.split('/tether/', 1)[1].rpartition(':')[0]} {name}"
            out[short] = out.get(short, 0) + n
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=300, help="concurrent runs a batch")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--variant", action="append", default=[], help="NAME=SRC and/or KEY=VALUE")
    a = ap.parse_args()
    sides = [variant_of(v) for v in a.variant] or [("tether", None, ())]
    mock, port = start_mock()
    try:
        found = {name: own(counted(port, a.n, src, opts)) for name, src, opts in sides}
    finally:
        mock.terminate()
    names = list(found)
    print("bytecodes a model turn, Tether's own code: " + ", ".join(
        f"{name} {sum(found[name].values()):,.0f}" for name in names
    ))  # fmt: skip
    first, last = found[names[0]], found[names[-1]]
    keys = first.keys() | last.keys()
    if len(names) == 1:
        order = sorted(keys, key=lambda k: -first[k])
    else:
        order = sorted(keys, key=lambda k: -abs(last.get(k, 0) - first.get(k, 0)))
    for key in order[: a.top]:
        print(" ".join(f"{found[name].get(key, 0):8.1f}" for name in names) + f"  {key}")


if __name__ == "__main__":
    main()
