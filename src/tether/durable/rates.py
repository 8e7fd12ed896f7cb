"""Endpoints' rate limits in a store's ledger, shared by every process on it (`rates.py` says
what they hold and why).

Two tables: an endpoint's rate and the pause a server asked for (`tether_rates`, a row per
endpoint), and the attempts admitted to a rated endpoint in its last window (`tether_rate_log`).

An endpoint with a rate is asked for each attempt: one transaction locks its row (`FOR UPDATE`
on Postgres, so two workers admitting to one key take turns; on SQLite `BEGIN IMMEDIATE` makes
every writer of the file take turns already), forgets the attempts past the window, reads the
rest and, when `rates.wait_for` says there is room, records this one. On Postgres that is one
call of a server function (`ADMIT_FUNCTION`), one round trip. Time is the database's on
Postgres (the workers' clocks may disagree; the window is one clock's), the process's on SQLite
(one machine).

Most endpoints have no rate, and asking the store before each of their attempts would cost a
round trip a model call (about 0.35 ms of CPU on Postgres, `bench/accounts.py`) for nothing.
So each process keeps the table's rows (`known`) and reads them again only when told the table
changed: a pause a server asked for, or a rate set or cleared (`tether limits rate`), is said
to every process as it is written (`notices.py`: a Postgres notification, a SQLite stamp
file), and heeded from their next attempt. The table is read again at least every `REFRESH_S`
too, should a notification be missed (a process not listening while its connection is down).
An endpoint absent from the table goes at once; one that a server paused waits out the pause
here; a rated one asks the store for each attempt.
"""

from __future__ import annotations

import time

import orjson

from ..rates import SLACK, Rate, RateStanding, wait_for, why_waiting
from .ledger import SCHEMA_LOCK, Ledger
from .notices import RATES
from .statements import Run

REFRESH_S = 1.0
"""How old this process's copy of the rates table may grow before it is read again, though no
process said it changed."""

ADMIT_FUNCTION = """
CREATE OR REPLACE FUNCTION tether_admit(e TEXT, t BIGINT) RETURNS TABLE (
    wait_s DOUBLE PRECISION, paused_s DOUBLE PRECISION, now_s DOUBLE PRECISION, rate_s TEXT
) LANGUAGE plpgsql AS $fn$
DECLARE
    lim JSONB; span DOUBLE PRECISION; req BIGINT; tok BIGINT;
    n BIGINT; used BIGINT; oldest DOUBLE PRECISION;
BEGIN
    now_s := EXTRACT(EPOCH FROM clock_timestamp());
    wait_s := 0;
    SELECT r.rate, r.paused_until INTO rate_s, paused_s FROM tether_rates AS r
     WHERE r.endpoint = e FOR UPDATE;
    IF NOT FOUND OR paused_s > now_s OR rate_s IS NULL THEN
        wait_s := GREATEST(COALESCE(paused_s, 0) - now_s, 0);
        RETURN NEXT;
        RETURN;
    END IF;
    lim := CAST(rate_s AS JSONB);
    span := CAST(lim ->> 'per' AS DOUBLE PRECISION) + {slack};
    req := CAST(lim ->> 'requests' AS BIGINT);
    tok := CAST(lim ->> 'tokens' AS BIGINT);
    DELETE FROM tether_rate_log AS l WHERE l.endpoint = e AND l.at <= now_s - span;
    SELECT COUNT(*), COALESCE(SUM(l.tokens), 0) INTO n, used FROM tether_rate_log AS l
     WHERE l.endpoint = e;
    IF req IS NOT NULL AND n >= req THEN  -- that one must leave first
        SELECT l.at INTO oldest FROM tether_rate_log AS l WHERE l.endpoint = e
         ORDER BY l.at OFFSET n - req LIMIT 1;
        wait_s := oldest + span - now_s;
    END IF;
    IF tok IS NOT NULL AND n > 0 AND used + t > tok THEN  -- the oldest leave first
        SELECT COALESCE(MIN(x.at) FILTER (WHERE used - x.gone + t <= tok), MAX(x.at))
          INTO oldest
          FROM (SELECT l.at, SUM(l.tokens) OVER (ORDER BY l.at ROWS UNBOUNDED PRECEDING)
                    AS gone
                  FROM tether_rate_log AS l WHERE l.endpoint = e) AS x;
        wait_s := GREATEST(wait_s, oldest + span - now_s);
    END IF;
    IF wait_s <= 0 THEN
        wait_s := 0;
        INSERT INTO tether_rate_log VALUES (e, now_s, t);
    END IF;
    RETURN NEXT;
END
$fn$
""".replace("{slack}", repr(SLACK))
"""An admission on Postgres in one round trip: `rates.wait_for` said again in SQL, in one
statement that needs no transaction of its own (the transaction of four statements it replaces
cost +1.96 ms of CPU a call, `bench/accounts.py --what rate`)."""


class StoredRates:
    """`rates.Rates` kept in a store's ledger."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        postgres = ledger.engine is not None
        self.lock = " FOR UPDATE" if postgres else ""  # SQLite: see above
        self.now_sql = "EXTRACT(EPOCH FROM clock_timestamp())" if postgres else ":now"
        self.later = "GREATEST" if postgres else "max"
        self.known: dict[str, tuple[Rate | None, float]] = {}
        """Each endpoint in the table: its rate, and until when (this process's clock,
        `time.monotonic`) a server's pause holds."""
        self.read_at = -REFRESH_S  # when `known` was read (monotonic)
        self.marked: int | None = None  # what was said of the table when `known` was read
        self.paused_here: dict[str, float] = {}
        """The pauses this process's own attempts were told of (monotonic), heeded at once:
        a read of the table begun before one was recorded does not know it."""
        if postgres:  # one process at a time (see `ledger.SCHEMA_LOCK`)
            with ledger.transaction() as run:
                run("SELECT pg_advisory_xact_lock(:k)", {"k": SCHEMA_LOCK})
                run(ADMIT_FUNCTION, {})

    def params(self, **given: object) -> dict[str, object]:
        """`given` and, on SQLite, the time now (Postgres reads its own clock)."""
        return given if self.ledger.engine is not None else {**given, "now": time.time()}

    # -- reads and writes, each one transaction (run in a thread on Postgres: `Ledger.call`)

    def stale(self) -> bool:
        """Whether `known` is to be read again: a process said the table changed, or it is
        older than `REFRESH_S`."""
        mark = self.ledger.notices.mark(RATES)
        if mark is not None and mark != self.marked:
            return True
        return time.monotonic() - self.read_at >= REFRESH_S

    def refresh_now(self) -> None:
        sql = f"SELECT endpoint, rate, paused_until - {self.now_sql} FROM tether_rates"
        mono = time.monotonic()
        marked = self.ledger.notices.mark(RATES)  # first: one said during the read: next time
        self.known = {
            str(endpoint): (rate_of(rate), mono + float(left))
            for endpoint, rate, left in self.ledger.read(sql, self.params())
        }
        self.read_at, self.marked = mono, marked

    def admit_now(self, endpoint: str, tokens: int) -> tuple[float, str]:
        """The rule for an endpoint with a rate, in one transaction (see the module docstring)."""
        if self.ledger.engine is not None:
            sql = "SELECT * FROM tether_admit(:e, :t)"
            wait, paused, now, rate = self.ledger.once(sql, {"e": endpoint, "t": tokens})[0]
            if wait <= 0:
                return 0.0, ""
            return float(wait), why_waiting(rate_of(rate), float(paused), float(now))
        with self.ledger.transaction() as run:
            sql = f"SELECT rate, paused_until, {self.now_sql} FROM tether_rates WHERE endpoint = :e"
            rows = run(sql + self.lock, self.params(e=endpoint))
            if not rows:
                return 0.0, ""  # cleared meanwhile
            rate, paused_until, now = rate_of(rows[0][0]), float(rows[0][1]), float(rows[0][2])
            admitted = self.recent_in(run, endpoint, rate, now)
            wait = wait_for(rate, paused_until, admitted, now, tokens)
            if wait > 0:
                return wait, why_waiting(rate, paused_until, now)
            run(
                "INSERT INTO tether_rate_log VALUES (:e, :at, :t)",
                {"e": endpoint, "at": now, "t": tokens},
            )
            return 0.0, ""

    def recent_in(
        self, run: Run, endpoint: str, rate: Rate | None, now: float
    ) -> list[tuple[float, int]]:
        """The attempts admitted in the endpoint's window, oldest first; older ones deleted."""
        since = now - (rate.per if rate is not None else 0.0) - SLACK
        params = {"e": endpoint, "since": since}
        run("DELETE FROM tether_rate_log WHERE endpoint = :e AND at <= :since", params)
        sql = "SELECT at, tokens FROM tether_rate_log WHERE endpoint = :e ORDER BY at"
        return [(float(at), int(t)) for at, t in run(sql, {"e": endpoint})]

    def pause_now(self, endpoint: str, seconds: float) -> None:
        until = f"{self.now_sql} + :s"
        with self.ledger.saying(RATES, endpoint) as run:
            run(
                f"INSERT INTO tether_rates VALUES (:e, NULL, {until}, {self.now_sql}) "
                f"ON CONFLICT (endpoint) DO UPDATE SET paused_until = "
                f"{self.later}(tether_rates.paused_until, excluded.paused_until)",
                self.params(e=endpoint, s=seconds),
            )

    def set_now(self, endpoint: str, rate: Rate | None) -> None:
        with self.ledger.saying(RATES, endpoint) as run:
            if rate is None:
                run("DELETE FROM tether_rates WHERE endpoint = :e", {"e": endpoint})
                run("DELETE FROM tether_rate_log WHERE endpoint = :e", {"e": endpoint})
            else:
                text = orjson.dumps(rate.to_dict()).decode()
                run(
                    f"INSERT INTO tether_rates VALUES (:e, :r, 0, {self.now_sql}) "
                    "ON CONFLICT (endpoint) DO UPDATE SET rate = excluded.rate",
                    self.params(e=endpoint, r=text),
                )
        self.read_at = -REFRESH_S  # heeded here from the next attempt

    def rates_now(self) -> list[RateStanding]:
        found = []
        with self.ledger.transaction() as run:
            sql = f"SELECT endpoint, rate, paused_until, {self.now_sql} FROM tether_rates"
            for endpoint, text, paused_until, now in run(sql + " ORDER BY endpoint", self.params()):
                rate = rate_of(text)
                since = float(now) - (rate.per if rate is not None else 0.0) - SLACK
                counted = run(
                    "SELECT COUNT(*), SUM(tokens) FROM tether_rate_log "
                    "WHERE endpoint = :e AND at > :since",
                    {"e": endpoint, "since": since},
                )[0]
                paused = max(0.0, float(paused_until) - float(now))
                found.append(
                    RateStanding(str(endpoint), rate, int(counted[0]), int(counted[1] or 0), paused)
                )
        return found

    # -- `rates.Rates` ------------------------------------------------------------------------

    def free(self, endpoint: str) -> bool:
        if self.stale() or endpoint in self.known:
            return False
        return self.paused_here.get(endpoint, 0.0) <= time.monotonic()

    async def try_admit(self, endpoint: str, tokens: int) -> tuple[float, str]:
        if self.stale():
            await self.ledger.call(self.refresh_now)
        rate, paused_until = self.known.get(endpoint, (None, 0.0))
        left = max(paused_until, self.paused_here.get(endpoint, 0.0)) - time.monotonic()
        if left > 0:  # paused: waited out here
            now = time.time()
            return left, why_waiting(rate, now + left, now)
        if rate is None:
            return 0.0, ""
        return await self.ledger.call(self.admit_now, endpoint, tokens)

    async def pause(self, endpoint: str, seconds: float) -> None:
        until = time.monotonic() + seconds
        self.paused_here[endpoint] = max(self.paused_here.get(endpoint, 0.0), until)
        await self.ledger.call(self.pause_now, endpoint, seconds)

    async def set_rate(self, endpoint: str, rate: Rate | None) -> None:
        await self.ledger.call(self.set_now, endpoint, rate)

    async def rates(self) -> list[RateStanding]:
        return await self.ledger.call(self.rates_now)


def rate_of(text: str | None) -> Rate | None:
    return Rate.from_dict(orjson.loads(text)) if text else None
