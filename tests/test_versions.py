"""Rolling deploys and upgrades (`durable/versions.py`): workers execute only the versions they
have, a run whose version no live worker has waits and says so, and an upgrade moves it to
another version, which goes on from its last recorded step with nothing repeated."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import warm
from helpers import FIXTURES, TETHER, cli_env, store_runs, tether, wait_until
from tether.durable.formats import RunRecord
from tether.durable.ledger import Ledger
from tether.durable.versions import QUEUE, Serving, queue_for, version_in, wanted
from wire_server import WireServer, tool_results

SCRIPT = str(FIXTURES / "versioned.py")


def test_a_run_goes_on_under_its_queues_version_else_its_own() -> None:
    mine = RunRecord(agent="mailer", version="1")
    assert queue_for("mailer", "1") == "tether:mailer@1" and queue_for("x", None) == QUEUE
    assert version_in("tether:mail@er@2") == ("mail@er", "2") and version_in(QUEUE) is None
    assert wanted(mine, None) == "1" and wanted(mine, "tether:mailer@1") == "1"
    assert wanted(mine, "tether:mailer@2") == "2"  # upgraded
    assert wanted(mine, "tether:other@2") == "1"  # another agent's queue says nothing of it
    built = RunRecord(agent="cli", version="abc", options={"model": "m"})
    assert wanted(built, None) is None  # any worker builds it again from its options
    serving = Serving({"mailer": "2"}, rebuilds=False)
    assert not serving.takes(mine) and serving.takes(mine, "tether:mailer@2")
    assert not serving.takes(built) and Serving({}, rebuilds=True).takes(built)
    assert serving.queues() == [QUEUE, "tether:mailer@2"]
    assert serving.said() == "agents mailer@2"


def mailer_rule(body: dict[str, Any]) -> dict[str, Any]:
    """A run's task is its id: an `idle` one answers (and idles, being permanent); the others
    send one mail, then say it is sent."""
    task = next(m["content"] for m in body["messages"] if m["role"] == "user")
    if task.startswith("idle") or tool_results(body):
        return {"text": "Sent." if tool_results(body) else "At your service."}
    return {"calls": [("send_mail", {"to": task})]}


def asked_by(wire: WireServer) -> dict[str, int]:
    """Requests at the mock, by the run that asked (its task is its id)."""
    counts: dict[str, int] = {}
    for body in wire.requests:
        task = next(m["content"] for m in body["messages"] if m["role"] == "user")
        counts[task] = counts.get(task, 0) + 1
    return counts


def test_two_versions_on_postgres_then_an_upgrade_repeats_nothing(
    wire: WireServer, tmp_path: Path, postgres: str
) -> None:
    """A v1 worker holds runs waiting for approval and an idle permanent run; a v2 worker
    starts and takes the v2 runs only (a v1 run queued after it goes to v1); the v1 worker
    finishes what is approved; killed, its runs wait for version 1 (`tether runs` says so);
    `tether upgrade` moves one to v2, which goes on from its last step: nothing it completed
    is asked of the model again and no mail is sent twice. Bad upgrades change nothing."""
    wire.rule = mailer_rule
    tag = uuid.uuid4().hex[:6]
    sent = tmp_path / "sent"
    env = cli_env(SENT_FILE=str(sent), OPENAI_API_KEY="sk-test")

    def worker(version: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, SCRIPT, "work", version, postgres, f"v{version}-{tag}", wire.url],
            stdout=subprocess.DEVNULL,
            stderr=(tmp_path / f"v{version}.log").open("w"),
            env=env,
            text=True,
        )

    def queue(version: str, *runs: str) -> None:
        done = subprocess.run(
            [sys.executable, SCRIPT, "queue", version, postgres, wire.url, *runs],
            env=env,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr

    def store(*args: str) -> subprocess.CompletedProcess[str]:
        return tether(*args, "--store", postgres, env=env)

    v1, v2 = worker("1"), None
    try:
        with store_runs(postgres) as stored:

            def state(run_id: str) -> dict[str, Any]:
                return stored()[run_id]

            queue("1", "a1", "a2", "idle1:permanent")
            wait_until(
                lambda: (
                    all(state(r)["state"] == "waiting" for r in ("a1", "a2"))
                    and asked_by(wire).get("idle1") == 1
                ),
                "the v1 runs to wait for approval and to idle",
                60,
                0.1,
            )
            v2 = worker("2")
            queue("2", "b1")
            queue("1", "a3")  # a v1 run queued while both work: v1 takes it
            for run_id, version in (("b1", "2"), ("a3", "1")):
                wait_until(lambda r=run_id: state(r)["state"] == "waiting", f"{run_id} waits", 60)
                assert state(run_id)["worker"] == f"v{version}-{tag}"
            running = store("upgrade", "a3", "--to", "2")  # its worker is alive: not moved
            assert running.returncode == 2 and f"is running on v1-{tag}" in running.stderr
            for run_id in ("a1", "b1", "a3"):
                (approval,) = state(run_id)["approvals"]
                assert store("approve", run_id, approval).returncode == 0
            wait_until(
                lambda: all(state(r)["state"] == "done" for r in ("a1", "b1", "a3")), "done", 60
            )
            assert {r: state(r)["executor"] for r in ("a1", "b1", "a3")} == {
                "a1": f"v1-{tag}",
                "b1": f"v2-{tag}",
                "a3": f"v1-{tag}",
            }

            v1.send_signal(signal.SIGKILL)
            v1.wait()
            shown = wait_until(
                lambda: (out := store("runs").stdout).count("waiting for version 1") == 2 and out,
                "the v1 runs to wait for version 1",
                60,
                0.2,
            )
            assert all(
                "waiting for version 1" in line
                for line in shown.splitlines()
                if line.startswith(("a2\t", "idle1\t"))
            )
            asked = dict(asked_by(wire))

            for bad, said in [
                (("a1",), "run a1 has ended (success): fork it instead"),
                (("a2", "--to", "7"), "no live worker executes version 7 of agent mailer"),
                (("a2", "--to", "1"), "run a2 is of version 1 already"),
                (("nobody",), "no run nobody in the store"),
            ]:
                refused = store("upgrade", *bad)
                assert (refused.returncode, refused.stderr.count("\n")) == (2, 1), refused.stderr
                assert said in refused.stderr
            assert "waiting for version 1" in runs_of(store, "a2")  # nothing changed

            moved = store("upgrade", "a2")
            assert moved.returncode == 0, moved.stderr
            assert "run a2 goes on under version 2 (was 1)" in moved.stdout
            wait_until(lambda: state("a2")["state"] == "waiting", "a2 to wait on v2", 60, 0.1)
            assert state("a2")["worker"] == f"v2-{tag}" and state("a2")["version"] == "2"
            (approval,) = state("a2")["approvals"]
            assert store("approve", "a2", approval).returncode == 0
            ended = ("done", "failed", "halted", "cancelled")
            wait_until(lambda: state("a2")["state"] in ended, "a2 to end on v2", 60, 0.1)
            assert state("a2")["state"] == "done", state("a2")

            assert store("upgrade", "idle1", "--to", "2").returncode == 0
            wait_until(lambda: state("idle1")["worker"] == f"v2-{tag}", "idle1 on v2", 60, 0.1)
            assert store("send", "idle1", "still there?").returncode == 0
            wait_until(lambda: asked_by(wire).get("idle1") == 2, "idle1's next answer", 60)
    finally:
        for w in (v1, v2):
            if w is not None:
                w.kill()
                w.wait()
    after = asked_by(wire)
    assert after["a2"] == asked["a2"] + 1  # the reply after its mail: its first call not again
    assert after["idle1"] == asked["idle1"] + 1  # the new message only
    mails = sent.read_text().splitlines()
    assert sorted(mails) == sorted(f"{r} {r}" for r in ("a1", "a2", "a3", "b1"))  # once each
    listed = {r["id"]: r for r in map(json.loads, store("runs", "--json").stdout.splitlines())}
    assert (listed["a2"]["version"], listed["a2"]["upgraded_from"]) == ("2", "1")
    events = [json.loads(line) for line in store("show", "a2", "--json").stdout.splitlines()]
    types = [e["type"] for e in events]
    assert types == [
        *("run_started", "model_response", "tool_call", "approval_requested"),
        "upgraded",  # after what v1 recorded, before what v2 did
        *("approval_decided", "tool_result", "model_response", "run_finished"),
    ], types
    assert (events[4]["from"], events[4]["to"]) == ("1", "2")
    assert "[upgraded from version 1 to 2]" in store("show", "a2").stdout
    assert (listed["a1"]["version"], listed["a1"]["upgraded_from"]) == ("1", None)


def runs_of(store: Any, run_id: str) -> str:
    return next(
        (line for line in store("runs").stdout.splitlines() if line.startswith(run_id + "\t")), ""
    )


@pytest.mark.parametrize("bad", ["memory"])
def test_an_upgrade_needs_a_store(bad: str) -> None:
    import asyncio

    from tether import ConfigError, Runtime

    async def go() -> None:
        async with Runtime(bad) as rt:
            with pytest.raises(ConfigError, match="an upgrade needs a store"):
                await rt.upgrade("r1")

    asyncio.run(go())


# -- a kill during an upgrade or a fork ----------------------------------------------------------

KILL_AFTER = (0.0, 0.3, 0.8, 1.5, 3.0, 8.0)
"""Seconds after which a command is killed: at once (before it opens the store, whatever the
machine's speed: a warm `tether` upgraded a run within 0.05 s once), as it writes, after."""


def killed(args: list[str], env: dict[str, str], after: float) -> None:
    """Run `tether ARGS` and SIGKILL it `after` seconds in (if it has not ended by then)."""
    p = warm.Popen([*TETHER, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        p.wait(after)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGKILL)
        p.wait()


def test_a_kill_during_an_upgrade_leaves_the_old_version_or_the_new(
    wire: WireServer, tmp_path: Path
) -> None:
    """`tether upgrade` killed at moments from before it opens the store to after: each time
    the run is on version 1's queue, untouched, or on version 2's, taken by its worker and
    done; never between (the move is one update)."""
    store = f"sqlite:///{tmp_path / 'runs.sqlite'}"
    env = cli_env(SENT_FILE=str(tmp_path / "sent"), OPENAI_API_KEY="sk-test")
    wire.rule = lambda body: {"text": "At your service."}
    seen = set()
    ids = [f"idle-{i}" for i in range(len(KILL_AFTER))]
    queued = [sys.executable, SCRIPT, "queue", "1", store, wire.url, *ids]
    assert (
        subprocess.run(queued, env=env, check=False).returncode == 0
    )  # before: it makes the store
    v2 = subprocess.Popen(
        [sys.executable, SCRIPT, "work", "2", store, "v2", wire.url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        ledger = Ledger(store, connections=1)
        wait_until(lambda: "mailer@2" in str(ledger.served()), "the v2 worker", 60, 0.1)
        with store_runs(store) as stored:
            for run_id, after in zip(ids, KILL_AFTER, strict=True):
                wait_until(lambda r=run_id: stored()[r].get("waiting_for_version"), "waiting")
                killed(["upgrade", run_id, "--store", store], env, after)
                row = stored()[run_id]
                if row["version"] == "1":  # the old state: it still waits for version 1
                    assert row["state"] == "queued" and row["waiting_for_version"] == "1", row
                    seen.add("old")
                    continue
                wait_until(lambda r=run_id: stored()[r]["state"] == "done", "done on v2", 30)
                assert stored()[run_id]["upgraded_from"] == "1"
                seen.add("new")
    finally:
        v2.kill()
        v2.wait()
    assert seen == {"old", "new"}  # the kills fell on both sides of the update


def test_a_kill_during_a_fork_leaves_no_fork_or_a_whole_one(
    wire: WireServer, tmp_path: Path
) -> None:
    """`tether fork` killed at moments from before it opens the store to after: each time the
    fork is absent, or there with its whole prefix, and resumed to its end it runs nothing of
    the prefix again (the original's note is written once) and asks the model its new turn
    only. The original is untouched."""
    store = f"sqlite:///{tmp_path / 'runs.sqlite'}"
    notes = tmp_path / "notes"
    env = cli_env(NOTES_FILE=str(notes), OPENAI_API_KEY="sk-test")

    def two_turns(body: dict[str, Any]) -> dict[str, Any]:
        return {"text": "Noted."} if tool_results(body) else {"calls": [("note", {"text": "x"})]}

    wire.rule = two_turns
    tools = ("--tools-from", str(FIXTURES / "durable_tools.py"))
    where = ("--store", store, "--base-url", wire.url, "--model", "m", *tools)
    assert tether("run", "note it", "--run-id", "orig", *where, env=env).returncode == 0
    asked_before, seen = len(wire.requests), set()
    for i, after in enumerate(KILL_AFTER):
        fork_id = f"fork-{i}"
        fork = ["fork", "orig", "--at", "1", "--run-id", fork_id, "--message", "again"]
        killed([*fork, "--store", store], env, after)
        listed = runs_json(store, env)
        if fork_id not in listed:
            seen.add("none")
            continue
        seen.add("whole")
        if listed[fork_id]["state"] != "done":
            resumed = tether("resume", fork_id, "--store", store, env=env)
            assert resumed.returncode == 0, resumed.stderr
    assert seen == {"none", "whole"}
    assert notes.read_text().count(" x\n") == 1  # the prefix's tool ran once, in the original
    forks = wire.requests[asked_before:]
    assert forks and all(tool_results(b) == 1 for b in forks)  # each begins after the prefix
    orig = runs_json(store, env)["orig"]
    assert (orig["state"], orig["steps"]) == ("done", 2)


def runs_json(store: str, env: dict[str, str]) -> dict[str, dict[str, Any]]:
    listed = tether("runs", "--json", "--store", store, env=env).stdout.splitlines()
    return {r["id"]: r for r in map(json.loads, listed)}


def test_a_run_queued_for_any_worker_waits_for_its_own_version(
    wire: WireServer, tmp_path: Path
) -> None:
    """A run of version 1 on the queue every worker takes (as Tether queued every run before
    workers had versions): a version-2 worker takes it, asks the model nothing, and puts it
    back on version 1's queue, where it waits (`tether runs` says so); a version-1 worker
    then finishes it."""
    sys.path.insert(0, str(FIXTURES))
    from versioned import mailer  # type: ignore[import-not-found]

    from tether import RunContext
    from tether.durable.formats import WORKFLOW_VERSION
    from tether.durable.run import record_of
    from tether.durable.view import WORKFLOW, client

    store = f"sqlite:///{tmp_path / 'runs.sqlite'}"
    env = cli_env(SENT_FILE=str(tmp_path / "sent"), OPENAI_API_KEY="sk-test")
    wire.rule = lambda body: {"text": "At your service."}
    reader = client(store, create=True)
    record = record_of(mailer("1", wire.url), None, RunContext(workspace=tmp_path))
    options = {"queue_name": QUEUE, "workflow_name": WORKFLOW, "app_version": WORKFLOW_VERSION}
    reader.enqueue({**options, "workflow_id": "idle-old"}, "idle-old", record.to_dict(), "idle-old")
    reader.destroy()

    def worker(version: str) -> subprocess.Popen[bytes]:
        command = [sys.executable, SCRIPT, "work", version, store, f"v{version}", wire.url]
        return subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
        )

    workers = [worker("2")]
    try:
        with store_runs(store) as stored:
            waits = wait_until(
                lambda: stored()["idle-old"].get("waiting_for_version"), "handed back", 30, 0.1
            )
            assert waits == "1" and wire.requests == []  # not run under version 2
            workers.append(worker("1"))
            wait_until(lambda: stored()["idle-old"]["state"] == "done", "done on v1", 30, 0.1)
            assert stored()["idle-old"]["executor"] == "v1"
    finally:
        for w in workers:
            w.kill()
            w.wait()


def test_a_worker_of_two_agents_keeps_to_its_concurrency(wire: WireServer, tmp_path: Path) -> None:
    """A worker of two agents listens to a queue for each, and DBOS bounds each queue on its
    own: with `concurrency=2` and three runs of each queued, it takes two of each, but runs two
    at once, not four (their model calls held at the mock: two arrive). Let go, all end."""
    store = f"sqlite:///{tmp_path / 'runs.sqlite'}"
    env = cli_env(SENT_FILE=str(tmp_path / "sent"), OPENAI_API_KEY="sk-test")
    held = threading.Event()
    wire.rule = lambda body: {"text": "At your service.", "gate": held}
    ids = [f"idle-m{i}" for i in range(3)] + [f"idle-c{i}" for i in range(3)]
    specs = [f"{i}:clerk" if "-c" in i else i for i in ids]
    queued = [sys.executable, SCRIPT, "queue", "1", store, wire.url, *specs]
    assert subprocess.run(queued, env=env, check=False).returncode == 0
    worker = subprocess.Popen(
        [sys.executable, SCRIPT, "work", "1", store, "w", wire.url, "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        with store_runs(store) as stored:
            taken = lambda: [i for i, r in stored().items() if r["executor"] == "w"]  # noqa: E731
            wait_until(lambda: len(taken()) == 4, "the worker to take two runs of each", 30, 0.05)
            wait_until(lambda: len(wire.requests) >= 2, "two model calls", 30, 0.05)
            time.sleep(1.0)  # time for a third call to arrive, if one could
            assert len(wire.requests) == 2
            held.set()
            wait_until(lambda: all(r["state"] == "done" for r in stored().values()), "done", 60)
    finally:
        held.set()
        worker.kill()
        worker.wait()


def test_an_upgrade_without_a_version_goes_to_the_one_other_served_or_is_refused() -> None:
    """`tether upgrade RUN` with no `--to`: the one other version live workers execute; with
    two others it must not pick one (the person names it), and with none it says to start
    one."""
    from tether import ConfigError
    from tether.durable.remote import upgrade_target

    assert upgrade_target("r", "mailer", "1", ["1", "2"]) == "2"
    assert upgrade_target("r", "mailer", "1", ["2"]) == "2"
    with pytest.raises(ConfigError, match=r"execute versions 2, 3 of agent mailer: name one"):
        upgrade_target("r", "mailer", "1", ["1", "2", "3"])
    with pytest.raises(ConfigError, match="other than 1: start one first"):
        upgrade_target("r", "mailer", "1", ["1"])


def test_a_cli_worker_says_why_it_leaves_a_python_agents_run(tmp_path: Path) -> None:
    """A Python agent's run waits on its version's queue for a worker that registers the
    agent; `tether worker --tools-from app.py` (the obvious guess) builds runs from their
    recorded options only, and said nothing while the run waited for ever. It says, once,
    which agent and version the run waits for and how to start a worker of it."""
    from helpers import Output

    store = f"sqlite:///{tmp_path / 'runs.sqlite'}"
    queued = warm.run(
        [sys.executable, SCRIPT, "queue", "1", store, "http://127.0.0.1:9/v1", "py-1"],
        capture_output=True, text=True, timeout=60, env=cli_env(),
    )  # fmt: skip
    assert queued.returncode == 0, queued.stderr
    worker = warm.Popen(
        [*TETHER, "worker", "--store", store, "--beat", "0.2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=cli_env(), text=True,
    )  # fmt: skip
    try:
        line = Output(worker.stderr).wait_for("run py-1 waits for a worker")
    finally:
        worker.kill()
        worker.wait(30)
    assert "agent mailer version 1" in line and "await rt.work()" in line, line


def test_a_run_record_reads_what_earlier_code_wrote_and_writes_it_back_unchanged() -> None:
    """A store keeps a run's record as a JSON object, and runs recorded before `RunRecord`
    existed must go on: the object the earlier code wrote (a fork of a child run, with an
    image) reads as its fields and is written back key for key; what a record leaves out or
    holds wrongly typed reads as "not said"."""
    from tether.durable.formats import RUN_FORMAT

    kept = {
        "format": 1,
        "agent": "triage",
        "version": "2",
        "options": None,
        "approvals": "auto",
        "restart": {"max_restarts": 2, "within_s": 60.0, "backoff_s": 0.5},
        "workspace": "/srv/work",
        "account_id": "acme",
        "config": {"tenant": "t1"},
        "provider": "openai",
        "model": "gpt-5-mini",
        "parent_run_id": "p1",
        "root_run_id": "r1",
        "forked_from": "orig",
        "at": 3,
        "images": [["image/png", "ab" * 32]],
    }
    record = RunRecord.of(kept)
    assert (record.agent, record.version, record.approvals, record.at) == ("triage", "2", "auto", 3)
    assert record.origin == {"forked_from": "orig", "at": 3}
    assert record.lineage == {"parent_run_id": "p1", "root_run_id": "r1"}
    assert record.images[0].sha256 == "ab" * 32 and record.images[0].data is None
    assert record.to_dict() == kept and record.format == RUN_FORMAT
    # a root run, not a fork, with no images: the keys it never had stay out
    plain = {
        k: v
        for k, v in kept.items()
        if k not in ("parent_run_id", "root_run_id", "forked_from", "at", "images")
    }
    assert RunRecord.of(plain).to_dict() == plain
    # not a run's, or a field of the wrong type: read as not said
    assert RunRecord.of(None).format is None and RunRecord.of({"approvals": 3}).approvals == "wait"
    assert RunRecord.of({"agent": ["x"], "at": "3"}).agent is None
