"""The ledger's step records: written together (group commit), each writer resumes only once
its record is committed, a failed transaction reaches every writer in it, and a durable run's
records grow with what each step adds, never with the conversation."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import pickle
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from helpers import tether
from tether import messages as m
from tether.durable.ledger import Ledger
from tether.durable.sqlite import sqlite_dbapi
from tether.messages import ToolResult
from wire_server import WireServer


def commits_of(ledger: Ledger) -> list[int]:
    """A count of the transactions `ledger` commits from now on (SQLite)."""
    assert ledger.conn is not None
    count = [0]

    def trace(sql: str) -> None:
        if sql.strip().upper() == "COMMIT":
            count[0] += 1

    ledger.conn.set_trace_callback(trace)
    return count


def test_many_runs_steps_share_one_transaction_and_are_committed_on_return(
    tmp_path: Path,
) -> None:
    """50 runs recording a step at the same moment make one transaction, not 50; when a
    writer resumes, another connection (another process) reads its record already."""
    store = f"sqlite:///{tmp_path}/runs.sqlite"
    ledger = Ledger(store)
    commits = commits_of(ledger)
    other = sqlite3.connect(f"{tmp_path}/runs.sqlite-effects")

    async def one(i: int) -> int:
        await ledger.record_step(f"run-{i}", 0, "tether.model_step", b"x" * i)
        (found,) = other.execute(
            "SELECT count(*) FROM tether_steps WHERE run_id = ?", (f"run-{i}",)
        ).fetchone()
        return int(found)

    async def all_at_once() -> list[int]:
        return await asyncio.gather(*(one(i) for i in range(50)))

    seen = asyncio.run(all_at_once())
    assert seen == [1] * 50
    assert commits[0] == 1
    assert [len(o) for _, _, o, _ in ledger.steps_of("run-7")] == [7]


def test_steps_recorded_one_after_another_come_back_in_order(tmp_path: Path) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path}/runs.sqlite")

    async def record() -> None:
        for n, kind in enumerate(["tether.model_step", "tether.tools_step", "tether.model_step"]):
            await ledger.record_step("r", n, kind, kind.encode())

    asyncio.run(record())
    steps = ledger.steps_of("r")
    assert [(n, kind) for n, kind, _, _ in steps] == [
        (0, "tether.model_step"),
        (1, "tether.tools_step"),
        (2, "tether.model_step"),
    ]
    assert steps[1][2] == b"tether.tools_step" and steps[0][3] <= steps[2][3]


def test_a_transaction_that_fails_fails_each_writer_in_it_and_the_next_goes_on(
    tmp_path: Path,
) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path}/runs.sqlite")
    bad = ("INSERT INTO no_such_table VALUES (:x)", {"x": 1})

    async def go() -> tuple[list[BaseException | None], list[int]]:
        first = await asyncio.gather(
            ledger.writer.write([bad]),
            ledger.record_step("a", 0, "tether.model_step", b"a"),
            return_exceptions=True,
        )
        await ledger.record_step("b", 0, "tether.model_step", b"b")
        return list(first), [len(ledger.steps_of(r)) for r in ("a", "b")]

    errors, counts = asyncio.run(go())
    failed = sqlite_dbapi().OperationalError  # the SQLite the ledger's connection is on
    assert all(isinstance(e, failed) for e in errors), errors
    assert counts == [0, 1]  # the failed transaction wrote nothing; the next one did


def test_a_postgres_ledger_commits_many_runs_steps_together(postgres: str) -> None:
    ledger = Ledger(postgres)
    transactions = [0]
    write_many = ledger.write_many

    def counted(writes: list[tuple[str, dict[str, object]]]) -> None:
        transactions[0] += 1
        write_many(writes)

    ledger.write_many = counted  # type: ignore[method-assign]

    async def go() -> None:
        await asyncio.gather(
            *(ledger.record_step(f"pg-{i}", 0, "tether.model_step", b"y") for i in range(40))
        )

    asyncio.run(go())
    assert transactions[0] < 5  # 40 records; one transaction while the first is under way
    assert all(len(ledger.steps_of(f"pg-{i}")) == 1 for i in range(40))
    ledger.engine.dispose()


def test_a_durable_runs_records_grow_with_each_step_not_the_conversation(
    wire: WireServer, tmp_path: Path
) -> None:
    """Eight turns, each reading a 4 KB file: the conversation sent to the model grows by
    4 KB a turn, while each step's record holds only what that step added."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("n" * 4000)
    for _ in range(8):
        wire.add(calls=[("read_file", {"path": "notes.txt"})])
    wire.add(text="Read it eight times.")
    data = tmp_path / "data"
    p = tether(
        "run", "read notes.txt eight times", "--base-url", wire.url, "--tools", "read_file",
        "--workspace", str(work), "--data-dir", str(data), "--run-id", "grow",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert len(json.dumps(wire.requests[-1]["messages"])) > 8 * 4000
    with sqlite3.connect(data / "runs.sqlite-effects") as db:
        rows = db.execute(
            "SELECT kind, length(output) FROM tether_steps WHERE run_id = 'grow' ORDER BY n"
        ).fetchall()
    kinds = [k for k, _ in rows]
    assert kinds == ["tether.model_step", "tether.tools_step"] * 8 + ["tether.model_step"]
    model = [size for kind, size in rows if kind == "tether.model_step"]
    tools = [size for kind, size in rows if kind == "tether.tools_step"]
    assert max(model) < 2_000 and max(model) - min(model) < 200
    assert all(4_000 < size < 5_000 for size in tools)


def test_a_call_an_earlier_attempt_started_is_told_apart_from_a_fresh_one(
    tmp_path: Path,
) -> None:
    """The journal after a crash: a call started before and never finished is `interrupted`,
    one that finished gives back its result, a call never seen is `fresh`."""
    ledger = Ledger(f"sqlite:///{tmp_path}/runs.sqlite")
    first = ledger.start_calls("r", ["a", "b"])
    assert first == {"a": ("fresh", None), "b": ("fresh", None)}
    asyncio.run(ledger.finish_call("r", ToolResult("a", "charge", "charged", False)))
    again = ledger.start_calls("r", ["a", "b", "c"])
    assert again["b"] == ("interrupted", None) and again["c"] == ("fresh", None)
    state, result = again["a"]
    assert state == "finished" and result == ToolResult("a", "charge", "charged", False)
    assert ledger.start_calls("other-run", ["a"]) == {"a": ("fresh", None)}


def test_a_reply_made_here_starts_its_calls_without_a_read_and_a_replay_sees_them(
    tmp_path: Path,
) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path}/runs.sqlite")
    asyncio.run(ledger.start_fresh("r", ["x", "y"]))
    assert ledger.start_calls("r", ["x", "y"]) == {
        "x": ("interrupted", None),
        "y": ("interrupted", None),
    }


def test_inbox_messages_are_numbered_in_order_per_run(tmp_path: Path) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path}/runs.sqlite")
    assert [ledger.send("r", t) for t in ("one", "two", "three")] == [1, 2, 3]
    assert ledger.send("other", "first") == 1
    assert ledger.messages_after("r", 1) == [(2, "two"), (3, "three")]
    assert ledger.messages_after("r", 3) == []


def test_concurrent_senders_to_one_run_on_postgres_each_get_a_number(postgres: str) -> None:
    """Two senders may read the same last number; the one that loses takes the next."""
    ledgers = [Ledger(postgres, connections=2) for _ in range(4)]
    with ThreadPoolExecutor(8) as pool:
        numbers = list(pool.map(lambda i: ledgers[i % 4].send("r", f"message {i}"), range(24)))
    assert sorted(numbers) == list(range(1, 25))
    texts = {t for _, t in ledgers[0].messages_after("r", 0)}
    assert texts == {f"message {i}" for i in range(24)}
    for ledger in ledgers:
        ledger.engine.dispose()


def test_a_worker_silent_too_long_is_reported_once_and_forgotten(tmp_path: Path) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path}/runs.sqlite")
    assert ledger.beat("w-1", dead_after=60) == []
    assert ledger.beat("w-2", dead_after=60) == []
    with sqlite3.connect(f"{tmp_path}/runs.sqlite-effects") as db:
        db.execute(
            "UPDATE tether_executors SET last_beat = last_beat - 120 WHERE executor_id = 'w-1'"
        )
    assert ledger.beat("w-2", dead_after=60) == ["w-1"]
    assert ledger.beat("w-2", dead_after=60) == []  # one worker recovers its runs, once


def test_a_store_reader_in_another_thread_reads_the_steps(tmp_path: Path) -> None:
    """The page and `tether show` read a run's steps from a thread of their own."""
    ledger = Ledger(f"sqlite:///{tmp_path}/runs.sqlite")
    asyncio.run(ledger.record_step("r", 0, "tether.model_step", b"reply"))
    with ThreadPoolExecutor(1) as pool:
        steps = pool.submit(ledger.steps_of, "r").result()
    assert [(n, o) for n, _, o, _ in steps] == [(0, b"reply")]


def test_writers_waiting_when_the_loop_ends_are_cancelled_not_left_hanging(
    tmp_path: Path,
) -> None:
    """The flusher cancelled in the middle of a transaction (the loop ends): the writers of
    that transaction and those waiting for the next are cancelled, not left waiting."""
    ledger = Ledger(f"sqlite:///{tmp_path}/runs.sqlite")
    in_transaction = asyncio.Event()

    async def held(fn: object, *args: object) -> None:
        in_transaction.set()
        await asyncio.Event().wait()  # a transaction that never ends

    ledger.call = held  # type: ignore[assignment]

    async def go() -> list[bool]:
        first = asyncio.ensure_future(ledger.record_step("r", 0, "tether.model_step", b"a"))
        await asyncio.wait_for(in_transaction.wait(), 5)
        later = asyncio.ensure_future(ledger.record_step("r", 1, "tether.model_step", b"b"))
        await asyncio.sleep(0)  # it joins the next transaction
        assert ledger.writer.flusher is not None
        ledger.writer.flusher.cancel()
        await asyncio.wait({first, later}, timeout=5)
        return [first.cancelled(), later.cancelled()]

    assert asyncio.run(go()) == [True, True]


def test_an_error_of_the_request_is_raised_at_once_not_waited_out(postgres: str) -> None:
    """Only a lost connection is waited out (the store may come back); a statement the store
    refuses fails at once, on Postgres as on SQLite."""
    import psycopg

    ledger = Ledger(postgres, connections=1)
    calls = [0]

    def refused() -> None:
        calls[0] += 1
        with ledger.transaction() as run:
            run("INSERT INTO no_such_table VALUES (1)", {})

    with pytest.raises(psycopg.ProgrammingError, match="no_such_table"):
        asyncio.run(asyncio.wait_for(ledger.call(refused), 10))
    assert calls[0] == 1
    ledger.engine.dispose()


def test_a_message_the_inbox_cannot_take_fails_at_once(tmp_path: Path) -> None:
    """A sender retries only when another took its number; any other error is the caller's."""
    ledger = Ledger(f"sqlite:///{tmp_path}/runs.sqlite")
    assert ledger.conn is not None
    ledger.conn.execute("DROP TABLE tether_inbox")
    with pytest.raises(sqlite_dbapi().OperationalError, match="no such table"):
        ledger.send("r", "hello")


# A reply as a store recorded it before `messages.quick_pickle` (dataclasses' own state).
RECORDED_BEFORE = (
    b"\x80\x04\x95\xf2\x00\x00\x00\x00\x00\x00\x00\x8c\x0ftether.messages\x94\x8c\rModelResponse"
    b"\x94\x93\x94)\x81\x94]\x94(h\x00\x8c\x07Message\x94\x93\x94)\x81\x94]\x94(\x8c\tassistant"
    b"\x94h\x00\x8c\x08TextPart\x94\x93\x94)\x81\x94]\x94\x8c\x0cIt is 3 \xc2\xb0C.\x94abh\x00"
    b"\x8c\x08ToolCall\x94\x93\x94)\x81\x94]\x94(\x8c\x02c1\x94\x8c\x0cget_forecast\x94}\x94"
    b'\x8c\x04city\x94\x8c\x04Oslo\x94s\x8c\x10{"city": "Oslo"}\x94eb\x86\x94eb\x8c\x08tool_use'
    b"\x94h\x00\x8c\x05Usage\x94\x93\x94)\x81\x94]\x94(K\x0cK\x00K\x05K\x00\x89eb\x8c\x00\x94h"
    b"\x1feb."
)


def test_a_step_recorded_by_an_earlier_version_reads_back_the_same() -> None:
    """Records are pickled: a store written before the faster pickling resumes unchanged."""
    call = m.ToolCall("c1", "get_forecast", {"city": "Oslo"}, '{"city": "Oslo"}')
    reply = m.Message("assistant", (m.TextPart("It is 3 °C."), call))
    assert pickle.loads(RECORDED_BEFORE) == m.ModelResponse(reply, "tool_use", m.Usage(12, 0, 5))


def test_every_part_of_a_conversation_is_recorded_whole() -> None:
    """Each field of each message value survives its record (one that was left out would come
    back as its default, or not at all)."""
    reply = m.Message("assistant", (m.TextPart("x"),))
    image = m.ImagePart("image/png", b"\x89PNG\r\n\x1a\n....", "ab" * 32)
    values = [
        m.TextPart("some text"),
        m.ToolCall("c", "n", {"a": 1}, '{"a": 1}'),
        image,
        ToolResult("c", "n", "out", True, (image,)),
        m.ReasoningPart("r", "sig", "enc", "rid", "anthropic"),
        m.Message("tool", (ToolResult("c", "n", "out"),)),
        m.Usage(1, 2, 3, 4, True),
        m.ToolSpec("n", "d", {"type": "object"}),
        m.OutputFormat("o", {"type": "object"}),
        m.ModelRequest((m.Message.user("hi"),), (m.ToolSpec("n", "d", {}),), "sys", 9, "auto"),
        m.ModelResponse(reply, "end_turn", m.Usage(1), "a-model", "served-by"),
    ]
    for value in values:
        again = pickle.loads(pickle.dumps(value))
        assert again == value and type(again) is type(value)
        assert [getattr(again, f.name) for f in dataclasses.fields(value)] == [
            getattr(value, f.name) for f in dataclasses.fields(value)
        ]


def test_records_are_data_checked_as_they_are_read() -> None:
    """A step's record round-trips our message types; a record of another type, a field a
    type does not have, a field of the wrong kind or a pickle is refused, never built."""
    import pickle

    import pytest

    from tether.durable.formats import RECORD_FORMAT
    from tether.durable.records import RecordError, dumps, loads
    from tether.messages import Message, ModelResponse, TextPart, ToolCall, ToolResult, Usage

    reply = ModelResponse(
        Message("assistant", (TextPart("hi"), ToolCall("c1", "add", {"a": 1}, '{"a":1}'))),
        "tool_use",
        Usage(10, 2, 3),
        "m",
    )
    step = (reply, 1.5, 2.0, [(1, "a message")], [])
    assert loads(dumps(step)) == step
    results = ([ToolResult("c1", "add", "2", False)], 3.0)
    assert loads(dumps(results)) == results
    assert loads(dumps({"k": b"\x00bytes", "$t": "not a type"})) == {
        "k": b"\x00bytes",
        "$t": "not a type",
    }
    for bad in (
        b'{"$t": "Path", "x": 1}',
        b'{"$t": "TextPart", "text": "x", "extra": 1}',
        b'{"$t": "TextPart", "text": 5}',
        b'{"$eval": "1"}',
    ):
        with pytest.raises(RecordError):
            loads(RECORD_FORMAT + bad)
    with pytest.raises(RecordError, match="never unpickled"):
        loads(pickle.dumps(step))
    with pytest.raises(TypeError):
        dumps(object())


GOLDEN_MODEL_STEP = (
    b'tether-json-1\n{"$tuple":[{"$t":"ModelResponse","message":{"$t":"Message","role":"assistant",'
    b'"parts":{"$tuple":[{"$t":"TextPart","text":"It is 3 \xc2\xb0C."},{"$t":"ToolCall","id":"c1",'
    b'"name":"get_forecast","arguments":{"$d":{"city":"Oslo"}},"raw_arguments":"{\\"city\\": '
    b'\\"Oslo\\"}"}]}},"stop_reason":"tool_use","usage":{"$t":"Usage","input_tokens":12,'
    b'"cached_input_tokens":0,"output_tokens":5,"reasoning_tokens":0,"estimated":false},'
    b'"model":"","served_by":""},1.5,2.5,[{"$tuple":[1,"hi"]}],[]]}'
)
"""A model step as the ledger has kept it since steps became records: its fields in order."""


def test_a_step_is_typed_and_kept_as_the_same_bytes() -> None:
    """Steps are typed values (`steps.py`), read by kind and used by name; on disk they are
    what they were: a reply recorded before reads back the same, and is written the same."""
    from tether.durable.steps import MODEL, TOOLS, InboxStep, ModelStep, read, record
    from tether.errors import RecordError

    call = m.ToolCall("c1", "get_forecast", {"city": "Oslo"}, '{"city": "Oslo"}')
    reply = m.Message("assistant", (m.TextPart("It is 3 °C."), call))
    step = ModelStep(
        m.ModelResponse(reply, "tool_use", m.Usage(12, 0, 5)), 1.5, 2.5, [(1, "hi")], []
    )
    assert read(MODEL, GOLDEN_MODEL_STEP, "step 0") == step
    assert record(step) == GOLDEN_MODEL_STEP
    assert record(InboxStep(True)) == b"tether-json-1\ntrue"
    with pytest.raises(RecordError, match=r"does not hold the fields of a tether\.tools_step"):
        read(TOOLS, GOLDEN_MODEL_STEP, "step 0")
    with pytest.raises(RecordError, match="unknown kind"):
        read("tether.model", GOLDEN_MODEL_STEP, "step 0")


def test_a_value_of_a_subclass_is_recorded_as_its_plain_kind() -> None:
    """`records.encode` takes a short way for values of exactly a plain type, a list, a tuple or
    one of our types; a subclass (a named tuple, an enum of strings, a list of a library's own)
    goes the long way and is recorded as its plain kind would be, byte for byte."""
    import enum
    from typing import NamedTuple

    from tether.durable.records import dumps

    class Point(NamedTuple):
        x: int
        y: int

    class Colour(enum.StrEnum):
        RED = "red"

    class Items(list[object]):
        pass

    assert dumps(Point(1, 2)) == dumps((1, 2))
    assert dumps(Colour.RED) == dumps("red")
    assert dumps(Items([1, (2, "a")])) == dumps([1, (2, "a")])
    assert dumps({"k": Items([Point(3, 4)])}) == dumps({"k": [(3, 4)]})


async def test_a_question_is_kept_once_and_answered_once(tmp_path: Path) -> None:
    """A run's question (an MCP server's elicitation) is kept once, asked again after a
    restart it is the same; it has no answer until one is given, a second answer is refused
    and the first stays; the questions without an answer are listed in the order asked."""
    from tether.durable.ledger import KeptQuestions
    from tether.questions import Answer, Question

    ledger = Ledger(f"sqlite:///{tmp_path}/runs.sqlite")
    kept = KeptQuestions(ledger)
    first = Question("How many?", {"type": "object"}, "shop", run_id="r1", id="q1")
    second = Question("Which colour?", {"type": "object"}, "shop", run_id="r1", id="q2")
    assert await kept.ask(first) is None and await kept.ask(first) is None  # asked again
    assert await kept.ask(second) is None
    assert await kept.answered(first) is None
    assert ledger.question("r1", "nope") is None
    assert [json.loads(q)["message"] for q in ledger.unanswered("r1")] == [
        "How many?",
        "Which colour?",
    ]
    given = Answer("accept", {"quantity": 2})
    assert await kept.answer(first, given) is True
    assert await kept.answer(first, Answer("decline")) is False  # the first answer stays
    assert await kept.answer(Question("?", {}, "shop", run_id="r1", id="never"), given) is False
    assert await kept.answered(first) == given
    asked, answered = ledger.question("r1", "q1") or ("", None)
    assert json.loads(asked)["message"] == "How many?" and answered is not None
    assert await kept.ask(first) == given  # asked again after a restart: answered already
    assert [json.loads(q)["message"] for q in ledger.unanswered("r1")] == ["Which colour?"]
