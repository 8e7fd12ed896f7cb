"""What durable runs keep beside DBOS's tables: the journal of tool calls, the inbox of user
messages, and the workers' heartbeats.

The journal records each tool call's start before it runs and its result when it ends, so a
call is never repeated once it has finished, even when the DBOS step that ran it (one step for
all the calls of one reply) is retried after a crash: a finished call gives back its recorded
result, a call that started but never finished is rerun only if its tool is idempotent.

Images (a task's, a tool result's) are kept once each, by their sha256: a run's records (DBOS's
and the journal) carry them without their bytes, however often they name them.

The inbox holds `tether send` messages, numbered per run. A model step reads the messages past
the last one the run has seen and returns them with the reply, so DBOS records which messages
went into which call; a replay delivers the same ones, and nothing needs marking as consumed.

For a SQLite store these tables live in a file beside it (`PATH-effects`): sharing DBOS's file
would make every write here wait for its write lock. One connection serves the process, used on
the event loop itself: a write in WAL mode takes microseconds, far less than a hop to a thread.
For Postgres the tables share the database, reached through SQLAlchemy in a worker thread.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal, TypeVar

import orjson

from .journal import private_file
from .messages import ImagePart, ToolResult
from .outage import POSTGRES_CONNECT_ARGS

TABLES = (
    "CREATE TABLE IF NOT EXISTS tether_tool_calls (run_id TEXT NOT NULL, call_id TEXT NOT NULL, "
    "attempt TEXT NOT NULL, started_at DOUBLE PRECISION NOT NULL, result TEXT, "
    "PRIMARY KEY (run_id, call_id))",
    "CREATE TABLE IF NOT EXISTS tether_inbox (run_id TEXT NOT NULL, seq INTEGER NOT NULL, "
    "text TEXT NOT NULL, sent_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (run_id, seq))",
    "CREATE TABLE IF NOT EXISTS tether_executors (executor_id TEXT PRIMARY KEY, "
    "last_beat DOUBLE PRECISION NOT NULL)",
    # BYTEA: Postgres's bytes; SQLite keeps bytes as they are under any type name
    "CREATE TABLE IF NOT EXISTS tether_images (sha256 TEXT PRIMARY KEY, "
    "media_type TEXT NOT NULL, data BYTEA NOT NULL)",
)

CallState = Literal["fresh", "finished", "interrupted"]

SCHEMA_LOCK = 0x7E7E_0001
"""The Postgres advisory lock under which a process creates the ledger's tables: two workers
starting at once on a fresh database both ran CREATE TABLE IF NOT EXISTS, and one of them
died of a duplicate key in Postgres's catalog (pg_type_typname_nsp_index)."""

RETRY_FIRST_S = 0.1
RETRY_MAX_S = 5.0


def connection_lost(e: Exception) -> bool:
    """Whether a Postgres call failed for want of its connection (the server went away, the
    network dropped it, no connection came free in time), not for what it asked."""
    from sqlalchemy import exc

    if isinstance(e, (exc.OperationalError, exc.TimeoutError)):
        return True
    return isinstance(e, exc.DBAPIError) and e.connection_invalidated


T = TypeVar("T")
Run = Callable[[str, dict[str, Any]], list[tuple[Any, ...]]]
"""Executes one statement (`:name` parameters) in the open transaction; the rows it returned."""


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
        self.conn: sqlite3.Connection | None = None
        self.engine: Any = None
        if store.startswith("sqlite:///"):
            path = store.removeprefix("sqlite:///") + "-effects"
            private_file(path)
            self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")  # see durable.tune_sqlite
            self.conn.execute("PRAGMA busy_timeout=30000")
        else:
            from sqlalchemy import create_engine

            self.engine = create_engine(
                ledger_url(store),
                pool_size=connections,
                max_overflow=0,
                connect_args=dict(POSTGRES_CONNECT_ARGS),
            )
        with self.transaction() as run:
            if self.engine is not None:  # one process at a time (see SCHEMA_LOCK)
                run("SELECT pg_advisory_xact_lock(:k)", {"k": SCHEMA_LOCK})
            for ddl in TABLES:
                run(ddl, {})

    @contextmanager
    def transaction(self) -> Iterator[Run]:
        if self.conn is not None:
            conn = self.conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield lambda sql, params: conn.execute(sql, params).fetchall()
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return
        from sqlalchemy import text

        with self.engine.begin() as c:

            def run(sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
                result = c.execute(text(sql), params)
                return [tuple(r) for r in result] if result.returns_rows else []

            yield run

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

    # -- the journal of tool calls -----------------------------------------------------------

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
                run(
                    "INSERT INTO tether_tool_calls VALUES (:r, :c, :a, :t, NULL) "
                    "ON CONFLICT (run_id, call_id) DO NOTHING",
                    {**key, "a": attempt, "t": now},
                )
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

    def finish_call(self, run_id: str, result: ToolResult) -> None:
        """Record a call's result (its images by name: `keep_images` has their bytes)."""
        data: dict[str, Any] = {
            "name": result.name,
            "output": result.output,
            "is_error": result.is_error,
        }
        if result.images:
            data["images"] = [i.ref for i in result.images]
        with self.transaction() as run:
            run(
                "UPDATE tether_tool_calls SET result = :x WHERE run_id = :r AND call_id = :c",
                {"x": orjson.dumps(data).decode(), "r": run_id, "c": result.call_id},
            )

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
                with self.transaction() as run:
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
                if "unique" not in str(e).lower() and "duplicate" not in str(e).lower():
                    raise
        raise RuntimeError(f"could not append to the inbox of {run_id}")

    def messages_after(self, run_id: str, seq: int) -> list[tuple[int, str]]:
        sql = "SELECT seq, text FROM tether_inbox WHERE run_id = :r AND seq > :s ORDER BY seq"
        if self.conn is not None:  # a read needs no transaction of its own
            rows = self.conn.execute(sql, {"r": run_id, "s": seq}).fetchall()
        else:
            with self.transaction() as run:
                rows = run(sql, {"r": run_id, "s": seq})
        return [(int(s), str(t)) for s, t in rows]

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
        return dead


def recorded_result(call_id: str, d: dict[str, Any]) -> ToolResult:
    """A result as `finish_call` recorded it; its images without their bytes."""
    images = tuple(map(ImagePart.from_ref, d.get("images", ())))
    return ToolResult(call_id, d["name"], d["output"], d["is_error"], images)
