"""Kill durable runs with SIGKILL at random moments and check, on every run, that nothing
completed is repeated and nothing is lost.

    .venv/bin/python tests/crash_suite.py --kills 200 [--store postgresql://...]

A run makes 3 turns of two tool calls (an idempotent `note`, a non-idempotent `charge`), then
answers; the model (a wire-level mock) and each tool take a few hundred milliseconds. Each kill
comes after a random number of the run's events and a random moment more, so kills land in
start-up, in model calls, in tool calls and between them. After each kill `tether resume` continues
the run, until it finishes. Then, per run: it is done with the right answer; every note was
written exactly once; no charge was made twice; a charge that a crash hid was reported to the
model as "outcome unknown", never rerun; and the model was not asked again for a reply it had
already given (at most one repeated request per kill, for the call the kill interrupted).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import warm  # noqa: E402
from helpers import FIXTURES, TETHER, cli_env  # noqa: E402
from wire_server import WireServer, tool_results  # noqa: E402

ANSWER = "All three turns are done."
EVENTS_PER_RUN = 26  # what a run of three turns prints with --json


def script(body: dict[str, Any]) -> dict[str, Any]:
    turn = tool_results(body) // 2
    if turn < 3:
        return {
            "calls": [("note", {"text": f"turn {turn}"}), ("charge", {"amount": turn + 1})],
            "delay": 0.2,
        }
    return {"text": ANSWER, "delay": 0.2}


@dataclass
class Report:
    runs: int = 0
    kills: int = 0
    finished: int = 0
    problems: list[str] = field(default_factory=list)
    unknown_outcomes: int = 0
    repeated_model_calls: int = 0


def events_then_a_moment(proc: subprocess.Popen[str], rng: random.Random) -> str:
    """Wait for a random number of the run's events (none: it dies starting up), then a random
    moment more (up to a tool's or the model's time, so it dies inside a step as often as
    between them); return the lines read. The kill lands at the same points of a run however
    fast the machine is, where a random time from the start would land mostly in start-up on
    a loaded one."""
    assert proc.stdout is not None
    seen = []
    for _ in range(rng.randrange(0, EVENTS_PER_RUN)):
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
    time.sleep(rng.uniform(0, 0.3))
    return "".join(seen)


def one_run(
    wire: WireServer,
    store: str,
    run_id: str,
    work: Path,
    kills: int,
    rng: random.Random,
    report: Report,
) -> None:
    env = cli_env(
        OPENAI_API_KEY="sk-crash",
        NOTES_FILE=str(work / f"{run_id}.notes"),
        CHARGES_FILE=str(work / f"{run_id}.charges"),
    )
    start = [
        *TETHER,
        "run",
        "do the three turns",
        "--base-url",
        wire.url,
        "--store",
        store,
        "--run-id",
        run_id,
        "--tools-from",
        str(FIXTURES / "durable_tools.py"),
        "--approve",
        "auto",
        "--json",
        "--workspace",
        str(work),
    ]
    resume = [*TETHER, "resume", run_id, "--store", store, "--json"]
    requests_before = len(wire.requests)
    command, done, killed = start, False, 0
    last_error: list[str] = []
    for _ in range(2 * kills + 5):  # each kill may land before the run was even accepted
        proc = warm.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        seen = ""
        if killed < kills:
            seen = events_then_a_moment(proc, rng)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                killed += 1
                command = resume
                continue
            # it ended first: what readline read ahead is in the file's buffer, where
            # communicate() (which reads the pipe itself) would miss it
            assert proc.stdout is not None
            seen += proc.stdout.read()
        out, err = proc.communicate(timeout=120)
        out = seen + out
        last_error = err.strip().splitlines()[-1:] if err.strip() else [f"exit {proc.returncode}"]
        if f"no run {run_id} in the store" in err:
            command = start  # killed before the run was accepted: it never existed, start it
            continue
        if proc.returncode == 0:
            done = True
            final = json.loads(out.splitlines()[-1])
            if final.get("answer") != ANSWER:
                report.problems.append(f"{run_id}: answer {final.get('answer')!r} in {final}")
            break
        command = resume
    report.runs += 1
    report.kills += killed
    if not done:
        report.problems.append(f"{run_id}: never finished: {last_error}")
        return
    report.finished += 1
    notes = (work / f"{run_id}.notes").read_text().splitlines()
    if len(notes) != 3 or len({n.split()[0] for n in notes}) != 3:
        report.problems.append(f"{run_id}: notes {notes}")
    charges_path = work / f"{run_id}.charges"
    charges = charges_path.read_text().splitlines() if charges_path.exists() else []
    keys = [c.split()[0] for c in charges]
    if len(keys) != len(set(keys)):
        report.problems.append(f"{run_id}: a charge was made twice: {charges}")
    shown = warm.run(
        [*TETHER, "show", run_id, "--store", store, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    events = [json.loads(line) for line in shown.stdout.splitlines()]
    results = [e for e in events if e["type"] == "tool_result" and e["name"] == "charge"]
    unknown = [r for r in results if "Outcome unknown" in r["output"]]
    report.unknown_outcomes += len(unknown)
    if len(results) != 3 or len(keys) + len(unknown) < 3 or len(keys) > 3:
        report.problems.append(f"{run_id}: charges {keys}, results {results}")
    requests = len(wire.requests) - requests_before
    report.repeated_model_calls += requests - 4
    if requests > 4 + killed:
        report.problems.append(f"{run_id}: {requests} model requests for 4 replies, {killed} kills")


def run_suite(store: str, kills: int, work: Path, seed: int = 1, per_run: int = 4) -> Report:
    rng = random.Random(seed)
    report = Report()
    wire = WireServer().start()
    wire.rule = script
    try:
        n = 0
        while report.kills < kills:
            run_id = f"crash-{seed}-{n}-{uuid.uuid4().hex[:6]}"
            one_run(wire, store, run_id, work, min(per_run, kills - report.kills), rng, report)
            n += 1
    finally:
        wire.stop()
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--kills", type=int, default=200)
    ap.add_argument("--store", help="default: a new SQLite file")
    ap.add_argument("--seed", type=int, default=int(time.time()))
    args = ap.parse_args()
    work = Path(os.environ.get("CRASH_DIR", f"/tmp/tether-crash-{args.seed}"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ["XDG_DATA_HOME"] = str(work / "data")  # the journals, kept with the runs
    store = args.store or f"sqlite:///{work}/runs.sqlite"
    t0 = time.time()
    report = run_suite(store, args.kills, work, args.seed)
    print(
        json.dumps(
            {**report.__dict__, "store": store.split("@")[-1], "seconds": round(time.time() - t0)},
            indent=1,
        )
    )
    sys.exit(1 if report.problems else 0)


if __name__ == "__main__":
    main()
