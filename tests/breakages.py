"""Hand-made breakages: the mistakes a developer makes (a kill that reaches only the shell, a
WHERE clause that forgets the run, a Host check by prefix), each put into the code by hand and
run against the tests that must catch it. Where `mutate.py` flips operators at random, these
are the realistic ones an outside check found surviving the whole suite (issue 47); each has a
test now, and this file shows that test fails with the breakage in.

    scripts/mutate --breakages [NAME ...] [--list]

(`scripts/mutate` runs this in a copy of the tree, which it removes at the end.) Prints each
breakage caught or survived; exits 1 if any survived, or if the code no longer holds the text
a breakage changes (then the breakage is to be written anew for the code as it is).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

from mutate import ROOT, killed


@dataclass(frozen=True)
class Breakage:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


BREAKAGES = (
    Breakage(
        "a timeout or cancel kills only the shell, not its process group",
        "src/tether/tools/bash.py",
        "        kill_group(proc.pid)\n        await asyncio.shield(sweeper.sweep(cookie))",
        "        if proc.returncode is None:\n            proc.kill()\n"
        "        await asyncio.shield(sweeper.sweep(cookie))",
        (
            "tests/test_builtin_tools.py::test_bash_timeout_kills_the_whole_tree",
            "tests/test_builtin_tools.py::test_bash_cancel_kills_the_whole_tree",
        ),
    ),
    Breakage(
        "the sandbox without --die-with-parent",
        "src/tether/tools/sandbox.py",
        '            "--die-with-parent",\n',
        "",
        ("tests/test_builtin_tools.py::test_a_sandboxed_command_dies_with_a_killed_tether",),
    ),
    Breakage(
        "a durable run's end leaves its shell session's jobs running",
        "src/tether/durable/process.py",
        "        if ctx is not None and ctx.kept:",
        "        if ctx is not None and ctx.kept and False:",
        ("tests/test_terminal.py::test_a_durable_run_s_end_stops_the_jobs_it_left_running",),
    ),
    Breakage(
        "the tool journal records a result by call id alone",
        "src/tether/durable/ledger.py",
        "SET result = :x WHERE run_id = :r AND call_id = :c",
        "SET result = :x WHERE call_id = :c AND :r = :r",
        ("tests/test_durable.py::test_one_run_s_recorded_call_is_never_taken_for_another_s",),
    ),
    Breakage(
        "enqueue_many with a repeated run id queues one and reports two",
        "src/tether/durable/remote.py",
        '    if len(set(ids)) != len(ids):\n        raise ConfigError("two runs to queue have '
        'the same id")\n',
        "",
        ("tests/test_durable_python.py::test_a_batch_that_names_one_run_twice_queues_nothing",),
    ),
    Breakage(
        "a worker ignores --concurrency",
        "src/tether/durable/workers.py",
        "register_queue_async(queue, worker_concurrency=concurrency)",
        "register_queue_async(queue, worker_concurrency=None)",
        ("tests/test_cli.py::test_a_worker_takes_no_more_runs_than_its_concurrency",),
    ),
    Breakage(
        "the page's Host check by prefix",
        "src/tether/web/server.py",
        "if self.hosts is not None and host_name(request.host) not in self.hosts:",
        "if self.hosts is not None and not any(\n"
        "            host_name(request.host).startswith(h) for h in self.hosts\n        ):",
        ("tests/test_web.py::test_requests_come_from_where_they_should",),
    ),
    Breakage(
        "context trimming also cuts the outputs the model has just asked for",
        "src/tether/context.py",
        '        if m.role != "tool" or i == last_tool:',
        '        if m.role != "tool":',
        (
            "tests/test_context.py::"
            "test_no_summary_is_asked_for_when_trimming_old_outputs_is_enough",
        ),
    ),
    Breakage(
        "a summary parts a tool call from its result",
        "src/tether/context.py",
        '    while i < len(messages) and messages[i].role == "tool":\n        i += 1\n',
        "",
        ("tests/test_context.py::test_a_long_run_fits_a_small_window",),
    ),
    Breakage(
        "the store's error text said without redaction",
        "src/tether/durable/outage.py",
        "    return scrub(line.strip())[:200]",
        "    return line.strip()[:200]",
        ("tests/test_store_outage.py::test_a_secret_in_what_the_driver_says_is_never_repeated",),
    ),
    Breakage(
        "the page's approve endpoint drops the args_hash it was sent",
        "src/tether/web/server.py",
        'shown = body.get("args_hash")',
        "shown = None",
        ("tests/test_web.py::test_the_page_approves_only_the_arguments_it_showed",),
    ),
)


def caught(b: Breakage, timeout: float) -> bool | None:
    """Whether the breakage's tests fail with it put in; None when the code no longer holds
    the text it changes. The file is put back whatever happens."""
    path = ROOT / b.path
    original = path.read_text()
    if original.count(b.old) != 1:
        return None
    try:
        path.write_text(original.replace(b.old, b.new))
        return killed(list(b.tests), timeout)
    finally:
        path.write_text(original)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("names", nargs="*", help="breakages whose name holds one of these words")
    ap.add_argument("--list", action="store_true", help="print the breakages, run nothing")
    ap.add_argument("--timeout", type=float, default=180, help="seconds a test run may take")
    args = ap.parse_args()
    chosen = [b for b in BREAKAGES if not args.names or any(n in b.name for n in args.names)]
    if args.list:
        print("\n".join(f"{b.path}: {b.name}" for b in chosen))
        return
    failing = [t for b in chosen if killed(list(b.tests), args.timeout) for t in b.tests]
    if failing:  # else every breakage would count as caught
        sys.exit("breakages: these tests fail with no breakage in: " + ", ".join(failing))
    t0, bad = time.monotonic(), 0
    for b in chosen:
        verdict = caught(b, args.timeout)
        said = {True: "caught", False: "SURVIVED", None: "NOT APPLIED (the code changed)"}
        bad += verdict is not True
        print(f"{said[verdict]:8}  {b.name}", flush=True)
    print(f"\n{len(chosen) - bad}/{len(chosen)} caught in {time.monotonic() - t0:.0f} s")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
