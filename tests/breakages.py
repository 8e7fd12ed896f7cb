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


ACCOUNTS = "tests/test_accounts.py"
RATES = "tests/test_rates.py"
FORK = (
    "tests/test_fork.py::test_a_fork_in_memory_keeps_its_runs_account_and_a_replaced_failure_is_a_"
    "result"
)

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
    # issue 65: where a rule has a second copy (Python and SQL, memory and store, SQLite and
    # Postgres, the run page and the inbox), each copy broken as that issue found it
    Breakage(
        "65.1 Postgres's settlement leaves a call's estimate held",
        "src/tether/durable/accounts.py",
        '    "WITH gone AS (DELETE FROM tether_account_held WHERE run_id = :r AND key = :k "\n'
        '    "RETURNING account, day, month) "',
        '    "WITH gone AS (SELECT account, day, month FROM tether_account_held "\n'
        '    "WHERE run_id = :r AND key = :k) "',
        (f"{ACCOUNTS}::test_a_call_is_counted_once_whichever_process_settles_it[postgres]",),
    ),
    Breakage(
        "65.1 a call not held here is added up again though its account has limits",
        "src/tether/durable/accounts.py",
        '    "(SELECT 1 FROM tether_account_held WHERE run_id = :r AND key = :k) AND NOT EXISTS "\n'
        '    "(SELECT 1 FROM tether_account_limits WHERE account = :a)" + ADDED',
        '    "(SELECT 1 FROM tether_account_held WHERE run_id = :r AND key = :k)" + ADDED',
        (f"{ACCOUNTS}::test_a_call_is_counted_once_whichever_process_settles_it",),
    ),
    Breakage(
        "65.2 SQLite's reservation forgets the row a crash left (Postgres's function alone does)",
        "src/tether/durable/accounts.py",
        "            if own is not None:  # an attempt a crash cut short: counted at its estimate",
        "            if own is not None and self.ledger.engine is not None:",
        (f"{ACCOUNTS}::test_a_run_killed_mid_call_is_resumed_and_its_account_counts_the_cut_call",),
    ),
    Breakage(
        "65.2 Postgres's reservation forgets the row a crash left",
        "src/tether/durable/accounts.py",
        "    IF FOUND THEN  -- an attempt a crash cut short: counted at its estimate",
        "    IF FALSE THEN  -- an attempt a crash cut short: counted at its estimate",
        (f"{ACCOUNTS}::test_a_run_killed_mid_call_is_resumed_and_its_account_counts_the_cut_call",),
    ),
    Breakage(
        "65.3 a run in memory of an account whose limit says queue is refused",
        "src/tether/runtime.py",
        "        refused = standing.refusal_of_new_runs()",
        "        refused = standing.refusal()",
        (f"{ACCOUNTS}::test_a_new_run_of_an_account_that_queues_waits_for_room_and_then_goes_on",),
    ),
    Breakage(
        "65.3 the queue refuses an account whose limit says queue",
        "src/tether/backends.py",
        "    refused = standing.refusal_of_new_runs()",
        "    refused = standing.refusal()",
        (
            f"{ACCOUNTS}::test_a_durable_run_queued_for_its_accounts_room_goes_on_when_the_limit_"
            "is_raised",
        ),
    ),
    Breakage(
        "65.4 a fork in memory drops its run's account",
        "src/tether/backends.py",
        "            workspace=c.workspace, account_id=c.account_id, deps=c.deps,",
        "            workspace=c.workspace, deps=c.deps,",
        (FORK,),
    ),
    Breakage(
        "65.4 a fork's replaced tool result still says the call failed",
        "src/tether/fork.py",
        "output=left.pop(p.call_id), is_error=False)",
        "output=left.pop(p.call_id))",
        (FORK,),
    ),
    Breakage(
        "65.5 an upgrade without --to picks one of two other versions",
        "src/tether/durable/remote.py",
        "    if len(others) == 1:\n        return others[0]",
        "    if others:\n        return others[0]",
        (
            "tests/test_versions.py::test_an_upgrade_without_a_version_goes_to_the_one_other_"
            "served_or_is_refused",
        ),
    ),
    Breakage(
        "65.6 an attempt's token estimate leaves out max_output_tokens",
        "src/tether/rates.py",
        "    return len(body) // 4 + (max_output_tokens or 0)",
        "    return len(body) // 4",
        (f"{RATES}::test_an_attempts_tokens_are_its_body_and_the_reply_it_allows",),
    ),
    Breakage(
        "65.6 a waiting attempt sleeps its whole wait, deaf to a rate raised meanwhile",
        "src/tether/rates.py",
        "            await asyncio.sleep(min(wait, LONGEST_NAP))",
        "            await asyncio.sleep(wait)",
        (f"{RATES}::test_every_copy_of_the_rule_keeps_tokens_pauses_and_raised_rates",),
    ),
    Breakage(
        "65.6 a token rate on SQLite never takes effect (attempts logged without tokens)",
        "src/tether/durable/rates.py",
        '{"e": endpoint, "at": now, "t": tokens},',
        '{"e": endpoint, "at": now, "t": 0},',
        (f"{RATES}::test_every_copy_of_the_rule_keeps_tokens_pauses_and_raised_rates",),
    ),
    Breakage(
        "65.6 a shorter pause replaces a longer one in memory",
        "src/tether/rates.py",
        "        found.paused_until = max(found.paused_until, time.time() + seconds)",
        "        found.paused_until = time.time() + seconds",
        (f"{RATES}::test_every_copy_of_the_rule_keeps_tokens_pauses_and_raised_rates",),
    ),
    Breakage(
        "65.6 a shorter pause replaces a longer one on a store",
        "src/tether/durable/rates.py",
        'f"{self.later}(tether_rates.paused_until, excluded.paused_until)",',
        '"excluded.paused_until",',
        (f"{RATES}::test_every_copy_of_the_rule_keeps_tokens_pauses_and_raised_rates",),
    ),
    Breakage(
        "65.7 the page's list on a store keeps a halted run under done",
        "src/tether/durable/view.py",
        '            if flt.states and row["state"] not in flt.states:\n                continue\n',
        "",
        (
            "tests/test_web.py::test_the_list_filters_each_ended_state_alike_in_memory_and_on_a_"
            "store[store]",
        ),
    ),
    Breakage(
        "65.7 tether runs --state done on a store lists halted runs too",
        "src/tether/durable/view.py",
        '    return rows if states is None else [r for r in rows if r["state"] in states]',
        "    return rows",
        (
            "tests/test_web.py::test_the_list_filters_each_ended_state_alike_in_memory_and_on_a_"
            "store[store]",
        ),
    ),
    Breakage(
        "65.8 the inbox's Approve sends no args_hash",
        "src/tether/web/inbox_page.py",
        "{approval_id: a.approval_id, args_hash: a.args_hash}",
        "{approval_id: a.approval_id}",
        ("tests/test_web.py::test_the_inbox_approves_and_denies_the_calls_of_every_run",),
    ),
    Breakage(
        "65.8 in memory, a run waiting only on a tool's question is not in the inbox",
        "src/tether/memory_view.py",
        "            asks = run is not None and (run.waiting() or self.asked.of_run(run_id))",
        "            asks = run is not None and run.waiting()",
        ("tests/test_web.py::test_a_servers_question_is_answered_in_a_form_on_the_page[memory]",),
    ),
    Breakage(
        "65.9 a server's question goes to the first run calling it",
        "src/tether/tools/mcp.py",
        "        return next(iter(runs.values())) if len(runs) == 1 else None",
        "        return next(iter(runs.values()), None)",
        ("tests/test_mcp.py::test_a_question_with_calls_of_several_runs_in_flight_names_no_run",),
    ),
    Breakage(
        "65.9 run_agent returns a halted run's partial answer as a success",
        "src/tether/mcp_server.py",
        '        if result.outcome != "done":',
        '        if result.outcome not in ("done", "halted"):',
        ("tests/test_mcp.py::test_mcp_serves_a_halted_agent_run_as_an_error_not_an_answer",),
    ),
    Breakage(
        "65.9 a second browser sign-in listens on any port, not the registered one",
        "src/tether/tools/mcp_auth.py",
        "    sign_in = SignIn(server, settings, registered_port(storage))",
        "    sign_in = SignIn(server, settings)",
        (
            "tests/test_mcp_auth.py::test_a_second_browser_sign_in_sends_the_redirect_its_client_"
            "was_registered_with",
        ),
    ),
    Breakage(
        "65.9 a browser sign-in must finish within --connect-timeout",
        "src/tether/tools/mcp.py",
        "async with asyncio.timeout(connect_timeout + signing_in(spec, settings)):",
        "async with asyncio.timeout(connect_timeout):",
        ("tests/test_mcp_auth.py::test_a_sign_in_longer_than_the_connect_timeout_succeeds",),
    ),
    Breakage(
        "65.10 Postgres's limit function reads a month's token limit as the day's",
        "src/tether/durable/accounts.py",
        "       OR tok_month >= COALESCE(CAST(lim ->> 'tokens_per_month'",
        "       OR tok_month >= COALESCE(CAST(lim ->> 'tokens_per_day'",
        (f"{ACCOUNTS}::test_every_limit_kind_refuses_alike_in_memory_and_on_each_store",),
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
