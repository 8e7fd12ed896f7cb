"""Accounts' limits and spend in a store's ledger, shared by every process on it (`accounts.py`
says what is kept and why).

Three tables: an account's limits (`tether_account_limits`, JSON), what it spent per period
(`tether_account_spend`: `day:2026-12-04`, `month:2026-12`, `total`) and what calls in flight
hold (`tether_account_held`, by run and call, with the periods it was reserved in).

A reservation locks the account's limits row (`FOR UPDATE` on Postgres, so two workers
reserving for one account take turns; on SQLite `BEGIN IMMEDIATE` makes every writer of the
file take turns already), reads what is spent and held, and inserts the call's row. On SQLite
that is one transaction of three statements on the event loop; on Postgres one call of a
function (`RESERVE_FUNCTION`), one round trip, as each round trip costs the client about 0.35
ms of CPU here (`bench/accounts.py`: five of them were +2.2 ms a model call).

A settlement only writes: the call's row deleted and its use added to the spend, in one
transaction that the ledger's group commit shares with the other runs' records
(`ledger.Writer`), so a reservation sees a call held or spent, never both nor neither. An
account with no limits reserves nothing: its calls' use is added up, one read and no lock a
call.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson

from ..accounts import PERIODS, Cost, Limits, Period, Standing, periods_at
from .ledger import SCHEMA_LOCK, Ledger, Writes
from .statements import Params, Run

ADDED = (
    " ON CONFLICT (account, period) DO UPDATE SET usd = tether_account_spend.usd + excluded.usd, "
    "tokens = tether_account_spend.tokens + excluded.tokens"
)
"""A period's spend row made, or the new use added to it."""
SPEND_FROM_HELD = (
    "INSERT INTO tether_account_spend SELECT account, {period}, :u, :t FROM tether_account_held "
    "WHERE run_id = :r AND key = :k" + ADDED
)
SETTLE = [
    SPEND_FROM_HELD.format(period="'day:' || day"),
    SPEND_FROM_HELD.format(period="'month:' || month"),
    SPEND_FROM_HELD.format(period="'total'"),
    "DELETE FROM tether_account_held WHERE run_id = :r AND key = :k",
]
"""A held call's settlement: its use added to the periods it was reserved in, then its row
deleted; a call no longer held (released, or settled) changes nothing."""
SETTLE_POSTGRES = [
    "WITH gone AS (DELETE FROM tether_account_held WHERE run_id = :r AND key = :k "
    "RETURNING account, day, month) "
    "INSERT INTO tether_account_spend SELECT account, p, :u, :t FROM gone, LATERAL "
    "(VALUES ('day:' || day), ('month:' || month), ('total')) AS v (p)" + ADDED
]
"""The same in one statement, as Postgres can (SQLite has no DELETE in a WITH)."""
UNHELD = (
    "INSERT INTO tether_account_spend SELECT :a, :p, :u, :t WHERE NOT EXISTS "
    "(SELECT 1 FROM tether_account_held WHERE run_id = :r AND key = :k) AND NOT EXISTS "
    "(SELECT 1 FROM tether_account_limits WHERE account = :a)" + ADDED
)
"""A call of an account with no limits (nothing was held for it) added up, in the periods of
now; put before `SETTLE`, whose delete would hide a held row. Which of the two applies is read
from the store in the settling transaction, never from this process's memory: a call reserved
by one process and settled by another (a worker, or a run resumed after a crash) was added as
unheld while its held row stayed, counted twice and held for good (#65)."""
STANDING = (
    "SELECT 'spent', period, '', usd, tokens, '', '' FROM tether_account_spend "
    "WHERE account = :a AND period IN (:d, :m, 'total') UNION ALL "
    "SELECT 'held', day, month, usd, tokens, run_id, key FROM tether_account_held "
    "WHERE account = :a"
)
LIMITS = (
    "SELECT 'limits', limits, '', 0.0, 0, '', '' FROM tether_account_limits "
    "WHERE account = :a UNION ALL "
)
"""Put before `STANDING`: the account's limits in the same read (`kind` 'limits')."""


RESERVE_FUNCTION = """
CREATE OR REPLACE FUNCTION tether_reserve(
    a TEXT, r TEXT, k TEXT, u DOUBLE PRECISION, t BIGINT, d TEXT, m TEXT, at DOUBLE PRECISION
) RETURNS TEXT LANGUAGE plpgsql AS $fn$
DECLARE
    lim JSONB;
    own RECORD;
    usd_day DOUBLE PRECISION; usd_month DOUBLE PRECISION; usd_all DOUBLE PRECISION;
    tok_day DOUBLE PRECISION; tok_month DOUBLE PRECISION; tok_all DOUBLE PRECISION;
BEGIN
    SELECT CAST(limits AS JSONB) INTO lim FROM tether_account_limits WHERE account = a
        FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'unlimited';
    END IF;
    DELETE FROM tether_account_held WHERE run_id = r AND key = k
        RETURNING usd, tokens, day, month INTO own;
    IF FOUND THEN  -- an attempt a crash cut short: counted at its estimate
        INSERT INTO tether_account_spend VALUES
            (a, 'day:' || own.day, own.usd, own.tokens),
            (a, 'month:' || own.month, own.usd, own.tokens),
            (a, 'total', own.usd, own.tokens)
        ON CONFLICT (account, period) DO UPDATE SET
            usd = tether_account_spend.usd + excluded.usd,
            tokens = tether_account_spend.tokens + excluded.tokens;
    END IF;
    SELECT COALESCE(MAX(usd) FILTER (WHERE period = 'day:' || d), 0),
           COALESCE(MAX(usd) FILTER (WHERE period = 'month:' || m), 0),
           COALESCE(MAX(usd) FILTER (WHERE period = 'total'), 0),
           COALESCE(MAX(tokens) FILTER (WHERE period = 'day:' || d), 0),
           COALESCE(MAX(tokens) FILTER (WHERE period = 'month:' || m), 0),
           COALESCE(MAX(tokens) FILTER (WHERE period = 'total'), 0)
      INTO usd_day, usd_month, usd_all, tok_day, tok_month, tok_all
      FROM tether_account_spend
     WHERE account = a AND period IN ('day:' || d, 'month:' || m, 'total');
    SELECT usd_day + COALESCE(SUM(h.usd) FILTER (WHERE h.day = d), 0),
           usd_month + COALESCE(SUM(h.usd) FILTER (WHERE h.month = m), 0),
           usd_all + COALESCE(SUM(h.usd), 0),
           tok_day + COALESCE(SUM(h.tokens) FILTER (WHERE h.day = d), 0),
           tok_month + COALESCE(SUM(h.tokens) FILTER (WHERE h.month = m), 0),
           tok_all + COALESCE(SUM(h.tokens), 0)
      INTO usd_day, usd_month, usd_all, tok_day, tok_month, tok_all
      FROM tether_account_held AS h WHERE h.account = a;
    IF usd_day >= COALESCE(CAST(lim ->> 'cost_per_day' AS DOUBLE PRECISION), 'Infinity')
       OR usd_month >= COALESCE(CAST(lim ->> 'cost_per_month' AS DOUBLE PRECISION), 'Infinity')
       OR usd_all >= COALESCE(CAST(lim ->> 'cost_total' AS DOUBLE PRECISION), 'Infinity')
       OR tok_day >= COALESCE(CAST(lim ->> 'tokens_per_day' AS DOUBLE PRECISION), 'Infinity')
       OR tok_month >= COALESCE(CAST(lim ->> 'tokens_per_month' AS DOUBLE PRECISION), 'Infinity')
       OR tok_all >= COALESCE(CAST(lim ->> 'tokens_total' AS DOUBLE PRECISION), 'Infinity')
    THEN
        RETURN 'refused';
    END IF;
    INSERT INTO tether_account_held VALUES (r, k, a, u, t, d, m, at);
    RETURN 'held';
END
$fn$
"""
"""A reservation on Postgres in one round trip: `Standing.refusal`'s rule (a limit that spent
plus held has reached refuses) said again in SQL, in one statement that needs no transaction
of its own (five round trips were 2.2 ms of CPU a call). Python says why when it refuses."""


def release_in(ledger: Ledger, run_id: str) -> None:
    """Count what the run still holds as spent, at its estimates: a call whose step was never
    recorded (it failed after the call, or its worker died and the run was cancelled) may have
    been paid for. A settlement that comes later for one of them finds nothing held and adds
    nothing: each call is counted once."""
    settle_sql = SETTLE if ledger.conn is not None else SETTLE_POSTGRES
    with ledger.transaction() as run:
        sql = "SELECT key, usd, tokens FROM tether_account_held WHERE run_id = :r"
        for key, usd, tokens in run(sql, {"r": run_id}):
            for settle in settle_sql:
                run(settle, {"r": run_id, "k": key, "u": float(usd), "t": int(tokens)})


def spend_key(period: Period, name: str) -> str:
    return "total" if period == "total" else f"{period}:{name}"


class StoredAccounts:
    """`accounts.Accounts` kept in a store's ledger."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.lock = "" if ledger.conn is not None else " FOR UPDATE"  # SQLite: see above
        self.settle_sql = SETTLE if ledger.conn is not None else SETTLE_POSTGRES
        if ledger.engine is not None:  # one process at a time (see `ledger.SCHEMA_LOCK`)
            with ledger.transaction() as run:
                run("SELECT pg_advisory_xact_lock(:k)", {"k": SCHEMA_LOCK})
                run(RESERVE_FUNCTION, {})

    # -- reads and writes, each one transaction (run in a thread on Postgres: `Ledger.call`)

    def limits_in(self, run: Run, account: str, lock: bool = True) -> Limits | None:
        sql = "SELECT limits FROM tether_account_limits WHERE account = :a"
        rows = run(sql + (self.lock if lock else ""), {"a": account})
        return Limits.from_dict(orjson.loads(rows[0][0])) if rows else None

    def standing_in(
        self, run: Run, account: str, limits: Limits | None, now: float, mine: tuple[str, str]
    ) -> tuple[Standing, Cost | None]:
        """The account in the periods of `now`, in one read; and what the call `mine` (run id,
        key) holds already, if it does."""
        names = periods_at(now)
        found = Standing(account, limits)
        found.spent = {p: Cost() for p in PERIODS}
        found.held = {p: Cost() for p in PERIODS}
        keys = {spend_key(p, n): p for p, n in names.items()}
        own = None
        params = {"a": account, "d": f"day:{names['day']}", "m": f"month:{names['month']}"}
        for kind, day, month, usd, tokens, run_id, key in run(STANDING, params):
            cost = Cost(float(usd), int(tokens))
            if kind == "limits":
                found.limits = Limits.from_dict(orjson.loads(day))
            elif kind == "spent":
                found.spent[keys[day]] = cost
                continue
            if (run_id, key) == mine:
                own = cost
            found.held["total"] += cost
            found.held["month"] += cost if month == names["month"] else Cost()
            found.held["day"] += cost if day == names["day"] else Cost()
        return found, own

    def reserve_now(self, account: str, run_id: str, key: str, cost: Cost) -> str:
        if self.ledger.engine is not None and cost.priced:
            return self.reserve_in_one(account, run_id, key, cost)
        now = time.time()
        with self.ledger.transaction() as run:
            limits = self.limits_in(run, account)  # locked first: see above
            if limits is None:
                return ""
            standing, own = self.standing_in(run, account, limits, now, (run_id, key))
            if own is not None:  # an attempt a crash cut short: counted at its estimate
                params = {"r": run_id, "k": key, "u": own.usd, "t": own.tokens}
                for sql in self.settle_sql:
                    run(sql, params)
                standing = self.standing_in(run, account, limits, now, ("", ""))[0]
            refused = standing.refusal(cost)
            if refused:
                return refused
            names = periods_at(now)
            run(
                "INSERT INTO tether_account_held VALUES (:r, :k, :a, :u, :t, :d, :m, :at)",
                {
                    "r": run_id,
                    "k": key,
                    "a": account,
                    "u": cost.usd,
                    "t": cost.tokens,
                    "d": names["day"],
                    "m": names["month"],
                    "at": now,
                },
            )
        return ""

    def reserve_in_one(self, account: str, run_id: str, key: str, cost: Cost) -> str:
        """`reserve_now` on Postgres, in one round trip (`RESERVE_FUNCTION`)."""
        now = time.time()
        names = periods_at(now)
        params = {"a": account, "r": run_id, "k": key, "u": cost.usd, "t": cost.tokens}
        params.update(d=names["day"], m=names["month"], at=now)
        sql = "SELECT tether_reserve(:a, :r, :k, :u, :t, :d, :m, :at)"
        verdict = self.ledger.once(sql, params)[0][0]
        if verdict != "refused":
            return ""
        why = self.standing_now(account).refusal(cost)  # the limit reached, said as Python says it
        return why or f"account budget: {account} has reached one of its limits"

    def release_now(self, run_id: str) -> None:
        release_in(self.ledger, run_id)

    def set_now(self, account: str, limits: Limits | None) -> None:
        with self.ledger.transaction() as run:
            run("DELETE FROM tether_account_limits WHERE account = :a", {"a": account})
            if limits is not None:
                text = orjson.dumps(limits.to_dict()).decode()
                run(
                    "INSERT INTO tether_account_limits VALUES (:a, :l, :t)",
                    {"a": account, "l": text, "t": time.time()},
                )

    def standing_now(self, account: str) -> Standing:
        """The account with its limits, in one statement (one round trip on Postgres, where a
        transaction of two was 1.2 ms of CPU a new run of an account)."""

        def once(sql: str, params: Params) -> list[tuple[Any, ...]]:
            if not isinstance(params, dict):  # `Run` also takes a list, for executemany
                raise TypeError("a statement on its own takes one set of parameters")
            return self.ledger.once(LIMITS + sql, params)

        return self.standing_in(once, account, None, time.time(), ("", ""))[0]

    def names_now(self) -> list[str]:
        sql = (
            "SELECT account FROM tether_account_limits UNION SELECT account FROM "
            "tether_account_spend UNION SELECT account FROM tether_account_held"
        )
        return sorted(str(a) for (a,) in self.ledger.read(sql, {}))

    # -- `accounts.Accounts` -----------------------------------------------------------------

    async def reserve(self, account: str, run_id: str, key: str, cost: Cost) -> str:
        return await self.ledger.call(self.reserve_now, account, run_id, key, cost)

    def settlement(self, account: str, run_id: str, key: str, cost: Cost) -> Writes:
        """The writes that settle a call: its held row moved to the spend, or, for a call of an
        account with no limits (nothing held), its use added up (`UNHELD`). A call held no
        longer (released: counted at its estimate) adds nothing."""
        params = {"r": run_id, "k": key, "u": cost.usd, "t": cost.tokens, "a": account}
        unheld = [
            (UNHELD, {**params, "p": spend_key(p, n)}) for p, n in periods_at(time.time()).items()
        ]
        return [*unheld, *((sql, params) for sql in self.settle_sql)]

    async def settle(self, account: str, run_id: str, key: str, cost: Cost) -> None:
        await self.ledger.writer.write(list(self.settlement(account, run_id, key, cost)))

    async def release(self, run_id: str) -> None:
        await self.ledger.call(self.release_now, run_id)

    async def set_limits(self, account: str, limits: Limits | None) -> None:
        await self.ledger.call(self.set_now, account, limits)

    async def standing(self, account: str) -> Standing:
        return await self.ledger.call(self.standing_now, account)

    async def accounts(self) -> list[Standing]:
        names = await self.ledger.call(self.names_now)
        return [await self.standing(a) for a in names]

    async def pause(self, seconds: float) -> None:
        await asyncio.sleep(seconds)  # another process may make the room: ask it again then
