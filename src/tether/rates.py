"""Rate limits per provider endpoint and key, held across every process of a store.

    tether limits rate --provider openai-chat --requests 500 --tokens 200000   # a minute
    tether worker ...   # eight of them: together they send at most 500 requests a minute

A provider limits requests and tokens a minute per key (per organisation), not per process:
eight workers that each count their own calls send eight times what the key allows, and a 429
seen by one of them teaches the other seven nothing. Here an endpoint (`admission.endpoint_key`:
the provider, its URL and a hash of its key, never the key) may have a `Rate`: at most
`requests` attempts and `tokens` tokens in any `per` seconds. `Rates` admits every HTTP attempt
to it (a first try and each retry alike: the provider counts both) and records it where every
process of the runs sees it: this process's memory (`MemoryRates`) or the store
(`durable/rates.py`). A reply that says when to come back (`Retry-After` on a 429 or a 503)
pauses its endpoint for all of them until then, with or without a rate.

The rule (`wait_for`) is a sliding window: an attempt goes when fewer than `requests` attempts
were admitted in the last `per` + `SLACK` seconds and their tokens and its own fit in `tokens`;
else it waits until the oldest that must leave has left. `SLACK` covers the time between
admission and the request reaching the server (a busy event loop, a connection to open): two
attempts admitted exactly `per` apart may arrive less than `per` apart, and the server counts
arrivals. An attempt's tokens are estimated before it goes, as its body's bytes / 4 plus its
output limit (as OpenAI's own limiter counts a request); one larger than the whole token limit
goes alone, when the window is empty, rather than never.

A run's attempts find the gate through `GATE`, a context variable the driver sets for the run
(`agent.execute`) and the HTTP client reads before each attempt: a model client of one's own
needs no new parameter, a summary or a tool's sampling call is gated like the run's own calls,
and each model of a `FallbackModel` by its own endpoint.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from .errors import ConfigError
from .events import Emitter

SLACK = 0.5
"""Seconds an admitted attempt stays counted past its window (see the module docstring)."""
LONGEST_PAUSE = 600.0
"""The longest a server's `Retry-After` pauses its endpoint (a call that would wait longer
fails at once, saying when the server takes requests again)."""
LONGEST_NAP = 5.0
"""The longest a waiting attempt sleeps before it asks again (a rate may be raised meanwhile)."""


@dataclass(frozen=True, slots=True)
class Rate:
    """At most `requests` attempts and `tokens` tokens (None: no limit of that kind) in any
    `per` seconds (a minute unless said)."""

    requests: int | None = None
    tokens: int | None = None
    per: float = 60.0

    def __post_init__(self) -> None:
        for name in ("requests", "tokens"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ConfigError(f"a rate's {name} must be a whole number of 1 or more")
        if isinstance(self.per, bool) or not (math.isfinite(self.per) and self.per > 0):
            raise ConfigError("a rate's period (per) must be a number of seconds above 0")
        if self.requests is None and self.tokens is None:
            raise ConfigError("a rate needs requests, tokens or both")

    def said(self) -> str:
        """`at most 500 requests and 200000 tokens a minute`."""
        pairs = ((self.requests, "requests"), (self.tokens, "tokens"))
        kept = [f"{n} {what if n != 1 else what[:-1]}" for n, what in pairs if n is not None]
        window = "a minute" if self.per == 60 else f"in {self.per:g} s"
        return f"at most {' and '.join(kept)} {window}"

    def to_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "tokens": self.tokens, "per": self.per}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Rate:
        return cls(d.get("requests"), d.get("tokens"), float(d.get("per", 60.0)))


Admitted = tuple[float, int]
"""An attempt admitted: when (seconds since the epoch) and its estimated tokens."""


def wait_for(
    rate: Rate | None, paused_until: float, admitted: Sequence[Admitted], now: float, tokens: int
) -> float:
    """Seconds until an attempt of `tokens` may go (0: now), given the endpoint's rate, the
    pause a server asked for and the attempts admitted before (oldest first)."""
    if paused_until > now:
        return paused_until - now
    if rate is None:
        return 0.0
    span = rate.per + SLACK
    recent = [(at, t) for at, t in admitted if at > now - span]
    wait = 0.0
    if rate.requests is not None and len(recent) >= rate.requests:
        wait = recent[len(recent) - rate.requests][0] + span - now  # that one must leave first
    if rate.tokens is not None:
        used = sum(t for _, t in recent)
        for at, t in recent:  # the oldest leave first: wait until enough of them have
            if used + tokens <= rate.tokens:
                break
            used -= t
            wait = max(wait, at + span - now)
    return max(wait, 0.0)


def attempt_tokens(body: bytes, max_output_tokens: int | None) -> int:
    """An attempt's tokens before it goes: its body's bytes / 4 and the reply it allows."""
    return len(body) // 4 + (max_output_tokens or 0)


@dataclass(slots=True)
class RateStanding:
    """An endpoint now: its rate, the attempts (and their tokens) admitted in its last window,
    and how long a server's pause has left."""

    endpoint: str
    rate: Rate | None
    requests: int = 0
    tokens: int = 0
    paused_for: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "rate": self.rate.to_dict() if self.rate is not None else None,
            "recent": {"requests": self.requests, "tokens": self.tokens},
            "paused_for": round(self.paused_for, 3),
        }


class Rates(Protocol):
    """Where endpoints' rates, their recent attempts and servers' pauses are kept."""

    def free(self, endpoint: str) -> bool:
        """Whether an attempt to `endpoint` may go without asking `try_admit`: no rate and no
        pause is known for it here now (False when unsure: then `try_admit` decides)."""
        ...

    async def try_admit(self, endpoint: str, tokens: int) -> tuple[float, str]:
        """Admit and record an attempt now, or say how long to wait and why."""
        ...

    async def pause(self, endpoint: str, seconds: float) -> None:
        """A server asked for no attempt to `endpoint` for `seconds`."""
        ...

    async def set_rate(self, endpoint: str, rate: Rate | None) -> None: ...

    async def rates(self) -> list[RateStanding]: ...


def why_waiting(rate: Rate | None, paused_until: float, now: float) -> str:
    if paused_until > now:
        when = time.strftime("%H:%M:%S UTC", time.gmtime(paused_until))
        return f"the server asked for no requests until {when}"
    return f"rate limit: {rate.said() if rate is not None else 'none'}"


@dataclass
class Endpoint:
    """One endpoint in memory: its rate, its admitted attempts (oldest first), its pause."""

    rate: Rate | None = None
    admitted: deque[Admitted] = field(default_factory=deque)
    paused_until: float = 0.0

    def forget_old(self, now: float) -> None:
        span = (self.rate.per if self.rate is not None else 0.0) + SLACK
        while self.admitted and self.admitted[0][0] <= now - span:
            self.admitted.popleft()


class MemoryRates:
    """`Rates` for the runs of one process (a `Runtime` in memory)."""

    def __init__(self) -> None:
        self.endpoints: dict[str, Endpoint] = {}

    def free(self, endpoint: str) -> bool:
        return endpoint not in self.endpoints

    async def try_admit(self, endpoint: str, tokens: int) -> tuple[float, str]:
        found = self.endpoints.get(endpoint)
        if found is None:
            return 0.0, ""
        now = time.time()
        found.forget_old(now)
        wait = wait_for(found.rate, found.paused_until, found.admitted, now, tokens)
        if wait > 0:
            return wait, why_waiting(found.rate, found.paused_until, now)
        if found.rate is not None:
            found.admitted.append((now, tokens))
        return 0.0, ""

    async def pause(self, endpoint: str, seconds: float) -> None:
        found = self.endpoints.setdefault(endpoint, Endpoint())
        found.paused_until = max(found.paused_until, time.time() + seconds)

    async def set_rate(self, endpoint: str, rate: Rate | None) -> None:
        if rate is None:
            self.endpoints.pop(endpoint, None)
        else:
            self.endpoints.setdefault(endpoint, Endpoint()).rate = rate

    async def rates(self) -> list[RateStanding]:
        now, found = time.time(), []
        for name, e in sorted(self.endpoints.items()):
            e.forget_old(now)
            tokens = sum(t for _, t in e.admitted)
            paused = max(0.0, e.paused_until - now)
            found.append(RateStanding(name, e.rate, len(e.admitted), tokens, paused))
        return found


@dataclass(frozen=True, slots=True)
class Gate:
    """A run's way through its endpoints' rates: where they are kept, and its events."""

    rates: Rates
    emitter: Emitter | None = None

    async def through(self, endpoint: str, tokens: int) -> None:
        """Return when an attempt may go to `endpoint` (recorded as gone); a wait shows as
        `queued` (what: rate, and why) then `admitted`. An endpoint with no rate or pause
        is passed by `HTTPClient.post` without this coroutine (`Rates.free`)."""
        waited = False
        while True:
            wait, why = await self.rates.try_admit(endpoint, tokens)
            if wait <= 0:
                break
            if not waited and self.emitter is not None:
                self.emitter.queued(what="rate", endpoint=endpoint, reason=why)
            waited = True
            await asyncio.sleep(min(wait, LONGEST_NAP))
        if waited and self.emitter is not None:
            self.emitter.admitted(what="rate", endpoint=endpoint)

    async def paused(self, endpoint: str, seconds: float) -> None:
        """A server's `Retry-After`, at most `LONGEST_PAUSE`: one server's word paused its
        endpoint for every process of the store for as long as it said (a year, a decade)."""
        await self.rates.pause(endpoint, min(seconds, LONGEST_PAUSE))


GATE: ContextVar[Gate | None] = ContextVar("tether_gate", default=None)
"""The running run's gate (see the module docstring); None outside a run, or with no rates."""


def endpoint_of(model: object) -> str:
    """The endpoint a rate is set for: a model's (`HTTPModel.endpoint`), or one named as
    `Rates.rates` names it."""
    if isinstance(model, str):
        if not model.strip() or len(model) > 1000:
            raise ConfigError("an endpoint is named as `tether limits` lists it, 1 to 1000 chars")
        return model
    found = getattr(model, "endpoint", None)
    if not isinstance(found, str):
        name = getattr(model, "name", type(model).__name__)
        raise ConfigError(f"the model {name} has no HTTP endpoint to limit")
    return found
