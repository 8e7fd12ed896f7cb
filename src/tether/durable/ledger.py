"""What durable runs keep beside DBOS's tables: the record of each run's steps, the journal of
tool calls, the inbox of user messages, the workers' heartbeats, accounts' budgets
(`accounts.py` reads and writes those) and endpoints' rate limits (`rates.py`).

A run's steps (each model reply, the results of each reply's tool calls, a fitted context, the
guardrails' verdicts, a look at the inbox) are numbered in the order the run takes them, and
each is recorded here when it completes; DBOS keeps the run's life (start, end, recovery,
queues, messages). A DBOS step cost about 3.6 ms of CPU on SQLite and 2.8 ms on Postgres on
2 cores (bench/durable_bench.py), mostly its own bookkeeping and a thread hop each way, where
a row here costs tens of microseconds: the records of every run in the process are written
together, one transaction for all that completed at the same moment (`Writer`, group commit).

The journal records each tool call's start before it runs and its result when it ends, so a
call is never repeated once it has finished, even when the step that ran it (one step for all
the calls of one reply) is made again after a crash: a finished call gives back its recorded
result, a call that started but never finished is rerun only if its tool is idempotent. The
step's last call to end is journaled by the step's own record, which holds its result: the
journal is read only for a step not recorded, and a crash before that record commits leaves
the call unfinished either way. So a reply of one call, the usual kind, writes two rows (its
start, its step), where it wrote three, each a transaction of its own.

Images (a task's, a tool result's) are kept once each, by their sha256: a run's records (its
steps, the journal, DBOS's) carry them without their bytes, however often they name them.

The inbox holds `tether send` messages, numbered per run. A model step reads the messages past
the last one the run has seen and returns them with the reply, so its record says which messages
went into which call; a replay delivers the same ones, and nothing needs marking as consumed.
A message sent is said to every process on the store (`notices.py`), and a run reads its inbox
only when one was said since its last look (`effects.RecordedEffects.unread`).

For a SQLite store these tables live in a file beside it (`PATH-effects`): sharing DBOS's file
would make every write here wait for its write lock. One connection serves the process, used on
the event loop itself: a write in WAL mode takes microseconds, far less than a hop to a thread.
For Postgres the tables share the database, reached in a worker thread through psycopg's own
connections, kept in SQLAlchemy's pool (`Ledger.connection`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, TypeVar

import orjson

from ..journal import private_file
from ..messages import ImagePart, ToolResult, Usage
from ..questions import Answer, Question
from .notices import MAIL, Notices
from .outage import POSTGRES_CONNECT_ARGS
from .sqlite import sqlite_dbapi, tuned
from .statements import Run, connection_lost, running

TABLES = (
    # a run's recorded steps: n counts from 0 in the order the run takes them (effects.py)
    "CREATE TABLE IF NOT EXISTS tether_steps (run_id TEXT NOT NULL, n INTEGER NOT NULL, "
    "kind TEXT NOT NULL, output BYTEA NOT NULL, at DOUBLE PRECISION NOT NULL, "
    "PRIMARY KEY (run_id, n))",
    "CREATE INDEX IF NOT EXISTS tether_steps_at ON tether_steps (kind, at)",  # the dashboard's
    "CREATE TABLE IF NOT EXISTS tether_tool_calls (run_id TEXT NOT NULL, call_id TEXT NOT NULL, "
    "attempt TEXT NOT NULL, started_at DOUBLE PRECISION NOT NULL, result TEXT, "
    "PRIMARY KEY (run_id, call_id))",
    "CREATE TABLE IF NOT EXISTS tether_inbox (run_id TEXT NOT NULL, seq INTEGER NOT NULL, "
    "text TEXT NOT NULL, sent_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (run_id, seq))",
    # the questions a run's tools asked its person (`questions.py`), and the answers given
    "CREATE TABLE IF NOT EXISTS tether_questions (run_id TEXT NOT NULL, "
    "question_id TEXT NOT NULL, question TEXT NOT NULL, answer TEXT, "
    "asked_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (run_id, question_id))",
    "CREATE TABLE IF NOT EXISTS tether_executors (executor_id TEXT PRIMARY KEY, "
    "last_beat DOUBLE PRECISION NOT NULL)",
    # the agents' versions each worker executes (`versions.py`): JSON `["triage@2", ...]`
    "CREATE TABLE IF NOT EXISTS tether_serves (executor_id TEXT PRIMARY KEY, "
    "serves TEXT NOT NULL, dead_after DOUBLE PRECISION NOT NULL)",
    # a run's upgrades to other versions of its agent, each after the steps it had then
    "CREATE TABLE IF NOT EXISTS tether_upgrades (run_id TEXT NOT NULL, "
    "to_version TEXT NOT NULL, from_version TEXT NOT NULL, steps INTEGER NOT NULL, "
    "at DOUBLE PRECISION NOT NULL, PRIMARY KEY (run_id, to_version))",
    # accounts' limits, spend per period and calls in flight (`durable/accounts.py`)
    "CREATE TABLE IF NOT EXISTS tether_account_limits (account TEXT PRIMARY KEY, "
    "limits TEXT NOT NULL, at DOUBLE PRECISION NOT NULL)",
    "CREATE TABLE IF NOT EXISTS tether_account_spend (account TEXT NOT NULL, "
    "period TEXT NOT NULL, usd DOUBLE PRECISION NOT NULL, tokens BIGINT NOT NULL, "
    "PRIMARY KEY (account, period))",
    "CREATE TABLE IF NOT EXISTS tether_account_held (run_id TEXT NOT NULL, key TEXT NOT NULL, "
    "account TEXT NOT NULL, usd DOUBLE PRECISION NOT NULL, tokens BIGINT NOT NULL, "
    "day TEXT NOT NULL, month TEXT NOT NULL, at DOUBLE PRECISION NOT NULL, "
    "PRIMARY KEY (run_id, key))",
    "CREATE INDEX IF NOT EXISTS tether_account_held_account ON tether_account_held (account)",
    # endpoints' rates and servers' pauses, and the attempts in their windows (`durable/rates.py`)
    "CREATE TABLE IF NOT EXISTS tether_rates (endpoint TEXT PRIMARY KEY, rate TEXT, "
    "paused_until DOUBLE PRECISION NOT NULL, at DOUBLE PRECISION NOT NULL)",
    "CREATE TABLE IF NOT EXISTS tether_rate_log (endpoint TEXT NOT NULL, "
    "at DOUBLE PRECISION NOT NULL, tokens BIGINT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS tether_rate_log_at ON tether_rate_log (endpoint, at)",
    # BYTEA: Postgres's bytes; SQLite keeps bytes as they are under any type name
    "CREATE TABLE IF NOT EXISTS tether_images (sha256 TEXT PRIMARY KEY, "
    "media_type TEXT NOT NULL, data BYTEA NOT NULL)",
)

CallState = Literal["fresh", "finished", "interrupted"]

SCHEMA_LOCK = 0x7E7E_0001
"""The Postgres advisory lock under which a process creates the ledger's tables: two workers
starting at once on a fresh database both ran CREATE TABLE IF NOT EXISTS, and one of them
died of a duplicate key in Postgres's catalog (pg_type_typname_nsp_index)."""

STEP_SQL = "INSERT INTO tether_steps VALUES (:r, :n, :k, :o, :t) ON CONFLICT (run_id, n) DO NOTHING"
START_SQL = (
    "INSERT INTO tether_tool_calls VALUES (:r, :c, :a, :t, NULL) "
    "ON CONFLICT (run_id, call_id) DO NOTHING"
)
FINISH_SQL = "UPDATE tether_tool_calls SET result = :x WHERE run_id = :r AND call_id = :c"
ANSWER_SQL = "SELECT question, answer FROM tether_questions WHERE run_id = :r AND question_id = :q"

RETRY_FIRST_S = 0.1
RETRY_MAX_S = 5.0


T = TypeVar("T")
Writes = Sequence[tuple[str, dict[str, Any]]]
"""Statements with `:name` parameters, to make in one transaction."""


def ledger_url(store: str) -> str:
    """SQLAlchemy's URL for the ledger of a Postgres `store` (psycopg 3, which DBOS installs;
    SQLAlchemy's default driver is psycopg2)."""
    return store.replace("postgresql://", "postgresql+psycopg://", 1).replace(
        "postgres://", "postgresql+psycopg://", 1
    )


class Ledger:
    def __init__(self, store: str, connections: int = 5) -> None:
        """`connections`: the Postgres pool (the process's threads that use it are as many,
        so none waits for one); SQLite has its one connection."""
        self.conn: Any = None  # a SQLite connection (`sqlite.sqlite_dbapi`'s)
        self.engine: Any = None
        self.file: Path | None = None  # SQLite: the store's file
        if store.startswith("sqlite:///"):
            self.file = Path(store.removeprefix("sqlite:///"))
            path = store.removeprefix("sqlite:///") + "-effects"
            private_file(path)
            conn = sqlite_dbapi().connect(path, isolation_level=None, check_same_thread=False)
            self.conn = tuned(conn)  # (see `sqlite.tuned`)
        else:
            from sqlalchemy import create_engine

            self.engine = create_engine(
                ledger_url(store),
                pool_size=connections,
                max_overflow=0,
                connect_args=dict(POSTGRES_CONNECT_ARGS),
            )
        self.writer = Writer(self)
        self.notices = Notices(self.file)  # what the store's processes say (its mail, rates)
        with self.transaction() as run:
            if self.engine is not None:  # one process at a time (see SCHEMA_LOCK)
                run("SELECT pg_advisory_xact_lock(:k)", {"k": SCHEMA_LOCK})
            for ddl in TABLES:
                run(ddl, {})

    def close(self) -> None:
        """Close the connection (SQLite) or the pool (Postgres). A ledger opened for one
        request closes when done: left to the garbage collector, each queued run of an
        account kept a connection open (a Ledger and its Writer hold each other)."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.engine is not None:
            self.engine.dispose()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[Run]:
        if self.conn is not None:
            conn = self.conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield running(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return
        with self.connection() as pg, pg.cursor() as cursor:
            try:
                yield running(cursor, postgres=True)
            except BaseException:
                pg.rollback()
                raise
            pg.commit()

    @contextmanager
    def connection(self, autocommit: bool = False) -> Iterator[Any]:
        """A Postgres connection of the pool, psycopg's own: what SQLAlchemy's `Connection`
        adds (about 65 us of CPU a transaction here: 183 us against 119, `bench/pg_writes.py`)
        buys the ledger nothing, its statements being plain text. One it lost is dropped from
        the pool, not handed out again."""
        fairy = self.engine.raw_connection()
        pg = fairy.driver_connection
        try:
            pg.autocommit = autocommit
            yield pg
        except Exception as e:
            if connection_lost(e):
                fairy.invalidate(e)
            raise
        finally:
            if not pg.closed and not pg.broken:
                pg.autocommit = False
            fairy.close()

    @contextmanager
    def saying(self, channel: str, key: str) -> Iterator[Run]:
        """A transaction whose change is said to every process on the store (`notices.py`): on
        Postgres by a notification that goes as it commits, on SQLite once it has."""
        with self.transaction() as run:
            yield run
            if self.engine is not None:
                run("SELECT pg_notify(:c, :k)", {"c": channel, "k": key})
        self.notices.said(channel)

    def read(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """The rows of one query (on SQLite outside any transaction: a reader in another
        thread must not begin one while the event loop's is open on the same connection)."""
        if self.conn is not None:
            rows: list[tuple[Any, ...]] = self.conn.execute(sql, params).fetchall()
            return rows
        with self.transaction() as run:
            return run(sql, params)

    def once(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """One statement, a transaction of its own: on Postgres in autocommit, one round trip
        where a transaction takes three (begin, the statement, commit): 65 us of CPU where
        they take 119 (`bench/pg_writes.py`)."""
        if self.conn is not None:
            with self.transaction() as run:
                return run(sql, params)
        with self.connection(autocommit=True) as pg, pg.cursor() as cursor:
            return running(cursor, postgres=True)(sql, params)

    def write_many(self, writes: list[tuple[str, dict[str, Any]]]) -> None:
        """Make these writes in one transaction, each statement once for all its rows (a
        single row, the usual write of one run at a time, as one statement on its own)."""
        if len(writes) == 1:
            self.once(*writes[0])
            return
        by_sql: dict[str, list[dict[str, Any]]] = {}
        for sql, params in writes:
            by_sql.setdefault(sql, []).append(params)
        with self.transaction() as run:
            for sql, rows in by_sql.items():
                run(sql, rows)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a ledger method from async code: inline for SQLite, in a thread for Postgres.

        A method the connection failed under is called again, after a pause that doubles up
        to `RETRY_MAX_S`, until the store answers: as DBOS does for its own records, a run
        waits for its store, and the runtime's patience decides how long (`outage`). Without
        it, a Postgres restart while a model step read the inbox ended the run `failed` for
        good. Every method called this way may be called twice: reads, an update to the same
        value, and `start_calls`, which at worst sees its own first attempt as an earlier
        one (the call is then not run: never run twice)."""
        if self.conn is not None:
            return fn(*args)
        pause = RETRY_FIRST_S
        while True:
            try:
                return await asyncio.to_thread(fn, *args)
            except Exception as e:
                if not connection_lost(e):
                    raise
            await asyncio.sleep(pause)
            pause = min(2 * pause, RETRY_MAX_S)

    # -- a run's steps ------------------------------------------------------------------------

    async def record_step(
        self, run_id: str, n: int, kind: str, output: bytes, also: Writes = ()
    ) -> None:
        """Record step `n` of a run (returns once it is committed), with `also` (writes that
        belong to the step: its model call's settlement with its account) in the same
        transaction."""
        row = {"r": run_id, "n": n, "k": kind, "o": output, "t": time.time()}
        await self.writer.write([(STEP_SQL, row), *also])

    def steps_of(self, run_id: str) -> list[tuple[int, str, bytes, float]]:
        """A run's recorded steps, in order: (n, kind, output, when recorded)."""
        sql = "SELECT n, kind, output, at FROM tether_steps WHERE run_id = :r ORDER BY n"
        rows = self.read(sql, {"r": run_id})
        return [(int(n), str(k), bytes(o), float(t)) for n, k, o, t in rows]

    def note_upgrade(self, run_id: str, was: str, now: str) -> None:
        """Record that a run goes on under version `now` of its agent from here on, after the
        steps it has recorded (`versions.on_its_version`), so that its history read from the
        store says so where it happened. Once: executed again after a crash, the run goes on
        from the same upgrade."""
        sql = (
            "INSERT INTO tether_upgrades SELECT :r, :to, :was, COUNT(*), :t FROM tether_steps "
            "WHERE run_id = :r ON CONFLICT (run_id, to_version) DO NOTHING"
        )
        self.once(sql, {"r": run_id, "to": now, "was": was, "t": time.time()})

    def upgrades_of(self, run_id: str) -> list[tuple[int, str, str, float]]:
        """A run's upgrades, in order: (the steps it had, from, to, when)."""
        sql = (
            "SELECT steps, from_version, to_version, at FROM tether_upgrades WHERE run_id = :r "
            "ORDER BY at"
        )
        rows = self.read(sql, {"r": run_id})
        return [(int(n), str(was), str(to), float(at)) for n, was, to, at in rows]

    def recent_steps(self, kind: str, since: float, limit: int) -> list[bytes]:
        """The outputs of the steps of this kind recorded since `since` (Unix time), the most
        recent `limit` (the page's dashboard reads the model calls' times from them)."""
        sql = (
            "SELECT output FROM tether_steps WHERE kind = :k AND at >= :t ORDER BY at DESC LIMIT :n"
        )
        return [bytes(o) for (o,) in self.read(sql, {"k": kind, "t": since, "n": limit})]

    # -- the journal of tool calls -----------------------------------------------------------

    async def start_fresh(self, run_id: str, call_ids: list[str]) -> None:
        """Record that these calls start, where no earlier attempt can have started them (the
        reply that asked for them was made in this process): no read is needed."""
        now, attempt = time.time(), uuid.uuid4().hex
        rows = [{"r": run_id, "c": c, "a": attempt, "t": now} for c in call_ids]
        await self.writer.write([(START_SQL, row) for row in rows])

    def start_calls(
        self, run_id: str, call_ids: list[str]
    ) -> dict[str, tuple[CallState, ToolResult | None]]:
        """Record that these calls start (one transaction for all the calls of a reply), except
        those an earlier attempt started: for those, whether it finished (with its result) or
        was interrupted."""
        attempt = uuid.uuid4().hex
        now = time.time()
        out: dict[str, tuple[CallState, ToolResult | None]] = {}
        with self.transaction() as run:
            for call_id in call_ids:
                key = {"r": run_id, "c": call_id}
                run(START_SQL, {**key, "a": attempt, "t": now})
                by, result = run(
                    "SELECT attempt, result FROM tether_tool_calls "
                    "WHERE run_id = :r AND call_id = :c",
                    key,
                )[0]
                if by == attempt:
                    out[call_id] = ("fresh", None)
                elif result is None:
                    out[call_id] = ("interrupted", None)
                else:
                    out[call_id] = ("finished", recorded_result(call_id, orjson.loads(result)))
        return out

    async def finish_call(self, run_id: str, result: ToolResult) -> None:
        """Record a call's result (its images by name: `keep_images` has their bytes); returns
        once it is committed."""
        data: dict[str, Any] = {
            "name": result.name,
            "output": result.output,
            "is_error": result.is_error,
        }
        if result.images:
            data["images"] = [i.ref for i in result.images]
        if result.usage is not None:
            data["usage"] = result.usage.to_dict()
        row = {"x": orjson.dumps(data).decode(), "r": run_id, "c": result.call_id}
        await self.writer.write([(FINISH_SQL, row)])

    # -- images -----------------------------------------------------------------------------

    def keep_images(self, images: list[ImagePart]) -> None:
        """Keep these images' bytes, once each (one kept already is left as it is)."""
        with self.transaction() as run:
            for i in images:
                run(
                    "INSERT INTO tether_images VALUES (:h, :m, :d) ON CONFLICT (sha256) DO NOTHING",
                    {"h": i.sha256, "m": i.media_type, "d": i.data},
                )

    def images(self, hashes: list[str]) -> dict[str, bytes]:
        """The bytes of the images kept under these hashes (those it has)."""
        found: dict[str, bytes] = {}
        with self.transaction() as run:
            for h in hashes:
                for (data,) in run("SELECT data FROM tether_images WHERE sha256 = :h", {"h": h}):
                    found[h] = bytes(data)
        return found

    # -- the inbox --------------------------------------------------------------------------

    def send(self, run_id: str, message: str) -> int:
        """Append a user message to the run's inbox; its number."""
        for _ in range(20):
            try:
                with self.saying(MAIL, run_id) as run:  # heard by the run wherever it runs
                    seq = run(
                        "SELECT COALESCE(MAX(seq), 0) + 1 FROM tether_inbox WHERE run_id = :r",
                        {"r": run_id},
                    )[0][0]
                    run(
                        "INSERT INTO tether_inbox VALUES (:r, :s, :x, :t)",
                        {"r": run_id, "s": seq, "x": message, "t": time.time()},
                    )
                return int(seq)
            except Exception as e:  # a concurrent sender took that number: try the next
                # (Postgres only: SQLite's BEGIN IMMEDIATE makes a second sender wait for the
                # first's commit before it reads the number; a unique violation is an
                # IntegrityError in the DB-API, psycopg's and SQLAlchemy's alike)
                if not any(c.__name__ == "IntegrityError" for c in type(e).__mro__):
                    raise
        raise RuntimeError(f"could not append to the inbox of {run_id}")

    def messages_after(self, run_id: str, seq: int) -> list[tuple[int, str]]:
        sql = "SELECT seq, text FROM tether_inbox WHERE run_id = :r AND seq > :s ORDER BY seq"
        rows = self.read(sql, {"r": run_id, "s": seq})
        return [(int(s), str(t)) for s, t in rows]

    # -- questions --------------------------------------------------------------------------

    def ask(self, run_id: str, question_id: str, question: str) -> str | None:
        """Keep a question (once: asked again after a restart, it is the same row); the
        answer given to it already (JSON), if any."""
        key = {"r": run_id, "q": question_id}
        with self.transaction() as run:
            run(
                "INSERT INTO tether_questions VALUES (:r, :q, :x, NULL, :t) "
                "ON CONFLICT (run_id, question_id) DO NOTHING",
                {**key, "x": question, "t": time.time()},
            )
            rows = run(ANSWER_SQL, key)
        return str(rows[0][1]) if rows and rows[0][1] is not None else None

    def question(self, run_id: str, question_id: str) -> tuple[str, str | None] | None:
        """A question kept for the run (JSON) and its answer, if any; None if never asked."""
        rows = self.read(ANSWER_SQL, {"r": run_id, "q": question_id})
        return (str(rows[0][0]), rows[0][1]) if rows else None

    def give_answer(self, run_id: str, question_id: str, answer: str) -> bool:
        """Keep the answer to a question that has none; False if it had one."""
        with self.transaction() as run:
            rows = run(ANSWER_SQL, {"r": run_id, "q": question_id})
            if not rows or rows[0][1] is not None:
                return False
            run(
                "UPDATE tether_questions SET answer = :a WHERE run_id = :r AND question_id = :q",
                {"r": run_id, "q": question_id, "a": answer},
            )
        return True

    def unanswered(self, run_id: str) -> list[str]:
        """The questions (JSON) the run asked that have no answer, in the order asked."""
        sql = (
            "SELECT question FROM tether_questions WHERE run_id = :r AND answer IS NULL "
            "ORDER BY asked_at"
        )
        return [str(q) for (q,) in self.read(sql, {"r": run_id})]

    # -- workers' heartbeats ----------------------------------------------------------------

    def beat(self, executor_id: str, dead_after: float) -> list[str]:
        """Record that this worker is alive; the executors silent for `dead_after` seconds
        (forgotten from now on, so only one worker recovers each)."""
        now = time.time()
        with self.transaction() as run:
            run("DELETE FROM tether_executors WHERE executor_id = :e", {"e": executor_id})
            run("INSERT INTO tether_executors VALUES (:e, :t)", {"e": executor_id, "t": now})
            old = {"t": now - dead_after}
            dead = [
                str(r[0])
                for r in run("SELECT executor_id FROM tether_executors WHERE last_beat < :t", old)
            ]
            if dead:
                run("DELETE FROM tether_executors WHERE last_beat < :t", old)
                run("DELETE FROM tether_serves WHERE executor_id = :e", [{"e": e} for e in dead])
        return dead

    def serve(self, executor_id: str, versions: list[str], dead_after: float) -> None:
        """Record the agents' versions a worker executes (`agent@version`), for as long as it
        beats (it counts as gone `dead_after` seconds after its last)."""
        row = {"e": executor_id, "s": orjson.dumps(versions).decode(), "d": dead_after}
        with self.transaction() as run:
            run("DELETE FROM tether_serves WHERE executor_id = :e", {"e": executor_id})
            run("INSERT INTO tether_serves VALUES (:e, :s, :d)", row)

    def served(self) -> dict[str, list[str]]:
        """The versions live workers execute (`agent@version`): by worker."""
        return {e: versions for e, (versions, alive) in self.workers().items() if alive}

    def workers(self) -> dict[str, tuple[list[str], bool]]:
        """Every worker that said which versions it executes and has not been found dead
        since: those versions, and whether it beat within its `dead_after`."""
        sql = (
            "SELECT s.executor_id, s.serves, e.last_beat >= :now - s.dead_after "
            "FROM tether_serves AS s LEFT JOIN tether_executors AS e "
            "ON e.executor_id = s.executor_id"
        )
        rows = self.read(sql, {"now": time.time()})
        return {str(e): (list(orjson.loads(s)), bool(alive)) for e, s, alive in rows}


def recorded_result(call_id: str, d: dict[str, Any]) -> ToolResult:
    """A result as `finish_call` recorded it; its images without their bytes."""
    images = tuple(map(ImagePart.from_ref, d.get("images", ())))
    usage = Usage.from_dict(d["usage"]) if d.get("usage") else None
    return ToolResult(call_id, d["name"], d["output"], d["is_error"], images, usage)


class Writer:
    """Group commit: the writes of every run in the process that arrive while the store is
    busy go in the next transaction together, and each writer resumes once its own are
    committed. On SQLite a transaction is made on the event loop (see the module's note), so
    the writes of one turn of the loop share one; on Postgres, those that arrive while a
    transaction is under way in its thread share the next. A transaction the connection
    failed under is made again (`Ledger.call`): every write here may be repeated (an insert
    that keeps the first row, an update to the same value)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.pending: list[tuple[list[tuple[str, dict[str, Any]]], asyncio.Future[None]]] = []
        self.flusher: asyncio.Task[None] | None = None

    async def write(self, writes: list[tuple[str, dict[str, Any]]]) -> None:
        """Make `writes` (statements with `:name` parameters) with the others that arrive
        meanwhile; returns once they are committed. A writer cancelled meanwhile leaves its
        writes to be made all the same."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self.pending.append((writes, done))
        if self.flusher is None or self.flusher.done():
            self.flusher = loop.create_task(self.flush())
        await done

    async def flush(self) -> None:
        """Commit what is pending, again and again until nothing is."""
        while self.pending:
            batch, self.pending = self.pending, []
            writes = [w for ws, _ in batch for w in ws]
            try:
                await self.ledger.call(self.ledger.write_many, writes)
            except asyncio.CancelledError:  # the loop ends: so do its writers
                for _, done in batch + self.pending:
                    done.cancel()
                raise
            except Exception as e:  # each writer of the batch learns it
                for _, done in batch:
                    if not done.done():
                        done.set_exception(e)
                continue
            for _, done in batch:
                if not done.done():
                    done.set_result(None)


class KeptQuestions:
    """A store's ledger as the `questions.Recorder` of its runs' questions."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    async def ask(self, question: Question) -> Answer | None:
        text = orjson.dumps(question.to_dict()).decode()
        found = await self.ledger.call(self.ledger.ask, question.run_id, question.id, text)
        return Answer.from_dict(orjson.loads(found)) if found is not None else None

    async def answered(self, question: Question) -> Answer | None:
        found = await self.ledger.call(self.ledger.question, question.run_id, question.id)
        if found is None or found[1] is None:
            return None
        return Answer.from_dict(orjson.loads(found[1]))

    async def answer(self, question: Question, answer: Answer) -> bool:
        text = orjson.dumps(answer.to_dict()).decode()
        return await self.ledger.call(self.ledger.give_answer, question.run_id, question.id, text)
