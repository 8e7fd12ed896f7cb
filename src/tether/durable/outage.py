"""When the store stops answering: how long runs wait for it, what is said, and how soon a
dead connection is noticed.

DBOS waits for its database without end: a step that cannot record its result retries the
write, with a back-off of up to a minute, until the database answers, and every retry of every
thread logs a warning with the driver's whole message (a `tether run` whose Postgres went away
printed 4,530 lines in 40 s and never ended). Waiting is right for a blip, so runs still wait,
but for `STORE_PATIENCE_S` only; then `DurableRuns` stops the runs it executes, which end
`failed` with `StoreUnavailable` here and stay PENDING in the store, where nothing they
completed is lost (see `durable.DurableRuns.give_up`). While it waits, `QuietStoreLog` says
that the store does not answer once every `SAY_EVERY_S`, in one line.

A connection that hangs rather than fails (a network that drops packets) is noticed by the
libpq keep-alives below within about 30 s; a store that accepts and then never answers is
noticed only by the patience, which counts from the last query that came back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import ConfigError, StoreUnavailable
from ..redact import scrub

STORE_PATIENCE_S = 30.0
"""How long the runs a process executes wait for a store that stopped answering."""

SAY_EVERY_S = 30.0

POSTGRES_CONNECT_ARGS = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,  # ms: data sent and never acknowledged
}
"""libpq settings for every connection to a Postgres store: a peer that went silent is found
by TCP keep-alives (10 s idle, then 3 probes 5 s apart) instead of never."""

TROUBLE = re.compile(r"OperationalError|connection|could not connect|server closed", re.I)
CAUSES = re.compile(
    r'connection to server at "[^"\n]*", port \d+ failed: [^\n]+'
    r"|server closed the connection unexpectedly|timeout expired|database is locked"
    r"|could not connect[^\n]*|connection is lost|unable to open database file"
)


def cause_of(text: str) -> str:
    """The driver's own words for what went wrong, on one line, without the wrapping of
    SQLAlchemy and DBOS around them (redacted all the same, though libpq names the host and
    port of a store, never its password)."""
    found = CAUSES.search(text)
    lines = text.strip().splitlines()
    line = found.group(0) if found else lines[0] if lines else "no reply"
    return scrub(line.strip())[:200]


class QuietStoreLog(logging.Filter):
    """On DBOS's logger, while a process owns a store: the store's connection trouble is said
    in one line every `SAY_EVERY_S` (the rest is dropped), and the last cause is kept for the
    error the runs end with. Anything else DBOS logs passes unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self.cause: str | None = None
        self.said_at = float("-inf")

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if text.startswith("Asyncio task cancelled for workflow"):
            return False  # a run stopped by Tether, which says why itself
        if record.levelno < logging.WARNING or not TROUBLE.search(text):
            return True
        self.cause = cause_of(text)
        now = time.monotonic()
        if now - self.said_at < SAY_EVERY_S:
            return False
        self.said_at = now
        record.msg, record.args, record.exc_info, record.exc_text = (
            f"the store does not answer ({self.cause})",
            (),
            None,
            None,
        )
        return True

    def install(self) -> QuietStoreLog:
        logging.getLogger("dbos").addFilter(self)
        return self


@contextmanager
def said_by_us() -> Iterator[None]:
    """Drop DBOS's words on the store's trouble while a block that says it itself runs (a
    client that cannot connect raises StoreUnavailable; DBOS logs the driver's whole error
    first)."""

    def drop(record: logging.LogRecord) -> bool:
        return record.levelno < logging.WARNING or not TROUBLE.search(record.getMessage())

    log = logging.getLogger("dbos")
    log.addFilter(drop)
    try:
        yield
    finally:
        log.removeFilter(drop)


MISSING_DATABASE = re.compile(r'database "(?P<name>[^"]+)" does not exist')


def cannot_open(e: Exception) -> StoreUnavailable | ConfigError:
    """The error of a store that could not be opened (a command's start, a client): a
    database that does not exist is the command's mistake, said in one line (exit 2, as a
    SQLite file that is not there), not an outage to wait out."""
    cause = cause_of(str(e))
    missing = MISSING_DATABASE.search(cause)
    if missing:
        return ConfigError(
            f"--store: the database {missing['name']} does not exist on that server: create "
            f"it (createdb {missing['name']}) or name another"
        )
    return StoreUnavailable(f"cannot open the store: {cause}")


def unavailable(patience: float, cause: str | None, run_id: str | None = None) -> StoreUnavailable:
    """The error of a run (or a start) that waited `patience` seconds for the store."""
    why = f" ({cause})" if cause else " (no reply)"
    text = f"the store did not answer for {patience:g} s{why}"
    if run_id is not None:
        text += (
            f"; what run {run_id} completed is kept there, and `tether resume {run_id}` goes "
            "on from it once the store answers"
        )
    return StoreUnavailable(text)


def cancelled_among(run_ids: list[str]) -> asyncio.Future[list[str]]:
    """Which of `run_ids` are cancelled in the store, asked from a thread of its own: while
    the store does not answer, DBOS's call waits for it, and a daemon thread that waits does
    not hold up the process's exit (the default executor's threads would)."""
    from dbos import DBOS

    loop = asyncio.get_running_loop()
    answer: asyncio.Future[list[str]] = loop.create_future()

    def settle(found: list[str] | None, error: BaseException | None) -> None:
        if answer.done():
            return
        if error is not None:
            answer.set_exception(error)
        else:
            answer.set_result(found or [])

    def ask() -> None:
        found, error = None, None
        try:
            rows = DBOS.list_workflows(
                workflow_ids=run_ids, status="CANCELLED", load_input=False, load_output=False
            )
            found = [w.workflow_id for w in rows]
        except Exception as e:
            error = e
        with contextlib.suppress(RuntimeError):  # the loop closed while the store kept us
            loop.call_soon_threadsafe(settle, found, error)

    threading.Thread(target=ask, name="tether-store-watch", daemon=True).start()
    return answer
