"""Accounts' limits and spend in a store's ledger, shared by every process on it (`accounts.py`
says what is kept and why).

Three tables: an account's limits (`tether_account_limits`, JSON), what it spent per period
(`tether_account_spend`: `day:2026-12-04`, `month:2026-12`, `total`) and what calls in flight
hold (`tether_account_held`, by run and call, with the periods it was reserved in). A
reservation is one transaction: on Postgres it locks the account's limits row (`FOR UPDATE`),
so two workers reserving for one account take turns, and reads what is spent and held under
that lock; on SQLite, `BEGIN IMMEDIATE` makes every writer of the file take turns already. A
settlement takes the same lock, so a reservation never reads the spend from before a
settlement and the held calls from after it.
"""

from __future__ import annotations

import asyncio
import time

import orjson

from ..accounts import PERIODS, Cost, Limits, Period, Standing, periods_at
from .ledger import Ledger, Run

SPEND = (
    "INSERT INTO tether_account_spend VALUES (:a, :p, :u, :t) ON CONFLICT (account, period) "
    "DO UPDATE SET usd = tether_account_spend.usd + excluded.usd, "
    "tokens = tether_account_spend.tokens + excluded.tokens"
)


def spend_key(period: Period, name: str) -> str:
    return "total" if period == "total" else f"{period}:{name}"


class StoredAccounts:
    """`accounts.Accounts` kept in a store's ledger."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.lock = "" if ledger.conn is not None else " FOR UPDATE"  # SQLite: see above

    # -- reads and writes, each one transaction (run in a thread on Postgres: `Ledger.call`)

    def limits_in(self, run: Run, account: str) -> Limits | None:
        sql = f"SELECT limits FROM tether_account_limits WHERE account = :a{self.lock}"
        rows = run(sql, {"a": account})
        return Limits.from_dict(orjson.loads(rows[0][0])) if rows else None

    def standing_in(self, run: Run, account: str, limits: Limits | None, now: float) -> Standing:
        names = periods_at(now)
        found = Standing(
            account, limits, {p: Cost() for p in PERIODS}, {p: Cost() for p in PERIODS}
        )
        keys = {spend_key(p, n): p for p, n in names.items()}
        for key, usd, tokens in run(
            "SELECT period, usd, tokens FROM tether_account_spend WHERE account = :a",
            {"a": account},
        ):
            if key in keys:
                found.spent[keys[key]] = Cost(float(usd), int(tokens))
        for day, month, usd, tokens in run(
            "SELECT day, month, usd, tokens FROM tether_account_held WHERE account = :a",
            {"a": account},
        ):
            held = Cost(float(usd), int(tokens))
            found.held["total"] += held
            if month == names["month"]:
                found.held["month"] += held
            if day == names["day"]:
                found.held["day"] += held
        return found

    def reserve_now(self, account: str, run_id: str, key: str, cost: Cost) -> str:
        now = time.time()
        with self.ledger.transaction() as run:
            limits = self.limits_in(run, account)  # locked first: see above
            self.presume_spent(run, account, run_id, key)
            if limits is not None:
                refused = self.standing_in(run, account, limits, now).refusal(cost)
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

    def presume_spent(self, run: Run, account: str, run_id: str, key: str) -> None:
        """A call that holds a reservation as it is reserved again was made by an attempt a
        crash cut short: it may have reached the model, and nobody saw what it used, so its
        estimate counts as spent (a call is never counted as less than it may have cost)."""
        found = run(
            "SELECT usd, tokens FROM tether_account_held WHERE run_id = :r AND key = :k",
            {"r": run_id, "k": key},
        )
        if found:
            self.settle_in(run, account, run_id, key, Cost(float(found[0][0]), int(found[0][1])))

    def settle_in(self, run: Run, account: str, run_id: str, key: str, cost: Cost) -> None:
        found = run(
            "SELECT day, month FROM tether_account_held WHERE run_id = :r AND key = :k",
            {"r": run_id, "k": key},
        )
        if not found:
            return  # settled already (a replay), or released
        sql = "DELETE FROM tether_account_held WHERE run_id = :r AND key = :k"
        run(sql, {"r": run_id, "k": key})
        day, month = found[0]
        for period in (f"day:{day}", f"month:{month}", "total"):
            run(SPEND, {"a": account, "p": period, "u": cost.usd, "t": cost.tokens})

    def settle_now(self, account: str, run_id: str, key: str, cost: Cost) -> None:
        with self.ledger.transaction() as run:
            self.limits_in(run, account)  # the lock, if the account has limits
            self.settle_in(run, account, run_id, key, cost)

    def release_now(self, run_id: str) -> None:
        with self.ledger.transaction() as run:
            run("DELETE FROM tether_account_held WHERE run_id = :r", {"r": run_id})

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
        with self.ledger.transaction() as run:
            sql = "SELECT limits FROM tether_account_limits WHERE account = :a"
            rows = run(sql, {"a": account})
            limits = Limits.from_dict(orjson.loads(rows[0][0])) if rows else None
            return self.standing_in(run, account, limits, time.time())

    def names_now(self) -> list[str]:
        sql = (
            "SELECT account FROM tether_account_limits UNION SELECT account FROM "
            "tether_account_spend UNION SELECT account FROM tether_account_held"
        )
        return sorted(str(a) for (a,) in self.ledger.read(sql, {}))

    # -- `accounts.Accounts` -----------------------------------------------------------------

    async def reserve(self, account: str, run_id: str, key: str, cost: Cost) -> str:
        return await self.ledger.call(self.reserve_now, account, run_id, key, cost)

    async def settle(self, account: str, run_id: str, key: str, cost: Cost) -> None:
        await self.ledger.call(self.settle_now, account, run_id, key, cost)

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
