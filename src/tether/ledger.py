"""What durable runs keep beside DBOS's tables: the journal of tool calls, the inbox of user
messages, and the workers' heartbeats.

The journal records each tool call's start before it runs and its result when it ends, so a
call is never repeated once it has finished, even when the DBOS step that ran it (one step for
all the calls of one reply) is retried after a crash: a finished call gives back its recorded
result, a call that started but never finished is rerun only if its tool is idempotent.

The inbox holds `tether send` messages, numbered per run. A model step reads the messages past
the last one the run has seen and returns them with the reply, so DBOS records which messages
went into which call; a replay delivers the same ones, and nothing needs marking as consumed.

For a SQLite store these tables live in a file beside it (`PATH-effects`): sharing DBOS's file
would make every write here wait for its write lock. For Postgres they share the database.
"""

from __future__ import annotations

import time
import uuid
from typing import Literal

import orjson

from .messages import ToolResult

TABLES = (
    "CREATE TABLE IF NOT EXISTS tether_tool_calls (run_id TEXT NOT NULL, call_id TEXT NOT NULL, "
    "attempt TEXT NOT NULL, started_at DOUBLE PRECISION NOT NULL, result TEXT, "
    "PRIMARY KEY (run_id, call_id))",
    "CREATE TABLE IF NOT EXISTS tether_inbox (run_id TEXT NOT NULL, seq INTEGER NOT NULL, "
    "text TEXT NOT NULL, sent_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (run_id, seq))",
    "CREATE TABLE IF NOT EXISTS tether_executors (executor_id TEXT PRIMARY KEY, "
    "last_beat DOUBLE PRECISION NOT NULL)",
)

CallState = Literal["fresh", "finished", "interrupted"]


def ledger_url(store: str) -> str:
    """SQLAlchemy's URL for the ledger of `store` (Postgres through psycopg 3, which DBOS
    installs; SQLAlchemy's default driver is psycopg2)."""
    if store.startswith("sqlite:///"):
        return store + "-effects"
    return store.replace("postgresql://", "postgresql+psycopg://", 1).replace(
        "postgres://", "postgresql+psycopg://", 1
    )


class Ledger:
    def __init__(self, store: str) -> None:
        from sqlalchemy import create_engine, text

        self.engine = create_engine(ledger_url(store))
        with self.engine.begin() as c:
            for ddl in TABLES:
                c.execute(text(ddl))

    # -- the journal of tool calls -----------------------------------------------------------

    def start_calls(
        self, run_id: str, call_ids: list[str]
    ) -> dict[str, tuple[CallState, ToolResult | None]]:
        """Record that these calls start (one transaction for all the calls of a reply), except
        those an earlier attempt started: for those, whether it finished (with its result) or
        was interrupted."""
        from sqlalchemy import bindparam, text

        attempt = uuid.uuid4().hex
        now = time.time()
        with self.engine.begin() as c:
            c.execute(
                text(
                    "INSERT INTO tether_tool_calls VALUES (:r, :c, :a, :t, NULL) "
                    "ON CONFLICT (run_id, call_id) DO NOTHING"
                ),
                [{"r": run_id, "c": i, "a": attempt, "t": now} for i in call_ids],
            )
            rows = c.execute(
                text(
                    "SELECT call_id, attempt, result FROM tether_tool_calls "
                    "WHERE run_id = :r AND call_id IN :ids"
                ).bindparams(bindparam("ids", expanding=True)),
                {"r": run_id, "ids": call_ids},
            ).all()
        out: dict[str, tuple[CallState, ToolResult | None]] = {}
        for call_id, by, result in rows:
            if by == attempt:
                out[call_id] = ("fresh", None)
            elif result is None:
                out[call_id] = ("interrupted", None)
            else:
                d = orjson.loads(result)
                recorded = ToolResult(call_id, d["name"], d["output"], d["is_error"])
                out[call_id] = ("finished", recorded)
        return out

    def finish_call(self, run_id: str, result: ToolResult) -> None:
        from sqlalchemy import text

        data = {"name": result.name, "output": result.output, "is_error": result.is_error}
        with self.engine.begin() as c:
            c.execute(
                text("UPDATE tether_tool_calls SET result = :x WHERE run_id = :r AND call_id = :c"),
                {"x": orjson.dumps(data).decode(), "r": run_id, "c": result.call_id},
            )

    # -- the inbox --------------------------------------------------------------------------

    def send(self, run_id: str, message: str) -> int:
        """Append a user message to the run's inbox; its number."""
        from sqlalchemy import text
        from sqlalchemy.exc import IntegrityError

        for _ in range(20):
            try:
                with self.engine.begin() as c:
                    seq = c.execute(
                        text(
                            "SELECT COALESCE(MAX(seq), 0) + 1 FROM tether_inbox WHERE run_id = :r"
                        ),
                        {"r": run_id},
                    ).scalar_one()
                    c.execute(
                        text("INSERT INTO tether_inbox VALUES (:r, :s, :x, :t)"),
                        {"r": run_id, "s": seq, "x": message, "t": time.time()},
                    )
                return int(seq)
            except IntegrityError:  # a concurrent sender took that number
                continue
        raise RuntimeError(f"could not append to the inbox of {run_id}")

    def messages_after(self, run_id: str, seq: int) -> list[tuple[int, str]]:
        from sqlalchemy import text

        with self.engine.begin() as c:
            rows = c.execute(
                text(
                    "SELECT seq, text FROM tether_inbox WHERE run_id = :r AND seq > :s ORDER BY seq"
                ),
                {"r": run_id, "s": seq},
            ).all()
        return [(int(s), str(t)) for s, t in rows]

    # -- workers' heartbeats ----------------------------------------------------------------

    def beat(self, executor_id: str, dead_after: float) -> list[str]:
        """Record that this worker is alive; the executors silent for `dead_after` seconds
        (forgotten from now on, so only one worker recovers each)."""
        from sqlalchemy import text

        now = time.time()
        with self.engine.begin() as c:
            c.execute(
                text("DELETE FROM tether_executors WHERE executor_id = :e"), {"e": executor_id}
            )
            c.execute(
                text("INSERT INTO tether_executors VALUES (:e, :t)"), {"e": executor_id, "t": now}
            )
            dead = [
                str(row[0])
                for row in c.execute(
                    text("SELECT executor_id FROM tether_executors WHERE last_beat < :t"),
                    {"t": now - dead_after},
                )
            ]
            if dead:
                c.execute(
                    text("DELETE FROM tether_executors WHERE last_beat < :t"),
                    {"t": now - dead_after},
                )
        return dead

    def dispose(self) -> None:
        self.engine.dispose()
