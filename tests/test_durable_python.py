"""A Python program's own durable agent: killed with SIGKILL in the middle of a tool call, it is
started again and the run finishes without repeating a completed model call or tool call."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import warm
from helpers import FIXTURES, cli_env, program_output
from wire_server import WireServer

PROGRAM = [sys.executable, str(FIXTURES / "billing.py")]


def events(stdout: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def crash_and_resume(wire: WireServer, store: str, tmp_path: Path) -> None:
    wire.add(calls=[("charge_card", {"order": "A-7", "amount_cents": 4200})])
    wire.add(calls=[("send_receipt", {"order": "A-7"})])
    wire.add(text="Charged A-7 and sent the receipt.")
    env = cli_env(OPENAI_BASE_URL=wire.url, BILLING_DIR=str(tmp_path))
    first = warm.Popen(
        [*PROGRAM, store, "start", "a-7"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**env, "HOLD_RECEIPT": "1"},
    )
    assert first.stdout is not None
    seen = []
    for line in first.stdout:
        event = json.loads(line)
        seen.append(event["type"])
        if event["type"] == "receipt_started":  # in the middle of the second tool call
            first.send_signal(signal.SIGKILL)
            break
    first.wait()
    assert first.returncode == -signal.SIGKILL, seen
    assert len(wire.requests) == 2
    assert (tmp_path / "charges.txt").read_text().count("A-7") == 1

    again = warm.run(
        [*PROGRAM, store, "resume", "a-7"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert again.returncode == 0, again.stderr
    end = events(again.stdout)[-1]
    assert end["type"] == "run_finished" and end["outcome"] == "done"
    assert end["answer"] == "Charged A-7 and sent the receipt."
    assert end["steps"] == 3 and end["usage"]["input_tokens"] > 0  # type: ignore[index]
    # no completed model call was made again: one request per reply
    assert len(wire.requests) == 3
    # the payment was made once; the interrupted idempotent call ran again, once
    charges = (tmp_path / "charges.txt").read_text().splitlines()
    assert len(charges) == 1 and charges[0].startswith("a-7:")
    receipts = (tmp_path / "receipts.txt").read_text().splitlines()
    assert len(receipts) == 1 and receipts[0].endswith(" A-7")
    # what the last request carried: both tool results, the charge's the recorded one
    sent = wire.requests[-1]["messages"]
    results = [m["content"] for m in sent if m["role"] == "tool"]
    assert results == ["charged 4200 cents for A-7", "receipt for A-7 sent"]


def test_a_python_programs_durable_run_survives_sigkill_on_sqlite(
    wire: WireServer, tmp_path: Path
) -> None:
    crash_and_resume(wire, f"sqlite:///{tmp_path}/runs.sqlite", tmp_path)


def test_a_python_programs_durable_run_survives_sigkill_on_postgres(
    wire: WireServer,
    tmp_path: Path,
    postgres: str,
) -> None:
    crash_and_resume(wire, postgres, tmp_path)


def test_resume_without_a_store_is_a_clear_error() -> None:
    import asyncio

    from tether import ConfigError, Runtime

    async def go() -> None:
        async with Runtime() as rt:
            await rt.resume("a-7")

    with pytest.raises(ConfigError, match="needs a store"):
        asyncio.run(go())


GUEST = """
import asyncio, gc, json, sqlite3, sys
import sqlalchemy as sa

host = sa.create_engine(f"sqlite:///{sys.argv[1]}/host.db")  # the application's own database
with host.connect() as c:
    c.exec_driver_sql("CREATE TABLE t (x)")
before = {"gc": gc.get_threshold(), "sqlite3": sqlite3.sqlite_version}

from tether import Agent, Runtime, ScriptedModel, reply

async def main():
    agent = Agent(ScriptedModel([reply("done")]), name="a")
    async with Runtime(f"sqlite:///{sys.argv[1]}/runs.sqlite", [agent]) as rt:
        run = await rt.start("a", "hi")
        result = await run.wait()
    return result.outcome

outcome = asyncio.run(main())
host.dispose()  # new connections of the host's engine, after Tether's store was opened
with host.connect() as c:
    mode = c.exec_driver_sql("PRAGMA journal_mode").scalar()
    sync = c.exec_driver_sql("PRAGMA synchronous").scalar()
import sqlite3 as again
print(json.dumps({
    "outcome": outcome, "before": before, "gc": gc.get_threshold(), "journal_mode": mode,
    "synchronous": sync, "sqlite3": again.sqlite_version, "same_module": again is sqlite3,
}))
"""


def test_a_runtime_on_a_sqlite_store_leaves_its_host_alone(tmp_path: Path) -> None:
    """A program with its own SQLite database opens a runtime on a SQLite store: its engine's
    connections keep SQLite's defaults (Tether's WAL and synchronous settings are on the
    store's connections only), `sqlite3` is still the interpreter's own module, and the
    garbage collector's thresholds are the program's."""
    done = subprocess.run(
        [sys.executable, "-c", GUEST, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(),
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["outcome"] == "done"
    assert seen["journal_mode"] == "delete" and seen["synchronous"] == 2  # SQLite's: FULL
    assert seen["sqlite3"] == seen["before"]["sqlite3"] and seen["same_module"]
    assert tuple(seen["gc"]) == tuple(seen["before"]["gc"])


QUEUE_TWICE = """
import asyncio, json, sys
from tether import Agent, Runtime, ScriptedModel, reply
from tether.errors import ConfigError
from tether.durable.view import client, list_runs

async def main(store):
    agent = Agent(ScriptedModel([reply("Done.")]), name="worker-agent")
    seen = {}
    async with Runtime(store, [agent]) as rt:
        try:
            rt.enqueue_many("worker-agent", ["one", "two", "three"], run_ids=["j-1", "j-2", "j-1"])
            seen["refused"] = ""
        except ConfigError as e:
            seen["refused"] = str(e)
        reader = client(store)
        seen["after_refusal"] = [r["id"] for r in list_runs(reader, None)]
        seen["queued"] = rt.enqueue_many("worker-agent", ["one", "two"], run_ids=["j-1", "j-2"])
        seen["stored"] = sorted(r["id"] for r in list_runs(reader, ["queued"]))
        reader.destroy()
    print(json.dumps(seen))

asyncio.run(main(sys.argv[1]))
"""


def test_a_batch_that_names_one_run_twice_queues_nothing(tmp_path: Path) -> None:
    """`enqueue_many` is all or nothing: a repeated id is refused before anything is queued,
    never reported as two runs queued while the store keeps one. (In a program of its own: a
    process has one store.)"""
    seen = program_output(QUEUE_TWICE, f"sqlite:///{tmp_path}/runs.sqlite")
    assert "same id" in seen["refused"] and seen["after_refusal"] == []
    assert seen["queued"] == seen["stored"] == ["j-1", "j-2"]


VERSIONS = """
import asyncio, json, sys
from tether import Agent, Runtime, ScriptedModel, reply

async def main(store):
    given = Agent(ScriptedModel([reply("Done.")]), name="given", version="2")
    found = Agent(ScriptedModel([reply("Done.")]), name="found", system="Be brief.")
    seen = {"fingerprint": found.effective_version}
    async with Runtime(store, [given, found]) as rt:
        for name in ("given", "found"):
            run = await rt.start(name, "a task", run_id=name + "-1")
            await run.wait()
            seen[name] = rt.get(name + "-1").version
        queued = rt.enqueue("given", "later", run_id="queued-1")
        seen["queued"] = rt.get(queued).version
    print(json.dumps(seen))

asyncio.run(main(sys.argv[1]))
"""


def test_a_run_records_the_version_of_the_agent_it_started_with(tmp_path: Path) -> None:
    """A run on a store records its agent's version (given, or the definition's fingerprint),
    and `Runtime.get` shows it for a run executed here and for one still queued. (In a program
    of its own: a process has one store.)"""
    seen = program_output(VERSIONS, f"sqlite:///{tmp_path}/runs.sqlite")
    assert seen["given"] == seen["queued"] == "2"
    assert seen["found"] == seen["fingerprint"] and len(seen["fingerprint"]) == 12


GONE = """
import asyncio, gc, json, sqlite3, sys
from tether import Agent, Runtime, ScriptedModel, reply

async def main(store):
    unhandled = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, c: unhandled.append(c["message"]))
    agent = Agent(ScriptedModel([reply("Done.")]), name="queued-agent")
    async with Runtime(store, [agent], take_over=False) as rt:
        run_id = rt.enqueue("queued-agent", "later", run_id="gone-1")
        seen = []

        async def follow():
            async for event in rt.events(run_id):
                seen.append(event.type)

        following = asyncio.ensure_future(follow())
        while not seen:
            await asyncio.sleep(0.05)
        with sqlite3.connect(store.removeprefix("sqlite:///")) as db:  # the store forgets it
            db.execute("DELETE FROM workflow_status WHERE workflow_uuid = ?", (run_id,))
        await asyncio.wait_for(following, 30)
    gc.collect()
    await asyncio.sleep(0)
    print(json.dumps({"seen": seen, "unhandled": unhandled}))

asyncio.run(main(sys.argv[1]))
"""


def test_a_followed_run_that_is_gone_from_its_store_ends_the_follow(tmp_path: Path) -> None:
    """A run followed in its store (no process here executes it) that the store no longer
    has: the follow ends, its events so far kept, and nothing is left raising in a task that
    nobody awaits (the follower died of NoSuchRun, said by asyncio as an unretrieved error)."""
    seen = program_output(GONE, f"sqlite:///{tmp_path}/runs.sqlite")
    assert seen["seen"] and seen["seen"][0] == "run_started"
    assert seen["unhandled"] == []


MAIL = """
import asyncio, collections, json, subprocess, sys
from tether import Agent, Runtime, ScriptedModel, reply
from tether.durable.ledger import Ledger
from tether.durable.notices import MAIL

reads = collections.Counter()  # each look at a run's inbox, by run
look = Ledger.messages_after

def counted(self, run_id, seq):
    reads[run_id] += 1
    return look(self, run_id, seq)

Ledger.messages_after = counted

async def main(store):
    async def idle() -> str:
        '''Does nothing.'''
        return "idled"

    async def note() -> str:
        '''Waits while another process sends the run a message, until this one hears of it.'''
        before = notices.mark(MAIL)
        said = [sys.executable, "-m", "tether", "send", "talked", "and add milk", "--store", store]
        await asyncio.to_thread(subprocess.run, said, check=True, capture_output=True)
        while notices.mark(MAIL) == before:  # Postgres: its notification, once it arrives
            await asyncio.sleep(0.01)
        return "noted"

    quiet = ScriptedModel([reply(tool_calls=[("idle", {})])] * 2 + [reply("Done.")])
    talker = ScriptedModel([reply(tool_calls=[("note", {})]), reply("Noted.")])
    agents = [Agent(quiet, [idle], name="quiet"), Agent(talker, [note], name="talker")]
    async with Runtime(store, agents) as rt:
        notices = rt.backend.opened.ledger.notices
        while notices.mark(MAIL) is None:  # Postgres: until it listens
            await asyncio.sleep(0.01)
        await (await rt.start("quiet", "idle twice", run_id="hushed")).wait()
        await (await rt.start("talker", "take a note", run_id="talked")).wait()
    second = [m.text for m in talker.requests[1].messages if m.role == "user"]
    print(json.dumps({"reads": reads, "second": second}))

asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_run_reads_its_inbox_only_when_a_message_was_sent(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A durable run looks at its inbox before a model call only when a message was sent since
    its last look (`durable/notices.py`: a notification on Postgres, a stamp file on SQLite),
    or, for a run begun in this process, since before the store had it: a run never sent one
    never looks (three model calls and the look after its answer were four queries, then one).
    A message `tether send` puts in from another process while a tool runs goes with the next
    model call, which looks once."""
    store = f"sqlite:///{tmp_path}/runs.sqlite"
    if kind == "postgres":
        store = request.getfixturevalue("postgres")
    seen = program_output(MAIL, store)
    assert seen["second"] == ["take a note", "and add milk"]
    assert seen["reads"] == {"talked": 1}


KEPT = """
import asyncio, json, sys
from tether import Agent, Runtime, ScriptedModel, reply, tool
from tether.durable.run import DurableRun

@tool
async def look(path: str) -> str:
    '''Look at a path.'''
    return f"{path}: a file"

async def main():
    calls = [("look", {"path": "a"}), ("look", {"path": "b"})]
    model = ScriptedModel([reply(tool_calls=calls), reply("seen")])
    async with Runtime(sys.argv[1], [Agent(model, [look], name="looker")]) as rt:
        run = await rt.start("looker", "look", run_id="kept-1")
        result = await run.wait()
        await asyncio.sleep(0)
        kept = rt.get("kept-1")
        assert isinstance(kept, DurableRun) and kept.last is None and kept.packed is not None
        print(json.dumps({
            "same": kept.result == result and kept.result is not result,
            "again": await kept.wait() == result,
            "roles": [m.role for m in kept.transcript],
            "second": kept.transcript[2].tool_results[1].output,
            "answer": kept.result.answer,
        }))

asyncio.run(main())
"""


def test_an_ended_durable_run_kept_compact_answers_as_it_did(tmp_path: Path) -> None:
    """A durable run the process keeps after it ends (as a run in memory is kept) holds its
    result and transcript compact, and still answers with values equal to what `wait` gave."""
    seen = program_output(KEPT, f"sqlite:///{tmp_path}/runs.sqlite")
    assert seen == {
        "same": True,
        "again": True,
        "roles": ["user", "assistant", "tool", "assistant"],
        "second": "b: a file",
        "answer": "seen",
    }
