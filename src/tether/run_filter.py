"""Which runs a list shows, and where its next page starts: one filter and one cursor for the
page's list of a process's runs (in memory) and of a store's (`durable/view.page_runs`).

A page holds the newest runs first (the inbox's: the oldest). Its cursor is the key of the last
run it holds (when the run was created, then its id, so runs created in the same millisecond
keep one order); the next page holds the runs strictly past it. A cursor, not an offset: runs
started while a person reads page one do not shift page two, and a store answers "the 50
before this key" from its index on creation time however deep the page (an offset of 99,950
reads 99,950 rows first).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from .errors import ConfigError

MAX_PAGE = 500
"""The most runs one page holds (the page asks for 50; a refresh of many pages asks more)."""


@dataclass(frozen=True)
class RunFilter:
    """What a run must be to be listed: one of `states` (none given: any), of `agent`, of
    `account`, and `text` found (any case) in its task, id or agent's name."""

    states: frozenset[str] = frozenset()
    agent: str = ""
    text: str = ""
    account: str = ""

    def matches(
        self,
        state: str,
        run_id: str,
        task: str | None,
        agent: str | None,
        account: str | None = None,
    ) -> bool:
        if self.states and state not in self.states:
            return False
        if self.agent and agent != self.agent:
            return False
        if self.account and account != self.account:
            return False
        needle = self.text.strip().lower()
        return not needle or needle in f"{task or ''}\n{run_id}\n{agent or ''}".lower()


@dataclass(frozen=True, order=True)
class Cursor:
    """Where a page ended: its last run's creation time and id. The time is in milliseconds
    on a store (DBOS's `created_at`), in microseconds in memory (`memory_view`); a cursor goes
    back only to the view that gave it."""

    at_ms: int
    run_id: str

    def encode(self) -> str:
        return base64.urlsafe_b64encode(orjson.dumps([self.at_ms, self.run_id])).decode()

    @classmethod
    def decode(cls, text: str) -> Cursor:
        """The cursor a page gave; anything else is a ConfigError that says so."""
        try:
            at_ms, run_id = orjson.loads(base64.urlsafe_b64decode(text.encode()))
        except (ValueError, TypeError, binascii.Error):
            raise ConfigError(f"cursor {text[:40]!r} is not one a page gave") from None
        if (
            not isinstance(at_ms, int)
            or isinstance(at_ms, bool)
            or not 0 <= at_ms < 2**53  # a time a store keeps (past it: a 500 from Postgres)
            or not isinstance(run_id, str)
            or len(run_id) > 1000
        ):
            raise ConfigError(f"cursor {text[:40]!r} is not one a page gave")
        return cls(at_ms, run_id)


@dataclass
class Page:
    """One page of a list: its rows (newest first) and the cursor of the next (None: no more
    runs match). `scanned`: how many runs were read to fill it (a filter that matches few
    runs reads many)."""

    rows: list[dict[str, Any]]
    next: Cursor | None
    scanned: int = 0
    counts: dict[str, int] = field(default_factory=dict)


def check_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_PAGE:
        raise ConfigError(f"limit {limit}: a page holds 1 to {MAX_PAGE} runs")
    return limit


def page_of(
    runs: Iterable[tuple[Cursor, dict[str, Any]]],
    flt: RunFilter,
    after: Cursor | None,
    limit: int,
    oldest_first: bool = False,
) -> Page:
    """A page of runs held in memory: each with its key and its summary (`status`, `id`,
    `task`, `agent`), newest first (or oldest), those past `after` only."""
    ordered = sorted(runs, key=lambda kr: kr[0], reverse=not oldest_first)

    def past(key: Cursor, mark: Cursor) -> bool:
        return key > mark if oldest_first else key < mark

    rows: list[dict[str, Any]] = []
    scanned = 0
    for key, s in ordered:
        if after is not None and not past(key, after):
            continue
        scanned += 1
        if flt.matches(s["status"], s["id"], s.get("task"), s.get("agent"), s.get("account")):
            rows.append(s)
            if len(rows) == limit:
                more = past(ordered[-1][0], key)  # runs past this one are left
                return Page(rows, key if more else None, scanned)
    return Page(rows, None, scanned)
