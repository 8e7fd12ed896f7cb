"""Budgets per account: what the runs of one customer may spend, across runs, processes and
machines, checked before every model call.

    tether limits set acme --cost-per-day 20
    tether run "..." --account acme       # halts `account budget: ...` before the call
                                          # that would pass $20 today, whichever worker makes it

A run belongs to an account when its context names one (`RunContext.account_id`). An account's
`Limits` bound its cost and tokens per day, per month (UTC) and in total. Before each model
call the run reserves the call's estimate (`estimate`) against its account; after it, the
reservation is settled with what the call really used. The rule is the tree's (`tree.py`): a
limit that is reached refuses the next call, where "reached" counts what is spent and what is
reserved by calls in flight, so parallel runs cannot all pass the last check at once: the most
an account pays past its limit is one call, and no more than its estimate when the estimate
holds.

A reservation is named by its run and the run's step (`key`): a durable run that a crash
interrupted mid-call makes that step again, elsewhere, under the same name, and finds the
reservation the crash left. That call may have reached the model and nobody saw what it used,
so its estimate is counted as spent, and the step reserves anew: none is lost for good, and a
call is never counted as less than it may have cost: one cancelled, timed out or whose stream
dropped is counted at its estimate too. One the server refused (an error status) costs nothing.

Where the book is kept: `MemoryAccounts` below, for the runs of one process; on a store, its
ledger (`durable/accounts.py`), for every process that shares it. Both keep `Accounts`.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, Protocol

from .errors import ConfigError
from .messages import Message, Usage, message_chars

Period = Literal["day", "month", "total"]
PERIODS: tuple[Period, ...] = ("day", "month", "total")
WhenOver = Literal["refuse", "queue"]
DEFAULT_OUTPUT_TOKENS = 1024
"""The reply a call's estimate allows for when the agent sets no `max_output_tokens`."""
CHARS_PER_TOKEN = 3
"""The estimate's tokens in a request: a character count over this (English runs about 4 a
token: 3 errs toward reserving more)."""


@dataclass(frozen=True)
class Limits:
    """An account's limits (None: no limit of that kind). `when_over` says what a new run of an
    account over a limit meets: refused at start (`refuse`), or started and held before its
    first model call until there is room (`queue`)."""

    cost_per_day: float | None = None
    cost_per_month: float | None = None
    cost_total: float | None = None
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None
    tokens_total: int | None = None
    when_over: WhenOver = "refuse"

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "when_over":
                if value not in ("refuse", "queue"):
                    raise ConfigError(f"when_over must be refuse or queue, not {value!r}")
            elif value is not None and (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
            ):
                raise ConfigError(f"{f.name} must be a number of 0 or more, not {value!r}")

    def bounds(self) -> Iterable[tuple[Period, str, float]]:
        """Each limit set: its period, what it counts ("cost" or "tokens") and its value."""
        for period in PERIODS:
            for what in ("cost", "tokens"):
                value = getattr(self, f"{what}_{'total' if period == 'total' else 'per_' + period}")
                if value is not None:
                    yield period, what, float(value)

    @property
    def counts_cost(self) -> bool:
        return any(what == "cost" for _, what, _ in self.bounds())

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Limits:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass(frozen=True)
class Cost:
    """What a call costs or may cost: dollars and tokens. `priced`: False when the model's
    price is unknown (its dollars are then not known either)."""

    usd: float = 0.0
    tokens: int = 0
    priced: bool = True

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.usd + other.usd, self.tokens + other.tokens)


ACCOUNT_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:@-")


def check_account(name: Any) -> str:
    """An account's name as given, if it is one: 1 to 128 letters, digits and `._:@-`."""
    if not isinstance(name, str) or not 0 < len(name) <= 128 or not set(name) <= ACCOUNT_CHARS:
        raise ConfigError(
            f"an account is 1 to 128 letters, digits and ._:@- (got {str(name)[:40]!r})"
        )
    return name


def periods_at(now: float) -> dict[Period, str]:
    """The names of the periods `now` (Unix time) falls in, in UTC: the day, the month, and the
    one period that never ends."""
    t = time.gmtime(now)
    return {"day": time.strftime("%Y-%m-%d", t), "month": time.strftime("%Y-%m", t), "total": ""}


@dataclass
class Standing:
    """An account as it stands in its periods now: its limits (None: none set), what it spent
    and what calls in flight hold, by period."""

    account: str
    limits: Limits | None
    spent: dict[Period, Cost] = field(default_factory=dict)
    held: dict[Period, Cost] = field(default_factory=dict)

    def refusal_of_new_runs(self) -> str:
        """Why a new run of the account is refused before it starts ("" if it is not): a
        limit reached, and the limits' `when_over` refuses (with "queue" it starts, and waits
        before its first call)."""
        refused = self.refusal()
        return refused if self.limits is not None and self.limits.when_over == "refuse" else ""

    def refusal(self, call: Cost | None = None) -> str:
        """Why the account has no room for another call now (`call`, its estimate), or "": a
        limit reached by what is spent and held, or a cost limit and a model whose price is
        unknown. (One call more is what the rule lets past a limit: see above.)"""
        if self.limits is None:
            return ""
        if call is not None and not call.priced and self.limits.counts_cost:
            return (
                f"account budget: {self.account} has a cost limit and this model has no known "
                "price, so its calls cannot be counted (give it one with --prices)"
            )
        for period, what, limit in self.limits.bounds():
            held = self.held.get(period, Cost())
            used = self.spent.get(period, Cost()) + held
            value = used.usd if what == "cost" else used.tokens
            if value >= limit:
                flight = bool(held.usd if what == "cost" else held.tokens)
                return f"account budget: {self.account} {said(what, value, limit, period, flight)}"
        return ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "account": self.account,
            "limits": self.limits.to_dict() if self.limits is not None else None,
            "spent": {p: {"usd": c.usd, "tokens": c.tokens} for p, c in self.spent.items()},
            "held": {p: {"usd": c.usd, "tokens": c.tokens} for p, c in self.held.items()},
            "refusal": self.refusal(),
        }


def said(what: str, value: float, limit: float, period: Period, flight: bool) -> str:
    """How a reached limit is told: `acme has spent $20.0100 today, its limit is $20 a day`."""
    per = {"day": " today", "month": " this month", "total": " in all"}[period]
    limit_per = {"day": " a day", "month": " a month", "total": " in all"}[period]
    if what == "cost":
        used, most = f"has spent ${value:.4f}", f"${limit:g}"
    else:
        used, most = f"has used {int(value)} tokens", f"{int(limit)} tokens"
    held = " (with calls in flight)" if flight else ""
    return f"{used}{per}{held}, its limit is {most}{limit_per}"


def estimate(
    messages: Iterable[Message], system: str | None, max_output: int | None, price: Any
) -> Cost:
    """What a call may cost before it is made: its whole request's characters (its tool calls
    and results too: counting only its text let concurrent runs with long tool outputs pass
    an account's limit many times over) over `CHARS_PER_TOKEN` in, the agent's
    `max_output_tokens` (else `DEFAULT_OUTPUT_TOKENS`) out, at the model's `price` (a
    `pricing.Price`; None: no dollars)."""
    chars = len(system or "") + sum(message_chars(m) for m in messages)
    tokens_in = chars // CHARS_PER_TOKEN + 1
    tokens_out = max_output or DEFAULT_OUTPUT_TOKENS
    usd = price.cost(Usage(tokens_in, 0, tokens_out)) if price is not None else 0.0
    return Cost(usd, tokens_in + tokens_out, price is not None)


def cost_of(usage: Usage, price: Any) -> Cost:
    """What a call used, at `price` (a `pricing.Price`, or None)."""
    usd = price.cost(usage) if price is not None else 0.0
    return Cost(usd, usage.total_tokens, price is not None)


class OverBudget(Exception):
    """A call its account has no room for: the run halts with `reason`, the call unmade.
    (The driver's own signal, never seen by a caller: the run's result says why.)"""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Accounts(Protocol):
    """Where accounts' limits and spend are kept: this process (`MemoryAccounts`) or a store."""

    async def reserve(self, account: str, run_id: str, key: str, cost: Cost) -> str:
        """Hold `cost` for the call `key` of `run_id` if the account has room: "" then, else
        why not. A reservation the call holds already (an attempt a crash cut short) is
        counted as spent at its estimate first."""
        ...

    async def settle(self, account: str, run_id: str, key: str, cost: Cost) -> None:
        """The call `key` of `run_id` cost `cost`: its reservation becomes that spend. A call
        that holds none (its account had no limits, or it was not reserved: a summary that
        fitted the context) is added to the spend as it is."""
        ...

    async def release(self, run_id: str) -> None:
        """The run ended: what it still holds (a call whose step was not recorded) counts as
        spent, at its estimate."""
        ...

    async def set_limits(self, account: str, limits: Limits | None) -> None:
        """Set (None: remove) an account's limits; they hold from the next call."""
        ...

    async def standing(self, account: str) -> Standing:
        """The account now: its limits, spend and what is held."""
        ...

    async def accounts(self) -> list[Standing]:
        """Every account with limits or spend, by name."""
        ...

    async def pause(self, seconds: float) -> None:
        """Wait before asking for room again: `seconds`, or less when room may have come."""
        ...


@dataclass
class Held:
    account: str
    cost: Cost
    periods: dict[Period, str]


class MemoryAccounts:
    """The accounts of the runs of one process (a `Runtime` in memory owns one)."""

    def __init__(self) -> None:
        self.limits: dict[str, Limits] = {}
        self.spent: dict[tuple[str, Period, str], Cost] = {}  # (account, period, its name)
        self.held: dict[tuple[str, str], Held] = {}  # by (run id, key)
        self.pausing: list[asyncio.Future[None]] = []  # runs queued for room (`pause`)

    def standing_at(self, account: str, now: float) -> Standing:
        names = periods_at(now)
        found = Standing(account, self.limits.get(account))
        for period, name in names.items():
            found.spent[period] = self.spent.get((account, period, name), Cost())
            found.held[period] = sum(
                (
                    h.cost
                    for h in self.held.values()
                    if h.account == account and h.periods[period] == name
                ),
                Cost(),
            )
        return found

    async def reserve(self, account: str, run_id: str, key: str, cost: Cost) -> str:
        held = self.held.get((run_id, key))
        if held is not None:  # an attempt cut short: its estimate counts as spent
            await self.settle(account, run_id, key, held.cost)
        now = time.time()
        refused = self.standing_at(account, now).refusal(cost)
        if not refused:
            self.held[(run_id, key)] = Held(account, cost, periods_at(now))
        return refused

    async def settle(self, account: str, run_id: str, key: str, cost: Cost) -> None:
        held = self.held.pop((run_id, key), None)
        periods = held.periods if held is not None else periods_at(time.time())
        for period, name in periods.items():
            at = (account, period, name)
            self.spent[at] = self.spent.get(at, Cost()) + cost
        self.wake()

    async def release(self, run_id: str) -> None:
        for account, key in [(h.account, k[1]) for k, h in self.held.items() if k[0] == run_id]:
            await self.settle(account, run_id, key, self.held[(run_id, key)].cost)

    async def set_limits(self, account: str, limits: Limits | None) -> None:
        if limits is None:
            self.limits.pop(account, None)
        else:
            self.limits[account] = limits
        self.wake()

    async def pause(self, seconds: float) -> None:
        """Until the limits change or a call settles (room may have come), at most `seconds`."""
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.pausing.append(woken)
        try:
            await asyncio.wait_for(woken, seconds)
        except TimeoutError:
            pass
        finally:
            self.pausing.remove(woken)

    def wake(self) -> None:
        for woken in self.pausing:
            if not woken.done():
                woken.set_result(None)

    async def standing(self, account: str) -> Standing:
        return self.standing_at(account, time.time())

    async def accounts(self) -> list[Standing]:
        names = (
            set(self.limits)
            | {a for a, _, _ in self.spent}
            | {h.account for h in self.held.values()}
        )
        now = time.time()
        return [self.standing_at(a, now) for a in sorted(names)]
