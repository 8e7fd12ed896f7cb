"""The dashboard's figures: runs started and ended over a recent window, tokens and cost by
period, why runs failed or halted, and model-call latency percentiles; folded here from plain
facts (when runs were created, how they ended, how long model calls took), whether those came
from a process's events (in memory) or from a store (`durable/activity.py`). Pure: the window
and "now" are given, so a test states the whole picture.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

WINDOWS = {"hour": (60, 60), "day": (24, 3600)}
"""A window's periods: how many, and how long each is (seconds)."""

OUTCOMES = ("done", "halted", "failed", "cancelled")


@dataclass(frozen=True)
class Ended:
    """A run that ended: when, how, why (a halt's limit, a failure's first line), and what it
    used."""

    at: float
    outcome: str
    reason: str
    tokens: int
    cost_usd: float

    @classmethod
    def of(cls, at: float, outcome: str, reason: str, summary: dict[str, Any]) -> Ended:
        """From a run's summary or listing (its `usage` and `cost_usd`)."""
        usage = summary.get("usage") or {}
        tokens = int(usage.get("input_tokens", 0)) + int(usage.get("output_tokens", 0))
        return cls(at, outcome, reason, tokens, float(summary.get("cost_usd") or 0.0))


def window_of(name: str) -> tuple[int, int]:
    if name not in WINDOWS:
        raise ConfigError(f"window {name!r}: use {' or '.join(WINDOWS)}")
    return WINDOWS[name]


def percentile(sorted_values: list[float], p: float) -> float:
    """The p-th percentile (nearest rank) of values in order."""
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def figures(
    window: str,
    now: float,
    started: list[float],
    ended: list[Ended],
    model_seconds: list[float],
) -> dict[str, Any]:
    """Everything the dashboard draws, for the window that ends at `now`: per period (oldest
    first) the runs started, the runs ended by outcome, tokens and cost of the runs that ended;
    the reasons of failures and halts, most frequent first; the model calls' latency."""
    periods, length = window_of(window)
    start = now - periods * length

    def period(ts: float) -> int | None:
        i = math.floor((ts - start) / length)
        return i if 0 <= i < periods else None

    per_start = [0] * periods
    for ts in started:
        if (i := period(ts)) is not None:
            per_start[i] += 1
    per_end = {o: [0] * periods for o in OUTCOMES}
    tokens, cost = [0] * periods, [0.0] * periods
    reasons: Counter[tuple[str, str]] = Counter()
    for e in ended:
        if (i := period(e.at)) is None:
            continue
        if e.outcome in per_end:
            per_end[e.outcome][i] += 1
        tokens[i] += e.tokens
        cost[i] += e.cost_usd
        if e.outcome in ("failed", "halted"):
            reasons[(e.outcome, e.reason or "(none given)")] += 1
    took = sorted(s * 1000 for s in model_seconds)
    return {
        "window": window,
        "start": start,
        "period_s": length,
        "started": per_start,
        "ended": per_end,
        "tokens": tokens,
        "cost_usd": [round(c, 6) for c in cost],
        "reasons": [
            {"outcome": o, "reason": r, "runs": n} for (o, r), n in reasons.most_common(20)
        ],
        "model_ms": {
            "calls": len(took),
            **{f"p{p}": round(percentile(took, p), 1) if took else None for p in (50, 90, 99)},
        },
    }
