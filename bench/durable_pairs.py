"""Two Tether trees side by side on the durable stores: CPU a model turn in the rig's scenarios,
the Postgres server's counted, each tree's run beside the other's in every round (#61 item 2).

    bench/.venv-bench/bin/python bench/durable_pairs.py --old /tmp/old/src [--new src]
        [--scenario a|c1000] [--rounds 4] [--stores memory,sqlite,postgres]

`--old` is another tree's `src` (say `git archive HEAD~1 src | tar -x -C /tmp/old`). Each
round runs every store once with each tree, the trees' order alternating round by round, each
run in a process of its own (the rig's harness, pinned to core 1; the mock on core 0) on a
fresh SQLite file or a fresh Postgres database. The server's CPU (its postmaster and backends)
is added to a Postgres run's, as `bench/peers` counts it. Scenario a: one run at a time, 100
runs of 5 turns of 1 tool, no latency; c1000: 1,000 runs at once, 3 turns of 3 tools, 50 ms
model and tool latency. Prints each run and the medians, and writes the figures to
`bench/durable-pairs-<date>.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pairs import pinned, start_mock  # the same directory
from peers import Stores

HERE = Path(__file__).resolve().parent
RIG = HERE / "rig"
SCENARIOS = {
    "a": (["--steps", "5", "--tools", "1", "--latency-ms", "0", "--tool-ms", "0", "--deltas", "8"],
          ["--n", "1", "--repeat", "100", "--warmup", "3"]),
    "c1000": (["--steps", "3", "--tools", "3", "--latency-ms", "50", "--tool-ms", "50",
               "--deltas", "8"], ["--n", "1000", "--repeat", "1", "--warmup", "1"]),
}  # fmt: skip
SERVER = "postgresql://postgres@127.0.0.1:5432"


def one(src: str, store: str, scenario: str, port: int, stores: Stores) -> dict[str, Any]:
    """One harness run of tree `src` on a new store of kind `store` (memory, sqlite or
    postgres), made and dropped as `bench/peers` makes its own."""
    opts: list[str] = []
    env = {"PYTHONPATH": src}
    dropped = None
    if store != "memory":
        where, dropped = stores.fresh(store)
        opts = ["--opt", f"store=sqlite:///{where}" if store == "sqlite" else f"store={where}"]
    if store == "postgres":
        env["BENCH_SERVER_PID"] = str(stores.server_pid())
    cmd = [*pinned(1), sys.executable, str(RIG / "harness.py"), str(HERE / "tether_driver.py"),
           "--port", str(port), "--protocol", "chat", "--stream", "1",
           *SCENARIOS[scenario][1], "--timeout", "240", *opts]  # fmt: skip
    try:
        done = subprocess.run(
            cmd, cwd=RIG, capture_output=True, text=True, env={**os.environ, **env}
        )
    finally:
        if dropped is not None:
            dropped({})  # counts nothing, drops the store
    found = [line[7:] for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not found:
        raise SystemExit(f"durable_pairs: no result from {store} on {src}:\n{done.stderr[-2000:]}")
    r = json.loads(found[0])
    total = r["cpu_ms_per_model_turn"] + (r.get("server_ms_per_model_turn") or 0.0)
    return {"ms_per_turn": round(total, 3), "ok": r.get("completed_ok")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--old", required=True, help="the other tree's src")
    ap.add_argument("--new", default=str(HERE.parent / "src"))
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), default="a")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--stores", default="memory,sqlite,postgres")
    ap.add_argument("--server", default=SERVER, help="a Postgres server to make databases on")
    a = ap.parse_args()
    trees = {"old": str(Path(a.old).resolve()), "new": str(Path(a.new).resolve())}
    stores = a.stores.split(",")
    made = Stores(a.server)  # each run's new store, dropped after it
    mock, port = start_mock(SCENARIOS[a.scenario][0])
    found: dict[str, list[float]] = {}
    try:
        for n in range(a.rounds):
            order = list(trees) if n % 2 == 0 else list(trees)[::-1]
            for store in stores:
                for tree in order:
                    r = one(trees[tree], store, a.scenario, port, made)
                    found.setdefault(f"{store} {tree}", []).append(r["ms_per_turn"])
                    print(f"round {n + 1}: {store} {tree} {r['ms_per_turn']} ms/turn ({r['ok']})")
    finally:
        mock.terminate()
    medians = {k: statistics.median(v) for k, v in found.items()}
    for store in stores:
        old, new = medians[f"{store} old"], medians[f"{store} new"]
        print(f"{store}: old {old:.3f}, new {new:.3f} ms/turn (new/old {new / old:.2f}x)")
    out = HERE / f"durable-pairs-{time.strftime('%Y%m%d-%H%M%S')}.json"
    meta = {"scenario": a.scenario, "rounds": a.rounds, "trees": trees}
    out.write_text(json.dumps({"meta": meta, "runs": found, "medians": medians}, indent=1))
    print(f"durable_pairs: wrote {out.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
