"""A Postgres store that stops answering in the middle of runs, through a TCP proxy the test
cuts (the server died, a failover) or freezes (a network that drops packets): runs wait for it
for the patience, then end `failed` with a clear error, never hang, and lose nothing; once the
store answers, `tether resume` (or the worker, by itself) goes on without repeating what was
done."""

from __future__ import annotations

import json
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

import warm

pytest.importorskip("dbos", reason="needs the durable extra")

from helpers import FIXTURES, TETHER, Output, json_lines, store_runs, tether, wait_until
from tcp_proxy import TcpProxy
from test_durable import tools_env
from wire_server import WireServer, tool_results

PATIENCE = "2"  # seconds a run waits for the store in these tests (30 by default)


def charge_then_answer(wire: WireServer, gate: threading.Event) -> None:
    """The model charges once, then answers; the answer waits for `gate`, so the test can
    take the store away while the run is in its second model call."""

    def rule(body: dict[str, Any]) -> dict[str, Any]:
        if tool_results(body) == 0:
            return {"calls": [("charge", {"amount": 7})]}
        return {"text": "Charged once.", "gate": gate}

    wire.rule = rule


def charges(tmp_path: Path) -> list[str]:
    path = tmp_path / "charges"
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("how", ["cut", "freeze"])
def test_a_run_whose_store_stops_answering_fails_clearly_and_resumes_later(
    wire: WireServer, tmp_path: Path, postgres: str, how: str
) -> None:
    gate = threading.Event()
    charge_then_answer(wire, gate)
    proxy, store = TcpProxy.to_url(postgres)
    env = tools_env(tmp_path)
    run = warm.Popen(
        [
            *(*TETHER, "run", "charge it", "--run-id", "r-1", "--json"),
            *("--store", store, "--store-patience", PATIENCE, "--base-url", wire.url),
            *("--tools", "none", "--tools-from", str(FIXTURES / "durable_tools.py")),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    out = Output(run.stdout)
    try:
        wait_until(lambda: len(wire.requests) == 2, "the second model call", 60)
        getattr(proxy, how)()  # the store goes away while the model answers
        gate.set()
        status = run.wait(timeout=120)
    finally:
        gate.set()
        if run.poll() is None:
            run.kill()
    err = run.stderr.read() if run.stderr else ""
    assert status == 1, err
    (finished,) = [e for e in json_lines(out.text()) if e["type"] == "run_finished"]
    assert finished["outcome"] == "failed"
    assert finished["error"]["kind"] == "store_unavailable"
    assert f"did not answer for {PATIENCE} s" in finished["reason"]
    assert "tether resume r-1" in finished["reason"]
    assert "Traceback" not in err and len(err.splitlines()) <= 4, err  # said once, not 4,000
    assert charges(tmp_path) == [charges(tmp_path)[0]]  # the charge was made and recorded

    proxy.restore()
    resumed = tether("resume", "r-1", "--store", store, "--json", env=env, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    (end,) = [e for e in json_lines(resumed.stdout) if e["type"] == "run_finished"]
    assert (end["outcome"], end["answer"]) == ("done", "Charged once.")
    assert len(charges(tmp_path)) == 1  # never twice
    proxy.cut()


def test_a_worker_waits_for_its_store_and_queues_its_runs_again(
    wire: WireServer, tmp_path: Path, postgres: str
) -> None:
    """A worker outlives its store's outage: the runs it executes stop waiting after the
    patience, and once the store answers it puts them back on the queue and finishes them."""
    gate = threading.Event()
    charge_then_answer(wire, gate)
    proxy, through = TcpProxy.to_url(postgres)
    env = tools_env(tmp_path)
    tag = uuid.uuid4().hex[:6]
    queued = tether(
        *("run", "charge it", "--queue", "--run-id", f"w-{tag}", "--store", postgres),
        *("--base-url", wire.url, "--tools", "none", "--approve", "auto"),
        *("--tools-from", str(FIXTURES / "durable_tools.py")),
        env=env,
    )
    assert queued.returncode == 0, queued.stderr
    worker = warm.Popen(
        [
            *TETHER,
            "worker",
            "--store",
            through,
            "--beat",
            "0.5",
            "--store-patience",
            PATIENCE,
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
    said = Output(worker.stderr)
    try:
        wait_until(lambda: len(wire.requests) == 2, "the second model call", 60)
        proxy.cut()
        gate.set()
        said.wait_for("stop waiting for it", 60)
        said.wait_for("the store does not answer", 60)
        proxy.restore()
        said.wait_for(f"queued again 1 runs stopped while the store did not answer: w-{tag}", 60)

        with store_runs(postgres) as runs:
            done = lambda: runs().get(f"w-{tag}", {}).get("state") == "done"  # noqa: E731
            wait_until(done, "the worker to finish the run", 60, 0.2)
    finally:
        gate.set()
        worker.terminate()
        worker.wait(timeout=30)
    assert len(charges(tmp_path)) == 1
    assert "Traceback" not in "\n".join(said.lines), said.lines
    proxy.cut()


async def test_a_ledger_call_waits_for_its_store_to_answer_again(postgres: str) -> None:
    """The journal and inbox calls of a run wait for a store that went away, as DBOS's own
    records do, instead of failing the run for good (a Postgres restart while a model step
    read the inbox ended the run `failed`)."""
    import asyncio

    from tether.durable.ledger import Ledger

    proxy, through = TcpProxy.to_url(postgres)
    ledger = Ledger(through)
    try:
        assert await ledger.call(ledger.messages_after, "r-1", 0) == []
        proxy.cut()  # the pooled connection dies, and a new one is refused
        call = asyncio.ensure_future(ledger.call(ledger.messages_after, "r-1", 0))
        await asyncio.sleep(0.5)  # several attempts fail meanwhile
        assert not call.done()
        proxy.restore()
        assert await asyncio.wait_for(call, 30) == []
    finally:
        proxy.cut()
        ledger.engine.dispose()


def test_the_store_trouble_dbos_logs_is_said_in_one_line_a_while() -> None:
    """DBOS logs every retry of every thread with the driver's whole message; a process says
    once in a while, in one line, that its store does not answer, and keeps the cause."""
    import logging

    from tether.durable.outage import QuietStoreLog

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    log = logging.getLogger("tether-test-dbos")  # as DBOS's, without what others put on that
    log.propagate = False
    quiet, keep = QuietStoreLog(), Keep()
    log.addFilter(quiet)
    log.addHandler(keep)
    try:
        refused = (
            '(psycopg.OperationalError) connection failed: connection to server at "10.0.0.5", '
            "port 5432 failed: Connection refused\n\tIs the server running on that host?\n"
            "(Background on this error at: https://sqlalche.me/e/21/e3q8)"
        )
        for attempt in range(100):
            log.warning(f"Database connection failed: {refused}. Retrying (attempt {attempt})")
        log.warning("Workflow w-1 has an unknown queue")
    finally:
        log.removeFilter(quiet)
        log.removeHandler(keep)
    said = [r.getMessage() for r in records]
    assert said == [
        'the store does not answer (connection to server at "10.0.0.5", port 5432 failed: '
        "Connection refused)",
        "Workflow w-1 has an unknown queue",
    ]
    assert quiet.cause is not None and "Connection refused" in quiet.cause


@pytest.mark.parametrize("command", [["run", "hello", "--tools", "none"], ["runs"]])
def test_a_store_that_cannot_be_reached_is_one_line(command: list[str]) -> None:
    from helpers import free_port

    store = f"postgresql://tether:sekrit-pw@127.0.0.1:{free_port()}/runs"  # nothing listens
    p = tether(*command, "--store", store, timeout=60, OPENAI_API_KEY="sk-unused")
    assert p.returncode == 1
    assert p.stderr.startswith("tether: cannot open the store: connection to server at")
    assert "Connection refused" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "sekrit-pw" not in p.stderr + p.stdout


def test_processes_that_open_a_fresh_store_at_once_all_open_it(postgres: str) -> None:
    """Workers started together on a new database each create the ledger's tables if they are
    missing; on Postgres that raced (a duplicate key in its catalog killed one of two workers
    of bench/load.py)."""
    from tether.durable.ledger import Ledger

    at_once = threading.Barrier(8)
    errors: list[BaseException] = []

    def open_it() -> None:
        at_once.wait()
        try:
            Ledger(postgres, connections=1).engine.dispose()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=open_it) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []


def test_what_dbos_says_of_the_store_is_kept_short_and_its_own_cancels_unsaid() -> None:
    """The cause kept is the driver's first line when it names no known cause; DBOS's note
    that a run's task was cancelled is dropped (Tether says why it stopped the run); while a
    client says the store cannot be opened, DBOS's own words on it are dropped, and the rest
    of its warnings pass."""
    import logging

    from tether.durable.outage import QuietStoreLog, cause_of, said_by_us

    assert cause_of("the pool is closed\n(Background on this error ...)") == "the pool is closed"
    quiet = QuietStoreLog()

    def passes(message: str, level: int = logging.WARNING) -> bool:
        return bool(quiet.filter(logging.LogRecord("dbos", level, "", 0, message, (), None)))

    assert not passes("Asyncio task cancelled for workflow or step <function run_async>")
    assert passes("Workflow w-1 has an unknown queue")

    log = logging.getLogger("dbos")
    kept: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            kept.append(record.getMessage())

    keep = Keep()
    log.addHandler(keep)
    try:
        with said_by_us():
            log.warning("Error connecting to the DBOS system database: connection refused")
            log.warning("Workflow w-2 has an unknown queue")
    finally:
        log.removeHandler(keep)
    assert kept == ["Workflow w-2 has an unknown queue"]


def test_a_postgres_connection_notices_a_silent_peer_within_30_s(postgres: str) -> None:
    """Each connection to a Postgres store carries libpq's keep-alives as the README says: a
    peer gone silent is found after 10 s idle and 3 probes 5 s apart, data never acknowledged
    fails after 30 s, and a connection attempt gives up after 10 s."""
    from tether.durable.ledger import Ledger

    ledger = Ledger(postgres)
    try:
        with ledger.engine.connect() as c:
            params = c.connection.dbapi_connection.info.get_parameters()
    finally:
        ledger.engine.dispose()
    wanted = {
        "connect_timeout": "10",
        "keepalives": "1",
        "keepalives_idle": "10",
        "keepalives_interval": "5",
        "keepalives_count": "3",
        "tcp_user_timeout": "30000",
    }
    assert {k: params.get(k) for k in wanted} == wanted


def test_the_cause_kept_is_one_line_of_at_most_200_characters() -> None:
    from tether.durable.outage import cause_of

    text = "".join(chr(ord("a") + i % 26) for i in range(300))
    assert cause_of(text + "\nmore") == text[:200]
    assert cause_of("  \n") == "no reply"


def test_a_secret_in_what_the_driver_says_is_never_repeated() -> None:
    """A driver may name the store's URL, password and all, in its error: what a process says
    of it (the run's error, the one line of a command that cannot open its store, the log
    line of an outage) is redacted."""
    import logging

    from tether.durable.outage import QuietStoreLog, cannot_open, cause_of

    secret = "s3cret-Pa55word-of-the-store"
    said = (
        "(psycopg.OperationalError) could not connect to "
        f"postgresql://tether:{secret}@10.0.0.5:5432/runs: timeout expired"
    )
    assert "could not connect to postgresql://tether:" in cause_of(said)
    record = logging.LogRecord("dbos", logging.WARNING, "", 0, said, None, None)
    quiet = QuietStoreLog()
    quiet.filter(record)
    for text in (cause_of(said), str(cannot_open(Exception(said))), record.getMessage()):
        assert secret not in text and "[redacted]" in text, text
    assert quiet.cause is not None and secret not in quiet.cause


APPROVE_IN_AN_OUTAGE = """
import asyncio, json, os, sys
sys.path.insert(0, sys.argv[3])
from tcp_proxy import TcpProxy
from tether import Agent, Runtime, ScriptedModel, reply, tool
from tether.errors import StoreUnavailable

@tool(approval="always")
def pay(amount: int) -> str:
    \"\"\"Pay an amount.\"\"\"
    return f"paid {amount}"

async def main():
    proxy, store = TcpProxy.to_url(sys.argv[1])
    model = ScriptedModel([reply(tool_calls=[("pay", {"amount": 5})]), reply("Paid.")])
    seen = {}
    async with Runtime(store, [Agent(model, [pay], name="payer")]) as rt:
        run = await rt.start("payer", "pay 5", run_id=sys.argv[2])
        while not run.waiting():
            await asyncio.sleep(0.02)
        (request,) = run.waiting()
        proxy.cut()
        try:
            rt.approve(run.id, request.id)
            seen["raised"] = ""
        except StoreUnavailable as e:
            seen["raised"] = str(e)
        seen["waiting"] = [r.id for r in run.waiting()]
        proxy.restore()
        rt.approve(run.id, request.id)
        seen["after"] = [r.id for r in run.waiting()]
        seen["approval_id"] = request.id
    print(json.dumps(seen), flush=True)
    os._exit(0)  # DBOS's threads, after an outage, are not waited for

asyncio.run(main())
"""


def test_an_approval_the_store_cannot_take_raises_and_stays_waiting(postgres: str) -> None:
    """Answered while the store is away: the caller is told (StoreUnavailable), the request
    is still waiting, and answered again once the store is back, it reaches the store, once.
    (In a process of its own: DBOS stays launched in the process that opened the store.)"""
    import sys

    import psycopg

    run_id = f"pay-{uuid.uuid4().hex[:8]}"
    done = subprocess.run(
        [sys.executable, "-c", APPROVE_IN_AN_OUTAGE, postgres, run_id, str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=120,
        env=warm.cli_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert "did not reach the store" in seen["raised"]
    assert seen["waiting"] == [seen["approval_id"]] and seen["after"] == []
    with psycopg.connect(postgres) as db:  # the run's durable message, once
        sent = db.execute(
            "SELECT count(*) FROM dbos.notifications WHERE destination_uuid = %s AND topic = %s",
            (run_id, seen["approval_id"]),
        ).fetchone()
    assert sent == (1,)
