"""Durable runs: kill -9 at random points, resume, and check the invariants on every run
(a short version of tests/crash_suite.py, which runs 200 kills by hand)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

import warm

pytest.importorskip("dbos", reason="needs the durable extra")

from crash_suite import run_suite
from helpers import FIXTURES, TETHER, Output, cli_env, json_lines, store_runs, tether, wait_until
from wire_server import WireServer, tool_results


def tools_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a run with the side-effecting tools of `durable_tools.py`."""
    return cli_env(
        OPENAI_API_KEY="sk-durable",
        NOTES_FILE=str(tmp_path / "notes"),
        CHARGES_FILE=str(tmp_path / "charges"),
    )


def kill_at(env: dict[str, str], event_type: str, *args: str) -> dict[str, Any]:
    """Start `tether ARGS --json`, SIGKILL it at its first `event_type` event, return that."""
    proc = warm.Popen(
        [*TETHER, *args, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        event: dict[str, Any] = json.loads(line)
        if event["type"] == event_type:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return event
    raise AssertionError(f"the run ended without a {event_type} event")


def test_sqlite_runs_survive_random_kills(tmp_path: Path) -> None:
    report = run_suite(f"sqlite:///{tmp_path}/runs.sqlite", kills=8, work=tmp_path, seed=7)
    assert report.problems == []
    assert report.kills == 8 and report.finished == report.runs >= 2


def test_postgres_runs_survive_random_kills(tmp_path: Path, postgres: str) -> None:
    report = run_suite(postgres, kills=6, work=tmp_path, seed=11)
    assert report.problems == []
    assert report.kills == 6 and report.finished == report.runs >= 2


def test_an_approval_survives_a_crash(wire: WireServer, tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/runs.sqlite"
    wire.add(calls=[("bash", {"command": "echo approved > proof.txt"})]).add(text="It is done.")
    env = cli_env(OPENAI_API_KEY="sk-durable")
    # the process dies while the run waits for a person
    request = kill_at(
        env,
        "approval_requested",
        "run",
        "make proof",
        "--base-url",
        wire.url,
        "--tools",
        "bash",
        "--store",
        store,
        "--run-id",
        "appr-1",
        "--workspace",
        str(tmp_path),
    )
    assert request["name"] == "bash"
    # its process is dead: it waits for approval and for a process to resume it
    waiting = tether("runs", "--store", store, "--state", "interrupted", env=env).stdout
    assert waiting.split("\t")[0] == "appr-1"
    assert f"(tether resume appr-1); waits for approval ({request['approval_id']})" in waiting
    approve = tether("approve", "appr-1", request["approval_id"], "--store", store, env=env)
    assert approve.returncode == 0, approve.stderr
    resumed = tether("resume", "appr-1", "--store", store, "--json", env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.splitlines()[-1])["answer"] == "It is done."
    assert (tmp_path / "proof.txt").read_text() == "approved\n"
    assert len(wire.requests) == 2  # the first reply was not asked for again


def test_a_batch_queued_before_any_worker_survives_a_dead_worker(
    wire: WireServer, tmp_path: Path, postgres: str
) -> None:
    """Queue first, workers later, on a fresh database: 200 runs queued by one command, two
    workers started, one killed while it holds runs. Every run ends done, `tether runs` shows
    each, and the crash suite's rules hold: each note written once, no charge made twice, no
    model reply asked for again but those the kill interrupted."""
    runs = 200
    released = threading.Event()  # first replies wait for it: a cannot finish what it holds

    def one_turn(body: dict[str, Any]) -> dict[str, Any]:
        if tool_results(body) == 0:
            text = body["messages"][1]["content"]
            return {
                "calls": [("note", {"text": text}), ("charge", {"amount": 1})],
                "gate": released,
            }
        return {"text": "Noted and charged."}

    wire.rule = one_turn
    env = tools_env(tmp_path)
    tag = uuid.uuid4().hex[:6]
    queued = tether(
        *("run", "--queue", "--tasks", "-", "--run-id", f"q-{tag}", "--approve", "auto"),
        *("--store", postgres, "--base-url", wire.url),
        *("--tools-from", str(FIXTURES / "durable_tools.py")),
        stdin="".join(f"job {i}\n" for i in range(runs)),
        env=env,
    )
    assert queued.returncode == 0, queued.stderr
    ids = queued.stdout.split()
    assert ids == [f"q-{tag}-{n}" for n in range(1, runs + 1)]

    def worker(name: str) -> subprocess.Popen[str]:
        return warm.Popen(
            [
                *(*TETHER, "worker", "--store", postgres, "--executor-id", f"{name}-{tag}"),
                *("--tools-from", str(FIXTURES / "durable_tools.py"), "--allow-base-url", wire.url),
                *("--beat", "0.5", "--dead-after", "3", "--concurrency", "20"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )

    def listed(*extra: str) -> list[dict[str, Any]]:
        p = tether("runs", "--store", postgres, "--json", *extra, env=env)
        assert p.returncode == 0, p.stderr
        return [json.loads(line) for line in p.stdout.splitlines()]

    a = worker("a")
    try:
        with store_runs(postgres) as stored:  # the waits read the store in this process

            def held_by_a() -> list[str]:
                return [i for i, r in stored("running").items() if r["worker"] == f"a-{tag}"]

            lost = wait_until(held_by_a, "a to take runs", 60, 0.1)
            b = worker("b")
            try:
                a.send_signal(signal.SIGKILL)  # in the middle of the runs it holds
                a.wait()
                released.set()
                wait_until(lambda: not stored("queued", "running"), "every run to end", 120, 0.2)
            finally:
                released.set()
                b.kill()
                b.wait()
    finally:
        a.kill()
        a.wait()
    rows = {r["id"]: r for r in listed()}  # what a user sees
    assert {i: rows[i]["state"] for i in ids} == dict.fromkeys(ids, "done")
    assert all(rows[i]["answer"] == "Noted and charged." for i in ids)
    assert all(rows[i]["executor"] == f"b-{tag}" for i in lost)  # b finished what a held
    notes = (tmp_path / "notes").read_text().splitlines()
    assert sorted(n.split(" ", 1)[1] for n in notes) == sorted(f"job {i}" for i in range(runs))
    assert len({n.split()[0] for n in notes}) == runs  # each note once
    charges = [c.split()[0] for c in (tmp_path / "charges").read_text().splitlines()]
    assert len(set(charges)) == len(charges) <= runs  # never twice
    assert len(wire.requests) <= 2 * runs + len(lost)  # only interrupted replies asked again


def test_a_worker_keeps_to_its_store_connections_under_load(
    wire: WireServer, tmp_path: Path, postgres: str
) -> None:
    """Many runs at once on a worker given 2 connections: every run ends done, and the store
    never sees more connections from it than its pools allow (DBOS's and the ledger's, 2
    each, DBOS's own few). Unbounded, DBOS's threads reached for 20 at once and, at 1,000
    runs, waited past its pool's time-out and stalled every run."""
    runs, bound = 60, 2

    def one_turn(body: dict[str, Any]) -> dict[str, Any]:
        if tool_results(body) == 0:
            return {"calls": [("note", {"text": body["messages"][1]["content"]})] * 3}
        return {"text": "Noted."}

    wire.rule = one_turn
    env = tools_env(tmp_path)
    queued = tether(
        *("run", "--queue", "--tasks", "-", "--approve", "auto", "--store", postgres),
        *("--base-url", wire.url, "--tools-from", str(FIXTURES / "durable_tools.py")),
        stdin="".join(f"job {i}\n" for i in range(runs)),
        env=env,
    )
    assert queued.returncode == 0, queued.stderr
    peak, sampling = [0], threading.Event()

    def sample() -> None:  # connections to this test's database, but the sampler's own
        import psycopg

        with psycopg.connect(postgres, autocommit=True) as conn:
            while not sampling.is_set():
                row = conn.execute(
                    "SELECT count(*) - 1 FROM pg_stat_activity WHERE datname = current_database()"
                ).fetchone()
                peak[0] = max(peak[0], int(row[0]) if row else 0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    worker = warm.Popen(
        [
            *(*TETHER, "worker", "--store", postgres, "--allow-base-url", wire.url),
            *("--tools-from", str(FIXTURES / "durable_tools.py")),
            *("--store-connections", str(bound), "--concurrency", str(runs)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:

        def ended() -> bool:
            p = tether("runs", "--store", postgres, "--json", "--state", "done", env=env)
            return len(p.stdout.splitlines()) == runs

        wait_until(ended, "every run to end done", 120, 0.5)
    finally:
        sampling.set()
        worker.kill()
        worker.wait()
    sampler.join()
    listener, dbos_own = 1, 2  # DBOS's notification listener and its own small pool
    assert bound <= peak[0] <= 2 * bound + listener + dbos_own + 1, peak  # + 1: `tether runs`


def test_a_message_sent_while_the_run_is_down_is_delivered(
    wire: WireServer, tmp_path: Path
) -> None:
    store = f"sqlite:///{tmp_path}/runs.sqlite"
    wire.add(calls=[("note", {"text": "first"})], delay=0.5).add(text="Saw your note.")
    env = tools_env(tmp_path)
    kill_at(
        env,
        "tool_call",
        "run",
        "take a note",
        "--base-url",
        wire.url,
        "--store",
        store,
        "--run-id",
        "msg-1",
        "--tools-from",
        str(FIXTURES / "durable_tools.py"),
    )
    sent = tether("send", "msg-1", "and add milk", "--store", store, env=env)
    assert sent.returncode == 0, sent.stderr
    resumed = tether("resume", "msg-1", "--store", store, "--json", env=env)
    assert resumed.returncode == 0, resumed.stderr
    last = wire.requests[-1]["messages"]
    assert last[-1] == {"role": "user", "content": "and add milk"}
    assert [m["role"] for m in last[1:]] == ["user", "assistant", "tool", "user"]


def test_a_durable_run_keeps_the_json_event_contract(wire: WireServer, tmp_path: Path) -> None:
    wire.add(text="Working.", calls=[("note", {"text": "x"})]).add(text="Done.")
    env = cli_env(
        OPENAI_API_KEY="sk-durable",
        NOTES_FILE=str(tmp_path / "notes"),
        CHARGES_FILE=str(tmp_path / "charges"),
    )
    p = warm.run(
        [
            *TETHER,
            "run",
            "note it",
            "--base-url",
            wire.url,
            "--store",
            f"sqlite:///{tmp_path}/runs.sqlite",
            "--json",
            "--tools-from",
            str(FIXTURES / "durable_tools.py"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    events = [json.loads(line) for line in p.stdout.splitlines()]
    assert [e["seq"] for e in events] == list(range(len(events)))
    types = [e["type"] for e in events]
    assert types[0] == "run_started" and types[-1] == "run_finished"
    assert types.count("model_response") == 2 and types.count("tool_result") == 1
    assert events[-1]["outcome"] == "done" and events[-1]["answer"] == "Done."


def test_a_durable_run_at_a_terminal_asks_inline(wire: WireServer, tmp_path: Path) -> None:
    """At a terminal, `tether run --store` asks as an in-memory run does; the answer travels to
    the run as its durable message."""
    import pty

    store = f"sqlite:///{tmp_path}/runs.sqlite"
    wire.add(calls=[("bash", {"command": "echo yes > proof.txt"})]).add(text="Made it.")
    env = cli_env(OPENAI_API_KEY="sk-durable")
    leader, follower = pty.openpty()
    proc = warm.Popen(
        [
            *TETHER,
            *("run", "make proof", "--base-url", wire.url, "--tools", "bash", "--json"),
            *("--store", store, "--workspace", str(tmp_path)),
        ],
        stdin=follower,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    os.close(follower)
    assert proc.stdout is not None
    errors = Output(proc.stderr)
    try:
        errors.wait_for("? allow bash(")  # the question is on the terminal
        os.write(leader, b"y\n")
        out = proc.stdout.read()
        proc.wait(60)
        err = errors.text()
    finally:
        proc.kill()
        os.close(leader)
    assert proc.returncode == 0, err
    assert "? allow bash(" in err
    events = [json.loads(line) for line in out.splitlines()]
    decided = next(e for e in events if e["type"] == "tool_result")
    assert decided["is_error"] is False
    assert events[-1]["answer"] == "Made it."
    assert (tmp_path / "proof.txt").read_text() == "yes\n"


def test_a_long_durable_run_fits_a_small_window_and_shows_it(
    wire: WireServer, tmp_path: Path
) -> None:
    """Context-window management in a durable run: old outputs trimmed, older turns summarised
    (a recorded step), and both visible in the events and in `tether show` from the store."""
    from tether.context import SUMMARY_MARK, SUMMARY_PROMPT

    def pages(body: dict[str, Any]) -> int:
        texts = [m.get("content") or "" for m in body["messages"]]
        summary = next((t for t in texts if t.startswith(SUMMARY_MARK)), "")
        earlier = int(summary.split("up to ")[1].rstrip(".")) + 1 if summary else 0
        return earlier + sum(m["role"] == "tool" for m in body["messages"])

    def reader(body: dict[str, Any]) -> dict[str, Any]:
        if body["messages"][-1].get("content") == SUMMARY_PROMPT:
            return {"text": f"Read up to {pages(body) - 1}."}
        if pages(body) < 10:
            return {"calls": [("dump", {"page": pages(body)})]}
        return {"text": "I read all ten pages."}

    wire.rule = reader
    store = f"sqlite:///{tmp_path}/runs.sqlite"
    env = cli_env(OPENAI_API_KEY="sk-durable")
    run = tether(
        *("run", "Read the pages.", "--base-url", wire.url, "--json", "--no-stream"),
        *("--store", store, "--run-id", "ctx-1", "--context-window", "2000"),
        *("--tools-from", str(FIXTURES / "durable_tools.py"), "--tools", "none"),
        env=env,
    )
    assert run.returncode == 0, run.stderr
    live = [json.loads(line) for line in run.stdout.splitlines()]
    assert live[-1]["answer"] == "I read all ten pages."
    types = [e["type"] for e in live]
    assert "context_trimmed" in types and "context_summarized" in types
    largest = max(len(orjson.dumps(r["messages"])) for r in wire.requests)
    assert largest < 2000 * 4  # no request outgrew the window (about four characters a token)
    shown = tether("show", "ctx-1", "--store", store, "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    kept = [json.loads(line)["type"] for line in shown.stdout.splitlines()]
    assert "context_summarized" in kept and kept[-1] == "run_finished"


def test_a_worker_that_starts_takes_over_a_run_whose_process_died(
    wire: WireServer, tmp_path: Path
) -> None:
    store = f"sqlite:///{tmp_path}/runs.sqlite"

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        """By what the request carries, so the request the kill interrupted (it may have
        reached the server first) gets the same reply when the worker asks again."""
        if tool_results(body) == 0:
            return {"calls": [("note", {"text": "first"})], "delay": 0.5}
        return {"text": "Noted."}

    wire.rule = reply
    env = tools_env(tmp_path)
    kill_at(
        env,
        "model_request",
        *("run", "take a note", "--base-url", wire.url, "--store", store),
        *("--run-id", "orphan-1", "--tools-from", str(FIXTURES / "durable_tools.py")),
    )
    worker = warm.Popen(
        [
            *TETHER,
            "worker",
            "--store",
            store,
            "--beat",
            "0.5",
            "--allow-base-url",
            wire.url,
            "--tools-from",
            str(FIXTURES / "durable_tools.py"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )

    try:
        with store_runs(store) as runs:
            finished = lambda: runs().get("orphan-1", {}).get("status") == "SUCCESS"  # noqa: E731
            wait_until(finished, "the worker to finish orphan-1", 60, 0.2)
    finally:
        worker.terminate()
        _, err = worker.communicate(timeout=10)
    assert "took over 1 runs whose process died: orphan-1" in err
    assert (tmp_path / "notes").read_text().count("first") == 1


def test_resume_refuses_a_run_whose_process_still_runs_it(wire: WireServer, tmp_path: Path) -> None:
    """Two processes must never execute one run: resume takes over only the runs of the dead."""
    store = f"sqlite:///{tmp_path}/runs.sqlite"
    held = threading.Event()  # the model answers once resume has been refused
    wire.add(calls=[("note", {"text": "slow"})], gate=held).add(text="Noted.")
    env = tools_env(tmp_path)
    running = warm.Popen(
        [
            *TETHER,
            *("run", "take a note", "--base-url", wire.url, "--store", store, "--json"),
            *("--run-id", "alive-1", "--tools-from", str(FIXTURES / "durable_tools.py")),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert running.stdout is not None
    for line in running.stdout:
        if json.loads(line)["type"] == "model_request":
            break
    refused = tether("resume", "alive-1", "--store", store, env=env)
    held.set()
    assert refused.returncode == 2 and "is being executed by cli-" in refused.stderr
    out, _ = running.communicate(timeout=60)
    assert running.returncode == 0
    assert json.loads(out.splitlines()[-1])["answer"] == "Noted."
    assert (tmp_path / "notes").read_text().count("slow") == 1


def test_an_approval_applies_only_to_a_waiting_request_for_its_arguments(
    wire: WireServer, tmp_path: Path
) -> None:
    store = f"sqlite:///{tmp_path}/runs.sqlite"
    wire.add(calls=[("bash", {"command": "echo ok > proof.txt"})]).add(text="Done.")
    env = cli_env(OPENAI_API_KEY="sk-durable")
    request = kill_at(
        env,
        "approval_requested",
        *("run", "make proof", "--base-url", wire.url, "--tools", "bash"),
        *("--store", store, "--run-id", "appr-2", "--workspace", str(tmp_path)),
    )
    approval = request["approval_id"]

    def approve(*extra: str) -> subprocess.CompletedProcess[str]:
        return tether("approve", "appr-2", *extra, "--store", store, env=env)

    early = approve("ap_not_asked_yet")  # a call the model has not asked for (yet)
    assert early.returncode == 2 and "not waiting" in early.stderr, early.stderr
    other = approve(approval, "--args-hash", "0" * 64)
    assert other.returncode == 2 and "other arguments" in other.stderr, other.stderr
    unknown = tether("approve", "no-such-run", approval, "--store", store, env=env)
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr
    assert not (tmp_path / "proof.txt").exists()
    right = approve(approval, "--args-hash", request["args_hash"])
    assert right.returncode == 0, right.stderr
    resumed = tether("resume", "appr-2", "--store", store, "--json", env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert (tmp_path / "proof.txt").read_text() == "ok\n"
    again = approve(approval)  # decided, and the run has ended
    assert again.returncode == 2 and "ended" in again.stderr


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new store of each kind."""
    if request.param == "postgres":
        return str(request.getfixturevalue("postgres"))
    return f"sqlite:///{tmp_path}/runs.sqlite"


def test_a_kill_while_one_call_has_finished_and_its_siblings_run(
    wire: WireServer, tmp_path: Path, store: str
) -> None:
    """Killed at a chosen point, not a drawn one: one call of a reply has finished, two others
    are running. On resume the finished call is not made again, the interrupted idempotent
    call runs again (its effect once), the interrupted non-idempotent one reaches the model
    as "outcome unknown" and is never made twice, and the model is not asked again."""
    calls = [
        ("charge", {"amount": 1}, "c-fast"),
        ("slow_note", {"text": "slow"}, "c-note"),
        ("slow_charge", {"amount": 2}, "c-slow"),
    ]
    wire.add(calls=calls).add(text="All three are back.")
    env = {**tools_env(tmp_path), "SLOW_SECONDS": "30"}  # they are running at the kill
    first = kill_at(
        env,
        "tool_result",
        *("run", "pay and note", "--base-url", wire.url, "--store", store, "--run-id", "pick-1"),
        *("--tools-from", str(FIXTURES / "durable_tools.py"), "--approve", "auto"),
    )
    assert first["name"] == "charge"
    env["SLOW_SECONDS"] = "0"
    resumed = tether("resume", "pick-1", "--store", store, "--json", env=env)
    assert resumed.returncode == 0, resumed.stderr
    events = json_lines(resumed.stdout)
    assert events[-1]["answer"] == "All three are back."
    results = {e["id"]: e["output"] for e in events if e["type"] == "tool_result"}
    assert "Outcome unknown" in results["c-slow"]
    charges = (tmp_path / "charges").read_text().splitlines()
    assert [c.split()[1] for c in charges] == ["1"]  # the fast charge once, the slow one never
    notes = (tmp_path / "notes").read_text().splitlines()
    assert [n.split(" ", 1)[1] for n in notes] == ["slow"]  # run again, written once
    assert len(wire.requests) == 2  # the first reply was not asked for again


def test_a_call_whose_result_was_shown_is_not_made_again_after_a_kill(
    wire: WireServer, tmp_path: Path, store: str
) -> None:
    """A reply of one call: its result is journaled with the step's record, not before it, and
    its `tool_result` event comes once that has committed. Killed at that event, the resumed run
    takes the recorded result: the payment made once, not "outcome unknown", and the reply that
    asked for it not asked for again (the next may have been on its way at the kill: asked
    again, as any reply the kill interrupts)."""
    wire.add(calls=[("charge", {"amount": 5}, "c-pay")]).add(text="Paid.").add(text="Paid.")
    env = tools_env(tmp_path)
    shown = kill_at(
        env,
        "tool_result",
        *("run", "pay", "--base-url", wire.url, "--store", store, "--run-id", "paid-1"),
        *("--tools-from", str(FIXTURES / "durable_tools.py"), "--approve", "auto"),
    )
    assert shown["output"] == "charged 5"
    resumed = tether("resume", "paid-1", "--store", store, "--json", env=env)
    assert resumed.returncode == 0, resumed.stderr
    events = json_lines(resumed.stdout)
    assert events[-1]["answer"] == "Paid."
    charges = (tmp_path / "charges").read_text().splitlines()
    assert [c.split()[1] for c in charges] == ["5"]
    first, *after = wire.requests
    assert after and all(r["messages"][-1]["content"] == "charged 5" for r in after)
    assert not any(m["role"] == "tool" for m in first["messages"])


def test_a_kill_inside_a_model_stream_asks_for_that_reply_again(
    wire: WireServer, tmp_path: Path, store: str
) -> None:
    """Killed while the reply streams in: nothing of it was recorded, so the resumed run asks
    for it again (once), and the answer is the whole reply."""
    text = "a reply that streams in slowly, word by word"
    wire.add(text=text, deltas=8, chunk_delay=0.5).add(text=text)
    env = tools_env(tmp_path)
    kill_at(
        env,
        "text_delta",
        *("run", "talk", "--base-url", wire.url, "--store", store, "--run-id", "stream-1"),
    )
    resumed = tether("resume", "stream-1", "--store", store, "--json", env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert json_lines(resumed.stdout)[-1]["answer"] == text
    assert len(wire.requests) == 2


def test_the_idempotency_key_names_the_run_and_the_call(wire: WireServer, tmp_path: Path) -> None:
    """Two runs whose servers gave their calls the same id get different keys: the key is
    run id and call id, so a payment service never takes one run's charge for another's."""
    env = tools_env(tmp_path)
    store = f"sqlite:///{tmp_path}/runs.sqlite"
    for run_id in ("pay-a", "pay-b"):
        wire.add(calls=[("charge", {"amount": 5}, "call_same")]).add(text="Paid.")
        p = tether(
            *("run", "pay", "--base-url", wire.url, "--store", store, "--run-id", run_id),
            *("--tools-from", str(FIXTURES / "durable_tools.py"), "--approve", "auto"),
            env=env,
        )
        assert p.returncode == 0, p.stderr
    keys = [line.split()[0] for line in (tmp_path / "charges").read_text().splitlines()]
    assert keys == ["pay-a:call_same", "pay-b:call_same"]


def test_one_run_s_recorded_call_is_never_taken_for_another_s(
    wire: WireServer, tmp_path: Path, store: str
) -> None:
    """Calls are journaled by run and call id: a server may give two runs' calls the same id.
    Run B is killed while its charge runs; run A then makes and finishes a call of the same
    id (journaled on its own: a slower call of the same reply is still running; the last call
    of a step is recorded by the step). Resumed, B must see its own call as interrupted
    (outcome unknown), not A's result."""
    started = tmp_path / "started"
    env = {**tools_env(tmp_path), "SLOW_SECONDS": "30", "STARTED_FILE": str(started)}
    wire.add(calls=[("slow_charge", {"amount": 2}, "call_same")])
    tools = ("--tools-from", str(FIXTURES / "durable_tools.py"), "--approve", "auto")
    b = warm.Popen(
        [*TETHER, "run", "pay b", "--base-url", wire.url, "--store", store, "--run-id", "run-b",
         *tools],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    try:
        wait_until(started.exists, "run b's charge to begin", 30)
    finally:
        b.kill()
        b.wait()
    env["SLOW_SECONDS"] = "1"
    calls = [("charge", {"amount": 1}, "call_same"), ("slow_note", {"text": "a"}, "call_a")]
    wire.add(calls=calls).add(text="A paid.")
    wire.add(text="B is back.")
    a = tether("run", "pay a", "--base-url", wire.url, "--store", store, "--run-id", "run-a",
               *tools, env=env)  # fmt: skip
    assert a.returncode == 0, a.stderr
    env["SLOW_SECONDS"] = "0"
    resumed = tether("resume", "run-b", "--store", store, "--json", env=env)
    assert resumed.returncode == 0, resumed.stderr
    results = [e["output"] for e in json_lines(resumed.stdout) if e["type"] == "tool_result"]
    assert len(results) == 1 and "Outcome unknown" in results[0], results
    assert "charged 1" not in results[0]
    keys = [line.split()[0] for line in (tmp_path / "charges").read_text().splitlines()]
    assert keys == ["run-a:call_same"]  # b's charge never made (killed before it), nor again


class Planted:
    """A pickle that, unpickled, creates a marker file: what a row rewritten by someone with
    write access to the store would hold."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def test_a_step_rewritten_with_a_pickle_is_refused_and_never_run(tmp_path: Path) -> None:
    """Records are data: a store row rewritten with a malicious pickle is refused on read with
    one line, and no code runs (the marker file is never made), in `show`, in `resume` and on
    the page."""
    import pickle
    import sqlite3

    from helpers import Output

    path = tmp_path / "runs.sqlite"
    script = tmp_path / "bash.json"
    call = {"name": "bash", "arguments": {"command": "echo approved > proof.txt"}}
    script.write_text(json.dumps([{"tool_calls": [call]}, {"text": "Done."}]))
    argv = [*TETHER, "run", "x", "--tools", "bash", "--provider", "scripted", "--script"]
    argv += [str(script), "--workspace", str(tmp_path), "--store", str(path), "--run-id", "p1"]
    proc = warm.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=cli_env(), text=True,
    )  # fmt: skip
    Output(proc.stderr).wait_for("waits for approval")  # its first step (the reply) recorded
    proc.kill()
    proc.wait(30)
    shown = tether("show", "p1", "--store", str(path))
    assert shown.returncode == 0 and "bash" in shown.stdout  # a record Tether wrote reads
    marker = tmp_path / "pwned"
    with sqlite3.connect(f"{path}-effects") as db:  # Tether's tables, beside DBOS's
        changed = db.execute(
            "UPDATE tether_steps SET output = ? WHERE run_id = 'p1'",
            (pickle.dumps(Planted(marker)),),
        ).rowcount
    assert changed >= 1
    for refused in (
        tether("show", "p1", "--store", str(path)),
        tether("resume", "p1", "--store", str(path)),
    ):
        assert refused.returncode != 0
        assert "not in Tether's record format" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
    assert not marker.exists()
    page = warm.Popen(
        [*TETHER, "serve", "--port", "0", "--token", "t0ken", "--store", str(path),
         "--provider", "scripted", "--script", str(script), "--workspace", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=cli_env(), text=True,
    )  # fmt: skip
    try:
        url = Output(page.stderr).wait_for("open http://").split("open ", 1)[1].split("/?")[0]
        bearer = {"Authorization": "Bearer t0ken"}
        with urllib.request.urlopen(urllib.request.Request(url + "/api/runs", headers=bearer)) as r:
            (listed,) = json.loads(r.read())  # the server tried to resume it, and could not
        assert listed["id"] == "p1" and listed["status"] == "failed"
        with pytest.raises(urllib.error.HTTPError) as refused_by_page:
            urllib.request.urlopen(urllib.request.Request(url + "/api/runs/p1", headers=bearer))
        assert refused_by_page.value.code == 422
        error = json.loads(refused_by_page.value.read())["error"]
        assert "not in Tether's record format" in error and "\n" not in error
    finally:
        page.terminate()
        page.wait(30)
    assert not marker.exists()


def test_a_dbos_row_rewritten_as_a_pickle_is_never_unpickled(tmp_path: Path) -> None:
    """What DBOS keeps of a run is data too: its inputs and result are JSON records, and a row
    whose `serialization` column is rewritten to say `py_pickle` (DBOS's own pickle format)
    is not unpickled by `runs`, `show`, `resume` or a worker: no marker file is made."""
    import base64
    import pickle
    import sqlite3

    path = tmp_path / "runs.sqlite"
    examples = Path(__file__).resolve().parent.parent / "examples"
    done = tether(
        "run", "weather?", "--provider", "scripted", "--run-id", "d1", "--store", str(path),
        "--script", str(examples / "weather_script.json"),
        "--tools-from", str(examples / "tools.py"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    marker = tmp_path / "pwned"
    planted = base64.b64encode(pickle.dumps(Planted(marker))).decode()
    with sqlite3.connect(path) as db:
        (inputs,) = db.execute("SELECT inputs FROM workflow_input").fetchone()
        assert inputs.startswith('{"$d":')  # JSON of plain values, not a pickle
        db.execute("UPDATE workflow_status SET serialization = 'py_pickle'")
        db.execute("UPDATE workflow_input SET inputs = ?", (planted,))
        db.execute("UPDATE workflow_output SET output = ?", (planted,))
    for command in (["runs"], ["show", "d1"], ["resume", "d1"], ["runs", "--json"]):
        p = tether(*command, "--store", str(path))
        assert "Traceback" not in p.stderr, p.stderr
    worker = warm.Popen(
        [*TETHER, "worker", "--store", str(path), "--beat", "0.2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=cli_env(), text=True,
    )  # fmt: skip

    def beat_of_worker() -> float | None:
        with sqlite3.connect(f"{path}-effects") as db:
            row = db.execute("SELECT max(last_beat) FROM tether_executors").fetchone()
        return row[0] if row and row[0] else None

    try:  # two beats: a whole round of the worker (its take-overs and recoveries) between
        first = wait_until(beat_of_worker, "the worker's first beat", 30)
        wait_until(lambda: (beat_of_worker() or 0) > first, "the worker's next beat", 30)
    finally:
        worker.kill()
        worker.wait(30)
    assert not marker.exists()
